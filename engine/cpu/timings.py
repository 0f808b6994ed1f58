"""Word timings of a CPU voice's model run, from the durations its duration predictor chose.

A sentence's phonemes are one string in which espeak (and misaki for Mandarin) separate the text's
words by spaces: the i-th phoneme token speaks the i-th word group (one Latin word, or one jieba word
of Han characters). `plan` carries that correspondence through the cut into model-run pieces and the
phoneme → id mapping, as positions in each run's id sequence; after the run `place` turns them into
sample offsets with the run's samples per id. Where the counts differ (a word espeak reads as two
tokens, or two as one: "for a" is one token, `fɚɹə`), Latin words are aligned to the tokens locally
(`_positions`: a merge or a split takes the words around it, matched by length), so the words before and
after it keep their own tokens; Han groups, and a sentence the local alignment cannot explain, are
spread over the tokens in proportion, so every word still gets a span inside its sentence's speech.
A group of several Han characters is split evenly among them (each is a syllable).

A word's span starts at the whitespace before its token: both voices give the space between two words
ids of its own (Piper: a space and its PAD, ~25–60 ms), and the next word's sound, its first consonant's
closure or onset, begins there. Starting at the first phoneme put Piper's starts 51 ms late on average
against a forced aligner (bench/word_timing.py). Not after a mark: marks stay outside every word (a
comma's pause), and so does the space after one, which is still the pause (it put "how" of "calling,
how" up to 100 ms early).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.cpu.voice_config import VOICE_DEFAULT, VoiceConfig
from engine.languages import HAN_RE

_TOKEN = re.compile(r"\S+")
_MARKS = ".,;:!?…¡¿—–-\"'()[]«»“”"


@dataclass(slots=True)
class TimedUnit:
    """One model run's ids and its words as (word, start, end) positions in id-index space (fractional:
    3.5 is halfway through id 3)."""

    ids: list[int]
    words: list[tuple[str, float, float]] = field(default_factory=list)


# ids_of(piece) → (ids, spans): spans[j] is the [start, end) ids of the piece's character j, None if dropped
IdsOf = Callable[[str], tuple[list[int], list[tuple[int, int] | None]]]


def plan(phonemes: str, groups: list[list[str]], pieces: list[str], ids_of: IdsOf,
         config: VoiceConfig = VOICE_DEFAULT) -> list[TimedUnit]:
    """The runs of one sentence: `pieces` (substrings of `phonemes`, in order) as ids, each with the
    words whose speech starts in it. `config`: the alignment's knobs (`VoiceConfig.align_*`, `clitic_*`)."""
    tokens = [_core(phonemes, m) for m in _TOKEN.finditer(phonemes)]
    tokens = [t for t in tokens if t is not None]
    units: list[TimedUnit] = []
    where: dict[int, tuple[int, int, int]] = {}  # token → (unit, first id, end id)
    at = 0
    for piece in pieces:
        offset = phonemes.find(piece, at)
        if offset < 0:  # not a substring (never, from split_long): timings for it are lost, not wrong
            units.append(TimedUnit(ids_of(piece)[0]))
            continue
        at = offset + len(piece)
        ids, spans = ids_of(piece)
        units.append(TimedUnit(ids))
        for k, (lead, c0, c1) in enumerate(tokens):
            if k in where or not offset <= c0 < at:
                continue
            # from the whitespace before it, where that is in this run (a run cut at the space has it
            # in the previous one: the word then starts at this run's first id)
            inside = [s for s in spans[max(lead, offset) - offset : min(c1, at) - offset] if s is not None]
            if inside:
                where[k] = (len(units) - 1, inside[0][0], inside[-1][1])
    _assign(units, where, [c1 - c0 for _, c0, c1 in tokens], groups, config)
    return units


def _core(phonemes: str, m: re.Match[str]) -> tuple[int, int, int] | None:
    """A token's span without the punctuation around it (a comma's pause is nobody's word), as (lead,
    start, end): `lead` is where the whitespace between it and the previous word begins (`start` where
    a mark is on either side of that whitespace, or there is none)."""
    start, end = m.span()
    text = m.group()
    while start < end and text[start - m.start()] in _MARKS:
        start += 1
    while end > start and text[end - 1 - m.start()] in _MARKS:
        end -= 1
    if end <= start:
        return None
    lead = start
    if start == m.start():
        while lead > 0 and phonemes[lead - 1].isspace():
            lead -= 1
        if lead == 0 or phonemes[lead - 1] in _MARKS:
            lead = start
    return lead, start, end


def _positions(groups: list[list[str]], lengths: list[int], cfg: VoiceConfig) -> list[tuple[float, float]]:
    """Each group's [start, end) in token-index space (fractional). One to one where the counts agree;
    else, for Latin words, the alignment of words to tokens that best matches their lengths (letters
    against phoneme characters, at the sentence's own ratio), allowing a few words in one token or one
    word over a few tokens (`cfg.align_most_per_step`, each such step costing `cfg.align_uneven_step_cost`);
    otherwise in proportion."""
    n, m = len(groups), len(lengths)
    if n == m:
        return [(g, g + 1) for g in range(n)]
    proportional = [(g * m / n, (g + 1) * m / n) for g in range(n)]
    if n * m > cfg.align_max_cells or any(HAN_RE.search(w) for group in groups for w in group):
        return proportional
    letters = [max(1, sum(len(w) for w in group)) for group in groups]
    ratio = sum(lengths) / sum(letters)
    inf = float("inf")
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    step: list[list[tuple[int, int]]] = [[(0, 0)] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for g in range(n + 1):
        for k in range(m + 1):
            if cost[g][k] == inf:
                continue
            for a in range(1, cfg.align_most_per_step + 1):
                for b in range(1, cfg.align_most_per_step + 1):
                    if (a > 1 and b > 1) or g + a > n or k + b > m:
                        continue
                    said = max(1, sum(lengths[k : k + b]))
                    c = cost[g][k] + abs(math.log(said / (ratio * sum(letters[g : g + a]))))
                    c += 0.0 if a == b == 1 else cfg.align_uneven_step_cost
                    if a > 1 and all(count <= cfg.clitic_letters for count in letters[g + 1 : g + a]):
                        c -= cfg.clitic_bonus
                    if c < cost[g + a][k + b]:
                        cost[g + a][k + b], step[g + a][k + b] = c, (a, b)
    if cost[n][m] == inf:
        return proportional
    out: list[tuple[float, float]] = [(0.0, 0.0)] * n
    g, k = n, m
    while g:
        a, b = step[g][k]
        g, k = g - a, k - b
        total = sum(letters[g : g + a])
        at = float(k)
        for i in range(g, g + a):  # words sharing tokens split them by their letters
            width = b * letters[i] / total
            out[i] = (at, at + width)
            at += width
    return out


def _assign(units: list[TimedUnit], where: dict[int, tuple[int, int, int]], lengths: list[int],
            groups: list[list[str]], cfg: VoiceConfig) -> None:  # fmt: skip
    n, m = len(groups), len(lengths)
    if not m or not n:
        return
    for group, (p0, p1) in zip(groups, _positions(groups, lengths, cfg), strict=True):
        k0 = min(int(p0), m - 1)
        if k0 not in where:
            continue
        u, a0, b0 = where[k0]
        x0 = a0 + (p0 - k0) * (b0 - a0)
        k1 = max(k0, math.ceil(p1) - 1)
        if k1 in where and where[k1][0] == u:
            _, a1, b1 = where[k1]
            x1 = a1 + (p1 - k1) * (b1 - a1)
        else:  # the group's end lies in the next run: it ends with this run's last token
            x1 = max(b for k, (uu, _, b) in where.items() if uu == u)
        step = (x1 - x0) / len(group)
        for i, word in enumerate(group):
            units[u].words.append((word, x0 + i * step, x0 + (i + 1) * step))


def place(unit: TimedUnit, samples_per_id: np.ndarray, lead: float = 0.0,
          heard_from: int | None = None) -> list[tuple[str, int, int]]:
    """The unit's words as (word, start, end) sample offsets into its run's audio (never before it);
    `lead`: samples before its first id (Kokoro's padding token, less how far its audio runs ahead).
    `heard_from`: where the run's audio first sounds; the first word starts there if its ids start later
    (Kokoro begins an utterance inside its padding token's frames, 10–115 ms before its first id)."""
    d = np.asarray(samples_per_id, dtype=np.float64)
    if d.size == 0:
        return []
    cum = lead + np.concatenate(([0.0], np.cumsum(d)))

    def at(x: float) -> int:
        k = min(max(int(x), 0), d.size - 1)
        return max(0, round(cum[k] + (x - k) * d[k]))

    out = [(word, at(x0), at(x1)) for word, x0, x1 in unit.words]
    if out and heard_from is not None and heard_from < out[0][1]:
        out[0] = (out[0][0], heard_from, max(heard_from, out[0][2]))
    return out
