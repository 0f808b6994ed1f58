"""An utterance's words on its audio clock: the engine's word timings matched to the committed text, or
an estimate from the segments' marks where the engine has none; and the text a listener heard.

The engine times the words of the text it was given — the committed text respelled by the session's
lexicon ("voxgate" → "vocks gate") and normalised ("$5" → "five dollars") — so its words are matched
back to the words the client sent, in order. Each committed word is expected as the words it is said
as: itself, or its share of the respelling that replaced it (segmentation/lexicon.py `respellings_in`).
An engine word continues the committed word it is part of, else pairs with the next committed word said
that way (skipping at most `_LOOKAHEAD`: those went unspoken), else is taken by the next committed word
(one the normaliser rewrote takes the span of all the engine words spoken in its place). Every committed
word gets a span exactly once, with its characters in the utterance's text (`char_start`, `char_end`),
so `audio.words` covers the text the client sent, in its own words, whatever the engine was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.languages import HAN_RE as _HAN
from engine.words import key, word_spans, words
from gateway.protocol import WordTime
from segmentation.lexicon import Pronunciations

_LOOKAHEAD = 4  # committed words an engine word may skip to find its match (the ones between went unspoken)
# Written forms a rate estimate uses before an utterance has timed any segment: ~15 Latin characters
# and ~4.5 Han syllables a second (what engine/cpu/text.py estimate_seconds assumes).
_MS_PER_CHAR = 66.0
_MS_PER_HAN = 220.0


@dataclass(slots=True)
class _Word:
    text: str
    start_char: int  # where it starts and ends in its segment's text
    end_char: int
    said: tuple[str, ...]  # the keys of the engine words it is expected as (a respelled word: its share)
    start_ms: float | None = None
    end_ms: float | None = None


@dataclass(slots=True)
class _Segment:
    text: str
    words: list[_Word]
    offset: int = 0  # where its text starts in the utterance's
    next: int = 0  # the first word not yet given a span
    start_ms: float | None = None  # its audio.mark
    timed: bool = False  # the engine timed some of its words
    estimated: bool = False  # its spans are an estimate
    # The word the last engine word went to and how many of its `said` keys came (`open`: later engine
    # words that pair with no committed word belong to it: a rewritten word's, or a respelling's rest).
    current: int | None = None
    heard_keys: int = 0
    open: bool = False


def _segment_words(text: str, pronunciations: Pronunciations | None) -> list[_Word]:
    """The words of a committed segment, each with the keys it is expected to be spoken as. A respelling
    that replaced several words ("New York" → "noo york") shares its words among them in order."""
    spans = word_spans(text)
    said: list[tuple[str, ...]] = [(key(text[a:b]),) for a, b in spans]
    for start, end, say in pronunciations.respellings_in(text) if pronunciations else ():
        inside = [i for i, (a, _) in enumerate(spans) if start <= a < end]
        spoken = [key(w) for w in words(say)]
        for n, i in enumerate(inside):
            share = spoken[n * len(spoken) // len(inside) : (n + 1) * len(spoken) // len(inside)]
            said[i] = tuple(share)
    return [_Word(text[a:b], a, b, k) for (a, b), k in zip(spans, said, strict=True)]


@dataclass(slots=True)
class UtteranceWords:
    """Kept per utterance by its pump; read by a cancel (`heard`)."""

    segments: dict[int, _Segment] = field(default_factory=dict)
    sent_ms: float = 0.0  # audio sent so far, on the utterance's clock
    last_ms: float = 0.0  # the latest span end given (spans stay monotone)
    _open: list[int] = field(default_factory=list)  # segments whose words may still lack a span

    def committed(self, index: int, text: str, start: int = 0, pronunciations: Pronunciations | None = None) -> None:
        """Segment `index` (`text`, at `start` in the utterance's text) is committed: its words are owed a
        span even if its audio never comes (a model that ended it early, text the voice could not read),
        given as points when a later segment or the end closes it. `pronunciations`: the lexicon that
        respells it for the engine, whose words are matched back to these."""
        self._segment(index, text, start, pronunciations)

    def _segment(self, index: int, text: str, start: int = 0, pronunciations: Pronunciations | None = None,
                 ) -> _Segment:  # fmt: skip
        seg = self.segments.get(index)
        if seg is None:
            seg = _Segment(text, _segment_words(text, pronunciations), start)
            self.segments[index] = seg
            self._open.append(index)
        return seg

    def timed(self, index: int, text: str, spoken: list[tuple[str, float, float]],
              estimated: bool = False) -> list[WordTime]:
        """The engine's words (word, start_ms, end_ms) of committed segment `index` (whose text is
        `text`), in order: the committed words they give spans to, to send. Earlier segments' words
        still without one are closed first (their audio is over). `estimated`: the engine's own guess."""
        out = self.close_before(index)
        seg = self._segment(index, text)
        seg.timed = True
        seg.estimated = seg.estimated or estimated
        sent: dict[int, WordTime] = {}  # the words given a span by this call: a later engine word extends them
        for word, start, end in spoken:
            start, end = max(start, self.last_ms), max(end, start, self.last_ms)
            k = key(word)
            cur = seg.current
            rest = seg.words[cur].said[seg.heard_keys :] if cur is not None else ()
            if cur is not None and rest[:1] == (k,):
                self._extend(index, seg, cur, end, sent)  # the respelling's next word
                seg.heard_keys += 1
                seg.open = seg.heard_keys < len(seg.words[cur].said)  # all said: the next word is another's
                continue
            match = next((j for j in range(seg.next, min(seg.next + _LOOKAHEAD, len(seg.words)))
                          if seg.words[j].said[:1] == (k,)), None)  # fmt: skip
            if match is not None:
                for skipped in seg.words[seg.next : match]:  # unspoken as written: a point where it would be
                    out.append(self._give(index, seg, skipped, start, start))
                sent[match] = self._give(index, seg, seg.words[match], start, end)
                out.append(sent[match])
                seg.next, seg.current, seg.heard_keys = match + 1, match, 1
                seg.open = len(seg.words[match].said) > 1
            elif cur is not None and seg.open:  # "five" then "dollars" for "$5": its span grows (sent once)
                self._extend(index, seg, cur, end, sent)
            elif seg.next < len(seg.words):
                taken = seg.next
                sent[taken] = self._give(index, seg, seg.words[taken], start, end)
                out.append(sent[taken])
                seg.next, seg.current, seg.heard_keys, seg.open = taken + 1, taken, 1, True
        return out

    def _extend(self, index: int, seg: _Segment, j: int, end: float, sent: dict[int, WordTime]) -> None:
        """Word `j` of `seg` goes on to `end`: in what this call sends, or (sent before) for `heard` only."""
        w = seg.words[j]
        w.end_ms = max(w.end_ms or end, end)
        self.last_ms = max(self.last_ms, end)
        if j in sent:
            sent[j].end_ms = round(w.end_ms)

    def marked(self, index: int, text: str, start_ms: float) -> list[WordTime]:
        """Segment `index`'s audio begins at `start_ms`. When the engine timed none of its words, they are
        estimated (spread over the length the utterance's speaking rate so far predicts) and returned."""
        out = self.close_before(index)
        seg = self._segment(index, text)
        seg.start_ms = start_ms
        if seg.timed:
            return out
        seg.estimated = True
        ms_per_char = self._rate()
        at = max(start_ms, self.last_ms)
        previous_end = 0
        for w in seg.words[seg.next :]:
            written = text[previous_end : w.end_char]
            length = _length_ms(written.strip(), ms_per_char)
            out.append(self._give(index, seg, w, at, at + length))
            at += length
            previous_end = w.end_char
        seg.next = len(seg.words)
        return out

    def close_before(self, index: int | None) -> list[WordTime]:
        """Words of segments before `index` (all, for None) that got no span: a point at the last span's
        end (text the voice did not read, Han text to the English voice)."""
        out: list[WordTime] = []
        for i in [i for i in self._open if index is None or i < index]:  # a few: the segments still playing
            seg = self.segments[i]
            for w in seg.words[seg.next :]:
                out.append(self._give(i, seg, w, self.last_ms, self.last_ms))
            seg.next = len(seg.words)
            self._open.remove(i)
        return out

    @property
    def estimated(self) -> bool:
        return any(seg.estimated for seg in self.segments.values())

    def heard(self, played_ms: float, texts: list[str]) -> tuple[str, bool]:
        """(the text heard after `played_ms` of audio, whether it rests on estimated places): the
        committed text (`texts`, each segment's) up to the end of the last word at least half played,
        with the punctuation right after it. Words without a span yet (audio not reached) are unheard.
        An estimated segment's words are spread anew over the audio it really got (its mark to the next
        one's, or to what was sent), which is known by now."""
        cut: tuple[int, int] | None = None  # (segment, end char)
        estimated = False
        order = sorted(self.segments.items())
        for n, (i, seg) in enumerate(order):
            if i >= len(texts):
                break
            spans = [(w.start_ms, w.end_ms) for w in seg.words]
            if seg.estimated and seg.start_ms is not None:
                end = next((s.start_ms for _, s in order[n + 1 :] if s.start_ms is not None), self.sent_ms)
                spans = _spread(seg, seg.start_ms, max(end, seg.start_ms))
            estimated = estimated or seg.estimated
            for w, (start, stop) in zip(seg.words, spans, strict=True):
                if start is None or stop is None or (start + stop) / 2 > played_ms:
                    return _cut(texts, cut), estimated
                cut = (i, w.end_char)
        return _cut(texts, cut), estimated

    # ---- helpers ----

    def _give(self, index: int, seg: _Segment, w: _Word, start: float, end: float) -> WordTime:
        w.start_ms, w.end_ms = start, end
        self.last_ms = max(self.last_ms, end)
        return WordTime(w.text, round(start), round(end), index, seg.offset + w.start_char, seg.offset + w.end_char)

    def _rate(self) -> float | None:
        """ms of audio per written character over the segments whose audio is over (None: none yet)."""
        starts = sorted((i, s.start_ms) for i, s in self.segments.items() if s.start_ms is not None)
        chars = ms = 0.0
        for (i, a), (_, b) in zip(starts, [*starts[1:], (-1, self.sent_ms)], strict=True):
            if b > a:
                chars += len(self.segments[i].text.strip())
                ms += b - a
        return ms / chars if chars >= 20 else None


def _spread(seg: _Segment, start: float, end: float) -> list[tuple[float | None, float | None]]:
    """The segment's words over [start, end), each as long as its written length."""
    total = max(1, len(seg.text.rstrip()))
    out: list[tuple[float | None, float | None]] = []
    previous = 0
    for w in seg.words:
        a = start + (end - start) * previous / total
        b = start + (end - start) * w.end_char / total
        out.append((a, b))
        previous = w.end_char
    return out


def _length_ms(written: str, ms_per_char: float | None) -> float:
    if ms_per_char is not None:
        return len(written) * ms_per_char
    han = len(_HAN.findall(written))
    return han * _MS_PER_HAN + (len(written) - han) * _MS_PER_CHAR


def _cut(texts: list[str], cut: tuple[int, int] | None) -> str:
    if cut is None:
        return ""
    seg, end = cut
    text = texts[seg]
    while end < len(text) and not text[end].isspace() and not text[end].isalnum():
        end += 1  # the comma or full stop that closes the word
    return "".join(texts[:seg]) + text[:end]
