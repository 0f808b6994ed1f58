"""What the segmenter commits (`Segment`, with the rule that committed it) and the policy it follows
(`SegmentPolicy`, its tunables, checked when made)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# "word": Mandarin cut inside a clause at a jieba word: an utterance's first piece (SegmentPolicy.first_cut_han),
# or a long run with no mark that commits (SegmentPolicy.run_cut_han).
Reason = Literal["sentence", "clause", "word", "forced", "timeout", "flush"]
Granularity = Literal["none", "sentence", "clause", "auto"]
GRANULARITIES = ("none", "sentence", "clause", "auto")


@dataclass(frozen=True, slots=True)
class Segment:
    """A committed piece of an utterance: `text == source[start:end]`, whitespace included."""

    text: str
    start: int
    end: int
    reason: Reason


@dataclass(frozen=True, slots=True)
class SegmentPolicy:
    """Tunables. Lengths of clauses count Latin words and Han characters separately, since a Han
    character is about one syllable and an English word about one and a half."""

    max_chars: int = 300  # a run with no boundary is cut here (sentence/clause/auto)
    max_buffer_chars: int = 65536  # the same bound for `none`, which waits for the flush
    min_clause_words: int = 4  # clause mode
    min_clause_han: int = 6
    # The first clause of an utterance goes early (auto and clause): it is all the listener waits for.
    # Two Han characters let a reply's opening "好的，" / "你好，" / "当然，" go alone (a natural pause
    # follows it); one ("好，") is too short a model run to sound like speech.
    first_clause_words: int = 2
    first_clause_han: int = 2
    # auto, Mandarin: when no clause end has come `first_cut_hold` seconds after an utterance's first
    # text, its first piece is cut at the first jieba word boundary with at least `first_cut_han` Han
    # characters before it (reason "word"); the rest of that clause then goes at its clause end, as a
    # first clause would. Four characters are two words, about a second of speech: a phrase a listener
    # hears as one, and a model run a quarter of a 10-character clause's (0: never cut).
    first_cut_han: int = 4
    first_cut_hold: float = 0.1
    # auto and clause, Mandarin: once `run_cut_han + run_cut_look` Han characters have come with no mark
    # among them, the pending text is cut at the last jieba word boundary within the run's first
    # `run_cut_han` (reason "word"); the look is the context jieba needs, and the least left for the
    # next piece. Each such cut of an utterance doubles the next one's size (16, 32, 64, ... up to
    # max_chars), as a chunk ramp: by then its listener has that much audio ahead, and a flood of Han
    # text is not thousands of segments. Punctuated text keeps each mode's clause rules. Without the cut a
    # run with no mark is spoken only once it has all come (bench/results/overload_s14.md). Sixteen
    # characters are about 3.5 s of speech, a breath's phrase (0: never cut).
    run_cut_han: int = 16
    run_cut_look: int = 8
    auto_clause_words: int = 12  # auto, later: only long sentences break at clauses
    auto_clause_han: int = 20
    idle_timeout: float = 1.0  # seconds without input before poll() commits a clean tail
    # pysbd costs ~0.5 ms a call: past a burst, at most one call per this many characters; when the
    # budget is spent an ambiguous abbreviation is not a sentence end (a late commit, never a false one).
    pysbd_every: int = 1024
    pysbd_burst: int = 4

    def __post_init__(self) -> None:
        if self.max_chars < 16 or self.max_buffer_chars < self.max_chars:
            raise ValueError("need 16 <= max_chars <= max_buffer_chars")
        if self.idle_timeout <= 0:
            raise ValueError("idle_timeout must be positive")
        if self.pysbd_every < 1 or self.pysbd_burst < 1:
            raise ValueError("pysbd_every and pysbd_burst must be at least 1")
        if self.first_cut_han < 0 or self.first_cut_hold < 0:
            raise ValueError("first_cut_han and first_cut_hold must not be negative")
        if self.run_cut_han < 0 or self.run_cut_look < 1:
            raise ValueError("need run_cut_han >= 0 and run_cut_look >= 1")
