"""Text handling the CPU voices need: bounded pieces, sentences, Han/Latin runs (a segment's language:
engine/languages.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from engine.cpu.voice_config import VOICE_DEFAULT
from engine.languages import HAN, HAN_RE

_RUNS = re.compile(f"([{HAN}][{HAN}\\s，。！？、；：“”‘’（）《》…—·0-9０-９%％]*)|([^{HAN}]+)")
# A sentence ends at . ! ? … (ASCII ones only before a space or the end, so "3.14" stays whole) or
# at the Han marks, which need no space after them. The lookbehinds and possessive runs make a match
# start only at the first mark of a run and never backtrack into it: `.+?(?:[.!?…]+…)` took 0.5 s for
# 5000 "!" and a letter (quadratic), a stall a client could make as long as it liked.
_SENTENCE_END = re.compile(r"(?<![.!?…])[.!?…]++[\"')\]”’]*+(?=\s|$)|(?<![。！？])[。！？]++[”’」』）]*+")
# Where an over-long sentence may be cut: after a clause mark (ASCII ones only before a space, so
# "1,000" stays whole), else at a space.
_CLAUSE_END = re.compile(r"[,;:]++(?=\s)|[，、；：]++")
_SPACE = re.compile(r"\s+")
# A stream's first piece may end after a Han clause mark (and the closers after it): see `first_clause_end`.
_HAN_CLAUSE_END = re.compile(r"[，、；：]++[”’」』）)]*+")
_LATIN_WORD = re.compile(r"[A-Za-z0-9\u00c0-\u024f]+")
# Not a knob but the definition of the cost unit (Latin letters; a Han character, a syllable, is spoken
# about as long as three): every bound stated in it (CpuPolicyConfig's piece costs, the ramp) would change
# its meaning with it. Tune those bounds, not the unit.
_HAN_COST = 3


def strip_han(text: str) -> str:
    return HAN_RE.sub(" ", text)


def han_latin_runs(text: str) -> list[tuple[bool, str]]:
    """Split mixed text into (is_han, run) pieces, in order, dropping nothing but empty runs."""
    out: list[tuple[bool, str]] = []
    for han, other in _RUNS.findall(text):
        if han:
            out.append((True, han))
        elif other:
            out.append((False, other))
    return out


def sentences(text: str) -> list[str]:
    """Cut a segment into sentences (the unit of one model run); whitespace-only pieces dropped."""
    return list(_sentences(text))


def _sentences(text: str) -> Iterator[str]:
    start = 0
    for m in _SENTENCE_END.finditer(text):
        if sentence := text[start : m.end()].strip():
            yield sentence
        start = m.end()
    if tail := text[start:].strip():
        yield tail


def split_long(phonemes: str, limit: int) -> list[str]:
    """Cut a phoneme string longer than `limit` symbols, preferring clause marks, then spaces."""
    out: list[str] = []
    rest = phonemes.strip()
    start, n = 0, len(rest)
    while n - start > limit:  # by index: slicing off the rest at every cut would be quadratic
        window = rest[start : start + limit]
        cut = max(window.rfind(m) for m in ",;:.!?")
        if cut < limit // 3:
            cut = window.rfind(" ")
        if cut < limit // 3:
            cut = limit - 1
        if piece := window[: cut + 1].strip():
            out.append(piece)
        start += cut + 1
        while start < n and rest[start] == " ":
            start += 1
    if tail := rest[start:].strip():
        out.append(tail)
    return out


def cost(text: str) -> int:
    """Length in Latin-letter equivalents (a Han character counts `_HAN_COST`): what bounds a piece."""
    return len(text) + (_HAN_COST - 1) * len(HAN_RE.findall(text))


def pieces(text: str, limit: int, *, first: bool = False,
           min_syllables: int = VOICE_DEFAULT.first_clause_syllables) -> Iterator[str]:
    """Cut one segment into pieces of at most `limit` `cost`, in order, losing nothing but whitespace.

    A piece is the work of one synthesis job, so a long segment cannot hold a worker for minutes. Whole
    sentences are packed together while they fit (the voices run sentence by sentence anyway, so their
    audio is the same as the whole segment's); a longer sentence is cut after a clause mark, else at a
    space, else (Han without spaces) between two jieba words, else anywhere. Lazy and linear: the
    caller takes pieces as its look-ahead needs them.

    `first`: the segment opens a stream, so its first piece is all its listener waits for. A voice
    makes no audio before a whole model run, so that piece ends at its first Han clause
    (`first_clause_end`, from `min_syllables`): "好的，" runs alone and "我来帮您安排。" follows as the
    next piece.
    """
    head = first_clause_end(text, limit, min_syllables) if first else 0
    if head:
        yield text[:head].strip()
        text = text[head:]
    yield from _packed(text, limit)


def first_clause_end(text: str, limit: int,
                     min_syllables: int = VOICE_DEFAULT.first_clause_syllables) -> int:
    """Where a stream's first piece may end early: after the first Han clause mark of `text`'s first
    sentence, when the clause has at least `min_syllables` syllables (`VoiceConfig`), costs at most `limit`
    and its sentence goes on after it; else 0. Only Han marks: English keeps whole sentences (Piper's
    first audio is quick anyway). Looks at no more than `limit` characters (a piece's bound)."""
    window = text[:limit]
    clause = _HAN_CLAUSE_END.search(window)
    if clause is None:
        return 0
    end = clause.end()
    sentence_end = _SENTENCE_END.search(window)
    if sentence_end is not None and sentence_end.start() < clause.start():
        return 0  # the first sentence has no clause mark: it is short enough to go whole
    head, rest = text[:end], text[end : end + limit]
    syllables = len(HAN_RE.findall(head)) + len(_LATIN_WORD.findall(head))
    if syllables < min_syllables or cost(head) > limit:
        return 0
    # Something speakable must follow in the same sentence: "好的，。" is one clause, not two.
    after = _SENTENCE_END.search(rest)
    tail = rest[: after.start()] if after is not None else rest
    if not (HAN_RE.search(tail) or _LATIN_WORD.search(tail)):
        return 0
    return end


def _packed(text: str, limit: int) -> Iterator[str]:
    batch: list[str] = []
    size = 0
    for part in _parts(text, limit):
        c = cost(part)
        if batch and size + 1 + c > limit:
            yield " ".join(batch)
            batch, size = [], 0
        size += c + (1 if batch else 0)
        batch.append(part)
    if batch:
        yield " ".join(batch)


def _parts(text: str, limit: int) -> Iterator[str]:
    for sentence in _sentences(text):
        if len(sentence) <= limit // _HAN_COST or cost(sentence) <= limit:
            yield sentence
        else:
            yield from _cut_sentence(sentence, limit)


def _cut_sentence(sentence: str, limit: int) -> Iterator[str]:
    """Fragments of at most `limit` cost, each as long as a good cut allows."""
    start, n = 0, len(sentence)
    while start < n:
        while start < n and sentence[start].isspace():  # a cut at a space leaves it in front
            start += 1
        end = _reach(sentence, start, limit)
        if end >= n:
            if tail := sentence[start:].strip():
                yield tail
            return
        window = sentence[start:end]
        cut = _best_cut(window)
        if fragment := window[:cut].strip():
            yield fragment
        start += cut


def _reach(text: str, start: int, limit: int) -> int:
    """The furthest end such that `text[start:end]` costs at most `limit` (and at least one character)."""
    end = min(len(text), start + limit)
    if not HAN_RE.search(text, start, end):
        return end
    budget = limit
    i = start
    while i < len(text):
        budget -= _HAN_COST if HAN_RE.match(text, i) else 1
        if budget < 0:
            break
        i += 1
    return max(i, start + 1)


def _best_cut(window: str) -> int:
    """Where to end a fragment of `window` (which is followed by more text): after its last clause
    mark, else at its last space, else between jieba words, else at its end — never in its first
    third, so fragments stay long."""
    floor = len(window) // 3
    marks = [m.end() for m in _CLAUSE_END.finditer(window, floor)]
    if marks:
        return marks[-1]
    spaces = [m.start() for m in _SPACE.finditer(window, floor)]
    if spaces and spaces[-1] > 0:
        return spaces[-1]
    if HAN_RE.search(window):
        bounds = [b for b in _word_bounds(window) if floor <= b < len(window)]
        if bounds:
            return bounds[-1]  # not the window's end: its last word may run on past it
    return len(window)


def _word_bounds(text: str) -> list[int]:
    """Offsets between jieba's words of `text` (Mandarin has no spaces between words)."""
    try:
        import jieba  # with the Kokoro voices, which need it for their Mandarin G2P
    except ImportError:
        return []
    bounds, at = [], 0
    for word in jieba.cut(text, HMM=False):
        at += len(word)
        bounds.append(at)
    return bounds


def estimate_seconds(text: str) -> float:
    """Rough spoken length, for scheduling only: about 4.5 Han syllables or 3 English words a second."""
    han = len(HAN_RE.findall(text))
    words = len(strip_han(text).split())
    return han / 4.5 + words / 3.0
