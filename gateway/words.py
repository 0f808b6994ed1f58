"""An utterance's words on its audio clock: the engine's word timings matched to the committed text, or
an estimate from the segments' marks where the engine has none; and the text a listener heard.

The engine times the words of the text it was given — the committed text after normalisation ("$5" →
"five dollars") — so its words are matched back to the committed words in order: equal words pair up,
and a committed word the normaliser rewrote takes the span of the engine words spoken in its place.
Every committed word gets a span exactly once, so `audio.words` covers the text the client sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.languages import HAN_RE as _HAN
from engine.words import key, word_spans
from gateway.protocol import WordTime

_LOOKAHEAD = 4  # committed words an engine word may skip to find its match (the ones between went unspoken)
# Written forms a rate estimate uses before an utterance has timed any segment: ~15 Latin characters
# and ~4.5 Han syllables a second (what engine/cpu/text.py estimate_seconds assumes).
_MS_PER_CHAR = 66.0
_MS_PER_HAN = 220.0


@dataclass(slots=True)
class _Word:
    text: str
    end_char: int  # where it ends in its segment's text
    start_ms: float | None = None
    end_ms: float | None = None


@dataclass(slots=True)
class _Segment:
    text: str
    words: list[_Word]
    next: int = 0  # the first word not yet given a span
    start_ms: float | None = None  # its audio.mark
    timed: bool = False  # the engine timed some of its words
    estimated: bool = False  # its spans are an estimate


@dataclass(slots=True)
class UtteranceWords:
    """Kept per utterance by its pump; read by a cancel (`heard`)."""

    segments: dict[int, _Segment] = field(default_factory=dict)
    sent_ms: float = 0.0  # audio sent so far, on the utterance's clock
    last_ms: float = 0.0  # the latest span end given (spans stay monotone)
    _open: list[int] = field(default_factory=list)  # segments whose words may still lack a span

    def committed(self, index: int, text: str) -> None:
        """Segment `index` is committed: its words are owed a span even if its audio never comes (a model
        that ended it early, text the voice could not read), given as points when a later segment or the
        end closes it."""
        self._segment(index, text)

    def _segment(self, index: int, text: str) -> _Segment:
        seg = self.segments.get(index)
        if seg is None:
            seg = _Segment(text, [_Word(text[a:b], b) for a, b in word_spans(text)])
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
        absorbing: tuple[_Word, WordTime] | None = None  # a rewritten word taking the engine words said for it
        for word, start, end in spoken:
            start, end = max(start, self.last_ms), max(end, start, self.last_ms)
            k = key(word)
            match = next((j for j in range(seg.next, min(seg.next + _LOOKAHEAD, len(seg.words)))
                          if key(seg.words[j].text) == k), None)  # fmt: skip
            if match is not None:
                for skipped in seg.words[seg.next : match]:  # unspoken as written: a point where it would be
                    out.append(self._give(index, skipped, start, start))
                out.append(self._give(index, seg.words[match], start, end))
                seg.next, absorbing = match + 1, None
            elif absorbing is not None:  # "five" then "dollars" for "$5": its span grows (sent once, below)
                absorbing[0].end_ms = end
                absorbing[1].end_ms = round(end)
                self.last_ms = max(self.last_ms, end)
            elif seg.next < len(seg.words):
                absorbing = seg.words[seg.next], self._give(index, seg.words[seg.next], start, end)
                out.append(absorbing[1])
                seg.next += 1
        return out

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
            out.append(self._give(index, w, at, at + length))
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
                out.append(self._give(i, w, self.last_ms, self.last_ms))
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

    def _give(self, index: int, w: _Word, start: float, end: float) -> WordTime:
        w.start_ms, w.end_ms = start, end
        self.last_ms = max(self.last_ms, end)
        return self._wire(index, w)

    @staticmethod
    def _wire(index: int, w: _Word) -> WordTime:
        assert w.start_ms is not None and w.end_ms is not None
        return WordTime(w.text, round(w.start_ms), round(w.end_ms), index)

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
