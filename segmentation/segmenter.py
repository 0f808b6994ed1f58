"""StreamSegmenter: decides, delta by delta, which text from an LLM is safe to speak.

Every mark (sentence end, clause mark, newline, code fence) is decided once, when the first
non-space character after it arrives: that is enough to tell "Dr. Smith" from "today. Then",
"3.14" from "3. Then" and `。”` from `。然`, and it keeps the commit lag at one character.
A regular expression jumps from mark to mark, and the pending buffer never holds more than
`max_chars` (it is cut at a word boundary).

The cost of `feed()` is linear in what it is fed, whatever the text (it runs on the gateway's event
loop): every look past a mark stops at the bound, `pending_start + limit` (a segment may not be longer,
so text beyond it cannot change the decision, and where the decision needs it the run is cut there);
a look that waits for more text resumes where it stopped; word and character counts are kept, not
recounted; a forced cut looks back at most `_MAX_WORD` characters; and pysbd, the one costly call,
runs at most once per `pysbd_every` characters after a burst of `pysbd_burst`. Because the bound
depends on what was committed, never on how the text was chopped, the segments are the same for any
chop of the same text (`poll()` and the first-piece cut aside, which depend on time).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from segmentation import chars, jieba_pysbd
from segmentation.atoms import safe_end, splits_atom
from segmentation.chars import CLOSERS, DASH, ELLIPSIS, HAN_CLASS, HAN_CLAUSE_MARKS, HAN_SENTENCE_ENDS, is_han
from segmentation.segment import GRANULARITIES, Granularity, Reason, Segment, SegmentPolicy

# Titles that precede a name: never a sentence end before a capital ("Dr. Smith", "St. Louis").
_TITLES = frozenset(
    "dr mr mrs ms prof st mt ft gen col capt lt sgt rev hon sen rep gov pres messrs mme mlle vs".split()
)
# Abbreviations that precede a number ("No. 5", "Fig. 3").
_BEFORE_NUMBER = frozenset("no nos vol fig figs p pp ch sec art op ex eq approx ca tel".split())
# Abbreviations that may or may not end a sentence ("Acme Inc. It", "at 5 p.m. Then"): pysbd decides.
_AMBIGUOUS = frozenset("inc ltd co corp jr sr etc al bros llc plc dept est univ".split())
_INITIALISM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")  # U.S, e.g, p.m, Ph.D (final dot excluded)
_LIST_MARKER = re.compile(r"(?:\d{1,3}|[A-Za-z]|[ivxIVX]{1,4})")

# Everything the scanner stops at, by granularity: `none` decides only fences, `sentence` no clauses.
# Inside a code fence only the closing fence matters.
_FENCE_END = re.compile(r"`")
_MARKS = {
    "none": _FENCE_END,
    "sentence": re.compile(r"[.!?。！？…\n`]"),
    "clause": re.compile(r"[.!?。！？…,;:，、；：—\n`]"),
    "auto": re.compile(r"[.!?。！？…,;:，、；：—\n`]"),
}
_TERMINATORS = frozenset(".!?。！？…")
_WS = frozenset(" \t\r\n\f\v\u3000\u00a0")
_BACKTICK = "`"


def _class(members: frozenset[str] | str) -> str:
    return "".join(re.escape(c) for c in sorted(members))


# Looks past a mark run over these, at the regex engine's speed rather than a Python loop's.
_RUNS = {m: re.compile(f"[{_class(m)}]*") for m in (_WS, CLOSERS, _TERMINATORS, DASH, _BACKTICK)}
_S, _H = _class(_WS), HAN_CLASS
_NON_WS = re.compile(f"[^{_S}]")
# Where a forced cut may fall, searched for in the reversed window so that the first match is the
# last boundary: at x, the pair (r[x+1], r[x]) is (buf[j-1], buf[j]) of the cut j. A cut falls after
# a space, between Han characters (jieba decides), or where the script changes (我用|Python, Python|写),
# never inside a Latin token.
_CUT_CANDIDATE = re.compile(f"[^{_S}](?=[{_S}])|[{_H}](?=[^{_S}])|[^{_S}{_H}](?=[{_H}])")
# A forced cut keeps a word whole if it starts within this many characters before the bound; a
# longer "word" is cut at the bound (this bounds the look back in `none` mode's 64 KiB buffer).
_MAX_WORD = 1024
# The first-piece cut looks at most this far into the first clause (jieba runs over it at each feed).
_FIRST_CUT_LOOK = 64
# Particles that lean on the word before them: the first piece never ends just before one
# ("根据您提供|的信息" would leave 的 to open the next piece).
_CLITICS = frozenset("的地得了着过吗呢吧啊呀么")
# pysbd sees this much text before the period: enough for its rules, which look a few words back.
_PYSBD_CONTEXT = 160

class StreamSegmenter:
    """Commits streamed text at safe boundaries: a committed segment is final, so the engine may speak it at once."""

    def __init__(
        self,
        language: str = "auto",
        granularity: str = "auto",
        *,
        clock: Callable[[], float] = time.monotonic,
        **policy: object,
    ) -> None:
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {granularity!r}")
        self.language = language
        self.granularity: Granularity = granularity  # type: ignore[assignment]
        self.policy = SegmentPolicy(**policy)  # type: ignore[arg-type]
        # The longest a segment may be: pending text is cut there.
        self._limit = self.policy.max_buffer_chars if granularity == "none" else self.policy.max_chars
        self._clock = clock
        self.reset()

    # -- public API -------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything pending and start a new utterance at offset 0."""
        self._buf = ""  # holds the pending text plus a little committed context before it
        self._base = 0  # source offset of _buf[0]
        self._start = 0  # index in _buf where pending text begins
        self._pos = 0  # index in _buf where scanning resumes
        self._in_fence = False
        self._committed = 0  # segments committed in this utterance
        self._last_input = self._clock()
        self._hi = 0  # the look-ahead bound of the decision being made (see _decide)
        # How far a look-ahead run got, by the characters it runs over: source (start, end), so that
        # a decision that waits for text resumes its look where it stopped instead of rescanning.
        self._runs: dict[object, tuple[int, int]] = {}
        # Han characters and Latin words in the pending text from source offset _count_from to _count_to.
        self._count_from = self._count_to = 0
        self._n_han = self._n_words = 0
        self._pysbd_due = 0  # source offset the pysbd budget is paid up to (a GCRA over characters)
        self._first_at: float | None = None  # when this utterance's first text came (the first-cut hold)
        self._word_cut = False  # the first piece was cut at a word (`_first_cut`)
        # The run with no mark in the pending text (`_run_cut`): the source offset it starts at, the source
        # offsets of its first Han characters (at most run_cut_han + run_cut_look), and the source offset
        # they were looked for up to.
        self._run_from = 0
        self._han: list[int] = []
        self._han_to = 0
        self._no_run_cut = -1  # the first Han character (source offset) of a run with no word to cut at
        self._run_cuts = 0  # run cuts made in this utterance: each doubles the next one's size

    @property
    def pending(self) -> str:
        return self._buf[self._start :]

    @property
    def pending_chars(self) -> int:
        """`len(pending)` without copying it (asked per piece of text)."""
        return len(self._buf) - self._start

    def feed(self, delta: str) -> list[Segment]:
        chars.check_text(delta)
        self._last_input = self._clock()
        if not delta:
            return []
        if self._first_at is None:
            self._first_at = self._last_input
        self._buf += delta
        out = self._scan() or self._first_cut(self._last_input)
        self._compact()
        return out

    def flush(self) -> list[Segment]:
        """End of the utterance: commit everything, then start the next utterance at offset 0."""
        out = []
        if self._start < len(self._buf):
            out.append(self._commit(len(self._buf), "flush"))
        self.reset()
        return out

    def poll(self, now: float) -> list[Segment]:
        """Commit a tail that ends cleanly once the LLM has been quiet for `idle_timeout`."""
        if self.granularity == "none" or self._start == len(self._buf):
            return []
        if early := self._first_cut(now):
            return early
        if now - self._last_input < self.policy.idle_timeout:
            return []
        last = self._buf[-1]
        if last in _WS or last in _TERMINATORS or last in CLOSERS or last in DASH or _is_clause_mark(last):
            # An atom still open at the pause ("12.", "08:", "e.") is held; the text before it goes.
            end = safe_end(self._buf, self._start, len(self._buf))
            if end > self._start:
                self._pos = max(self._pos, end)
                return [self._commit(end, "timeout")]
        return []

    # -- scanning ---------------------------------------------------------------------------

    def _scan(self) -> list[Segment]:
        out: list[Segment] = []
        buf = self._buf
        n = len(buf)
        limit = self._limit
        i = -1  # the first mark at or after _pos (n: none yet); searched again only once _pos passes it
        while True:
            if i < self._pos:
                m = (_FENCE_END if self._in_fence else _MARKS[self.granularity]).search(buf, self._pos)
                i = m.start() if m else n
            # A long Mandarin run is cut before the bound is reached; both look at the text before the bound
            # only, so which comes first does not depend on how much of it has arrived.
            if (cut := self._run_cut(min(i, self._start + limit + 1))) is not None:
                out.append(self._commit(cut, "word"))
                self._run_cuts += 1
                self._pos = max(self._pos, self._start)  # i is still the next mark, as below
                continue
            if i - self._start > limit:
                # A forced cut leaves _pos before i, so i is still the next mark: no rescan per cut.
                out.append(self._forced_cut(self._start + limit))
                self._pos = max(self._pos, self._start)
                continue
            if i == n:
                self._pos = n
                return out
            decision = self._decide(i)
            if decision is None:  # need more text to decide
                if n - self._start > limit:  # but never wait beyond the bound
                    out.append(self._forced_cut(self._start + limit))
                    self._pos = max(i, self._start)
                    continue
                self._pos = i
                return out
            reason, end, resume = decision
            if reason is not None and end > self._start and not splits_atom(buf, end, self._hi):
                out.append(self._commit(end, reason))
            self._pos = resume
            self._run_from = self._base + resume  # a mark, committed or not, ends a run

    def _decide(self, i: int) -> tuple[Reason | None, int, int] | None:
        """Decide the mark at `i`: None to wait (or, past the bound, to cut), else (reason or None,
        commit end, resume index). It looks at no character at or past the bound _hi."""
        buf, c = self._buf, self._buf[i]
        # A segment ends at most `limit` past its start, so nothing past there can change a decision.
        self._hi = min(len(buf), self._start + self._limit + 1)
        if c == "`":
            return self._fence(i)
        if self._in_fence:
            return None, i, i + 1
        if self.granularity == "none":
            return None, i, i + 1
        if c == "\n":
            k = self._skip_ws(i)
            if k is None:
                return None
            has_text = _NON_WS.search(buf, self._start, i) is not None
            return ("sentence" if has_text else None), k, k
        if c in _TERMINATORS:
            return self._sentence_end(i)
        return self._clause(i)

    def _run_end(self, j: int, members: frozenset[str] | str) -> int:
        """End of the run of `members` characters from `j`, looking no further than _hi. A look that
        stopped at the end of the text resumes there when more arrives."""
        base, hi = self._base, self._hi
        if j >= hi or self._buf[j] not in members:
            return j  # the common case: no run at all
        start, end = self._runs.get(members, (-1, 0))
        k = end - base if start == base + j else j
        if k < hi:
            k = _RUNS[members].match(self._buf, k, hi).end()  # type: ignore[union-attr]  # `*` always matches
        self._runs[members] = (base + j, base + k)
        return k

    def _skip_ws(self, j: int) -> int | None:
        """Index of the first non-space character at or after `j`, or None if not yet received."""
        k = self._run_end(j, _WS)
        return k if k < self._hi else None

    def _closers_end(self, j: int) -> int:
        return self._run_end(j, CLOSERS)

    def _fence(self, i: int) -> tuple[Reason | None, int, int] | None:
        j = self._run_end(i, _BACKTICK)
        if j >= self._hi:
            return None  # a fence may still be growing
        if j - i >= 3:
            self._in_fence = not self._in_fence
        return None, i, j

    def _sentence_end(self, i: int) -> tuple[Reason | None, int, int] | None:
        buf = self._buf
        t = self._run_end(i, _TERMINATORS)
        if t - 1 > i and buf[t - 1] == "." and t < self._hi and buf[t].isdigit():
            t -= 1  # "。.5": the dot begins a decimal (.5) and goes with it
        j = self._closers_end(t)
        k = self._skip_ws(j)
        if k is None:
            return None
        if self._is_sentence_end(i, t, j, k) or "\n" in buf[j:k]:
            return "sentence", k, k
        return None, k, k

    def _is_sentence_end(self, i: int, t: int, j: int, k: int) -> bool:
        """The run buf[i:t] of terminators, closers to j, whitespace to k, then the character buf[k]."""
        buf = self._buf
        run, nxt, spaced = buf[i:t], buf[k], k > j
        before = buf[i - 1] if i > 0 else " "
        han_context = is_han(before) or is_han(nxt) or before in HAN_SENTENCE_ENDS
        if any(ch in HAN_SENTENCE_ENDS for ch in run):
            return True
        if not spaced and chars.is_latin_alnum(nxt):
            return False  # 3.14, example.com, e.g, jane.doe@, ?q=1
        if nxt.islower() and not is_han(nxt):
            return False  # "p.m. tomorrow", '"Watch out!" he shouted'
        if "!" in run or "?" in run:
            return True
        if ELLIPSIS in run or len(run) >= 3:
            # "Well... I guess": a hesitation after one word is not a sentence; "让我想想……好的" is.
            return han_context or self._counts(i)[1] >= 2
        if not spaced and nxt in ",;:":
            return False  # "e.g.,"
        return self._period_ends_sentence(i, k)

    def _period_ends_sentence(self, i: int, k: int) -> bool:
        buf = self._buf
        w = i
        while w > 0 and i - w < 48 and buf[w - 1] not in _WS and not _glue(buf[w - 1]):
            w -= 1  # a token glued to Han text starts after it: 参见Dr. is "Dr"
        token = buf[w:i].lstrip("\"'“‘([{（「『《")
        if not token:
            return True
        lower = token.lower()
        nxt = buf[k]
        at_line_start = (w == 0 and self._base == 0) or (w > 0 and buf[w - 1] == "\n")
        if at_line_start and _LIST_MARKER.fullmatch(token):
            return False  # "1. Pay online", "a. Yes"
        if lower in _TITLES:
            return False
        if nxt.isdigit():
            return lower not in _BEFORE_NUMBER
        if len(token) == 1 and token.isupper():
            return False  # an initial: "J. R. R. Tolkien"
        if lower in _AMBIGUOUS or _INITIALISM.fullmatch(token):
            if is_han(nxt):
                return False  # "我在 Acme Inc. 工作": the Han sentence goes on
            if not self._pysbd_budget(i):
                return False
            lo = max(self._start, i - _PYSBD_CONTEXT)
            return jieba_pysbd.pysbd_splits(buf[lo : k + 1], k - lo)
        return True

    def _pysbd_budget(self, i: int) -> bool:
        """May pysbd run for the mark at `i`? A burst, then one call per `pysbd_every` characters.
        Counted in source offsets, so the answer does not depend on how the text was chopped."""
        p, at = self.policy, self._base + i
        if at < self._pysbd_due - (p.pysbd_burst - 1) * p.pysbd_every:
            return False
        self._pysbd_due = max(self._pysbd_due, at) + p.pysbd_every
        return True

    def _clause(self, i: int) -> tuple[Reason | None, int, int] | None:
        buf = self._buf
        c = buf[i]
        if self.granularity == "sentence":
            return None, i, i + 1
        if c == DASH:
            j = self._run_end(i, DASH)
        elif c in HAN_CLAUSE_MARKS:
            j = i + 1
        else:  # , ; :  only before whitespace, so never inside 1,000 or 10:30 or http://
            if i + 1 >= self._hi:
                return None
            if buf[i + 1] not in _WS:
                return None, i, i + 1
            j = i + 1
        j = self._closers_end(j)
        k = self._skip_ws(j)
        if k is None:
            return None
        if "\n" in buf[j:k]:
            return "sentence", k, k  # a line break ends the line, long or short
        if self._clause_long_enough(k):
            return "clause", k, k
        return None, k, k

    def _clause_long_enough(self, end: int) -> bool:
        p = self.policy
        if self._committed == 0 or (self._committed == 1 and self._word_cut):  # a cut first clause's rest too
            words, han = p.first_clause_words, p.first_clause_han
            if self.granularity == "clause":  # the finer mode is never later than auto
                words, han = min(words, p.min_clause_words), min(han, p.min_clause_han)
        elif self.granularity == "clause":
            words, han = p.min_clause_words, p.min_clause_han
        else:
            words, han = p.auto_clause_words, p.auto_clause_han
        n_han, n_words = self._counts(end)
        return n_han / han + n_words / words >= 1.0

    def _counts(self, end: int) -> tuple[int, int]:
        """(Han characters, Latin words) in buf[_start:end]. Counted once, not at every mark: the ends
        asked for only grow while the start stays, and none falls inside a word (each is a mark, or
        the first character after a mark's closers and spaces), so the counts of the pieces add up."""
        buf, base, start = self._buf, self._base, self._base + self._start
        if self._count_from != start or base + end < self._count_to:
            self._count_from = self._count_to = start
            self._n_han = self._n_words = 0
        p = self._count_to - base
        if end > p:
            self._n_han += len(chars.HAN_RE.findall(buf, p, end))
            self._n_words += len(chars.LATIN_WORD_RE.findall(buf, p, end))
            self._count_to = base + end
        return self._n_han, self._n_words

    # -- the first piece ------------------------------------------------------------------------

    def _first_cut(self, now: float) -> list[Segment]:
        """auto: the first piece of a Mandarin utterance, cut at a jieba word inside its first clause
        once `first_cut_hold` has passed since the utterance's first text with no clause end (a mark
        waiting for its next character is one: it commits on that character)."""
        p = self.policy
        if (self._committed or self.granularity != "auto" or not p.first_cut_han or self.language == "en"
                or self._in_fence or self._first_at is None or now - self._first_at < p.first_cut_hold
                or self._pos < len(self._buf)):  # fmt: skip
            return []
        cut = self._first_word_end()
        if cut is None:
            return []
        self._word_cut = True
        return [self._commit(cut, "word")]

    def _first_word_end(self) -> int | None:
        """The first jieba word boundary between two Han characters of the pending text with at least
        `first_cut_han` Han characters before it, looking `_FIRST_CUT_LOOK` characters in; None if none.
        A Han run's end is never one (its last word may still be arriving, or Latin text follows)."""
        buf, need = self._buf, self.policy.first_cut_han
        end = min(len(buf), self._start + _FIRST_CUT_LOOK)
        han, i = 0, self._start
        while i < end:
            if not is_han(buf[i]):
                i += 1
                continue
            lo = i
            while i < end and is_han(buf[i]):
                i += 1
            if han + (i - lo) > need:  # a boundary with `need` before it may lie inside this run
                for e in jieba_pysbd.jieba_cuts(buf[lo:i])[:-1]:
                    if han + e >= need and buf[lo + e] not in _CLITICS and not splits_atom(buf, lo + e, i):
                        return lo + e
            han += i - lo
        return None

    # -- a long Mandarin run -------------------------------------------------------------------

    def _run_cut(self, end: int) -> int | None:
        """auto and clause: where to cut the pending text once the run with no mark before buf[end] (the
        next mark, or the end of the text, never past the bound) holds `size + run_cut_look` Han
        characters, `size` being `run_cut_han` doubled at each run cut of the utterance
        (SegmentPolicy.run_cut_han); None while it holds fewer, or when no word boundary lies within its
        first `size`. The cut depends only on the text up to the last of those characters, so not on how
        it was chopped."""
        p = self.policy
        size = p.run_cut_han << min(self._run_cuts, 16)
        if (not size or size + p.run_cut_look > self._limit or self.granularity not in ("auto", "clause")
                or self.language == "en" or self._in_fence):  # fmt: skip
            return None  # past max_chars the forced cut takes over
        han = self._run_han(end, size + p.run_cut_look)
        base = self._base
        if len(han) < size + p.run_cut_look or self._no_run_cut == han[0]:
            return None
        # A piece ends at most just past its size-th Han character, or the particle after it (one that leans
        # on the word before it goes with that word); jieba sees up to the last character counted.
        limit, hi = han[size - 1] - base + 1, han[-1] - base + 1
        limit += self._buf[limit] in _CLITICS and limit + 1 < hi
        cut = self._word_end(limit, hi)
        if cut is None:  # no word boundary: the run waits for a mark, or max_chars (asked once per run)
            self._no_run_cut = han[0]
        return cut

    def _run_han(self, end: int, need: int) -> list[int]:
        """The source offsets of the first `need` Han characters of the run with no mark, before buf[end]
        (fewer if it holds fewer). Each character is looked at once: a mark or a commit drops those before
        it, and the look resumes where it stopped."""
        start = max(self._base + self._start, self._run_from)
        han = self._han
        if han and han[0] < start:
            han = self._han = [o for o in han if o >= start]
        at = max(self._han_to, start)
        if len(han) < need and self._base + end > at:
            base = self._base
            for m in chars.HAN_RE.finditer(self._buf, at - base, end):
                han.append(base + m.start())
                if len(han) == need:
                    at = base + m.end()
                    break
            else:
                at = base + end
            self._han_to = at
        return han

    # -- commits ----------------------------------------------------------------------------

    def _forced_cut(self, limit: int) -> Segment:
        """Cut the pending run at the last word boundary at or before `limit` (text up to and
        including buf[limit] has arrived: the caller cuts only once the run is past the bound)."""
        cut = self._word_end(limit, limit + 1)
        # limit: one token longer than max_chars, no word to keep whole
        return self._commit(limit if cut is None else cut, "forced")

    def _word_end(self, limit: int, hi: int) -> int | None:
        """The last word boundary after the pending text's start and at or before `limit`, looking at
        no text at or past buf[hi] (hi > limit); None if none."""
        buf, start = self._buf, self._start
        self._hi = hi  # _han_word_cut looks no further, whatever else has arrived
        floor = max(start, limit - _MAX_WORD)
        window = buf[floor : limit + 1][::-1]  # candidate j is at x = limit - j
        x = 0
        while (m := _CUT_CANDIDATE.search(window, x)) is not None:
            j = limit - m.start()
            if not (is_han(buf[j - 1]) and is_han(buf[j])):
                if not splits_atom(buf, j, hi):  # never 2026|元, 25 |kg, 温度25|摄氏度
                    return j
                x = m.start() + 1
                continue
            lo, han_cut = self._han_word_cut(j)
            if han_cut > start and not splits_atom(buf, han_cut, hi):
                return han_cut
            # No word boundary inside this Han run (look before it), or one inside an atom (验证码|是4821:
            # look before that boundary).
            x = limit - lo if han_cut <= start else limit - han_cut + 1
        return None

    def _han_word_cut(self, j: int) -> tuple[int, int]:
        """(start of the Han run around `j`, its last jieba word boundary at or before `j`, or 0)."""
        buf = self._buf
        lo = j
        while lo > self._start and is_han(buf[lo - 1]) and j - lo < 64:
            lo -= 1
        hi = j
        while hi < self._hi and is_han(buf[hi]) and hi - j < 16:
            hi += 1
        # The run's last word may still be arriving, so the run's end is not a boundary. A particle that
        # leans on the word before it (`_CLITICS`, a word alone) goes with that word: the cut moves past it.
        ends = jieba_pysbd.jieba_cuts(buf[lo:hi])
        words = set(ends)
        cut = 0
        for e in ends:
            c = lo + e
            if c < hi and buf[c] in _CLITICS and e + 1 in words:  # the particle alone, not 的确
                c += 1
            if c < hi and c <= j:
                cut = c
        return lo, (cut if cut > lo else 0)

    def _commit(self, end: int, reason: Reason) -> Segment:
        seg = Segment(self._buf[self._start : end], self._base + self._start, self._base + end, reason)
        self._start = end
        self._committed += 1
        return seg

    def _compact(self) -> None:
        """Drop committed text, keeping a little context for the abbreviation rules."""
        keep = 64
        if self._start > 4 * keep:
            cut = self._start - keep
            self._buf = self._buf[cut:]
            self._base += cut
            self._start -= cut
            self._pos -= cut


def _glue(c: str) -> bool:
    """Han text or Han punctuation: a Latin token glued to it starts after it."""
    return is_han(c) or c in HAN_SENTENCE_ENDS or c in HAN_CLAUSE_MARKS or "\u3000" <= c <= "\u303f"


def _is_clause_mark(c: str) -> bool:
    return c in HAN_CLAUSE_MARKS or c in chars.LATIN_CLAUSE_MARKS
