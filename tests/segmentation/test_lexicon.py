"""Pronunciations applied to committed text: whole words, case-aware, Han text too, longest entry first."""

from __future__ import annotations

from types import FrameType

import pytest

from segmentation.lexicon import Pronunciations

LEXICON = Pronunciations({"voxgate": "vocks gate", "US": "you ess", "gate": "GATE", "语音网关": "沃克斯网关",
                          "C++": "see plus plus", "voxgate pro": "vocks gate pro"})  # fmt: skip


@pytest.mark.parametrize(("text", "said"), [
    ("Voxgate and VOXGATE, voxgate.", "vocks gate and vocks gate, vocks gate."),  # lower case: any case
    ("voxgates xvoxgate gateway", "voxgates xvoxgate gateway"),  # whole words only
    ("the US and us", "the you ess and us"),  # a capital in the entry: only as written
    ("I code C++ daily", "I code see plus plus daily"),  # a word ending in a symbol
    ("Try voxgate pro now", "Try vocks gate pro now"),  # the longest entry wins
    ("欢迎使用语音网关服务", "欢迎使用沃克斯网关服务"),  # Han text: no spaces to bound a word
    ("Gate 7, gate.", "GATE 7, GATE."),
])  # fmt: skip
def test_entries_replace_whole_words(text: str, said: str) -> None:
    assert LEXICON.apply(text) == said


def test_an_empty_lexicon_changes_nothing() -> None:
    assert not Pronunciations({}) and Pronunciations({}).apply("voxgate") == "voxgate"


def test_entries_match_across_any_whitespace_and_by_case_rule() -> None:
    lexicon = Pronunciations({"voxgate pro": "vocks gate pro", "us": "uss", "US": "you ess", "Node.js": "node js"})
    said = lexicon.apply("voxgate\n pro, US, Us, node.js, Node.js")
    assert said == "vocks gate pro, you ess, uss, node.js, node js"


def _lines_run(lexicon: Pronunciations, text: str) -> int:
    """The lines of segmentation/lexicon.py executed applying `lexicon` to `text`: its work, counted."""
    import sys

    count = 0

    def tracer(frame: FrameType, event: str, arg: object) -> object:
        nonlocal count
        if frame.f_code.co_filename.endswith("segmentation/lexicon.py") and event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        lexicon.apply(text)
    finally:
        sys.settrace(None)
    return count


def hostile(entries: int) -> Pronunciations:
    """Issue 35's lexicon: entries of 60 "~" and four digits, the costliest an alternation can be."""
    return Pronunciations({"~" * 60 + f"{i:04d}": "b" for i in range(entries)})


def test_applying_a_lexicon_costs_the_same_whatever_its_number_of_entries() -> None:
    """Issue 35: one regex alternation of the entries cost entries × characters, in `re` (the GIL held:
    7.8 s for 1000 entries over 64 KiB). The work is now per token: the same for 1 entry as for 1000,
    and it grows with the text, not faster."""
    text = "~" * 4000 + " say ~0001 and 语音网关 please " * 20
    one, thousand = _lines_run(hostile(1), text), _lines_run(hostile(1000), text)
    assert thousand <= one * 1.01, (one, thousand)  # the automaton's walk differs by a step per near-match
    assert _lines_run(hostile(1000), text * 4) <= 4 * thousand + 100


def test_a_thousand_hostile_entries_over_64_kib_are_applied_at_once() -> None:
    import time

    lexicon, text = hostile(1000), "~" * 65536
    t0 = time.monotonic()
    assert lexicon.apply(text) == text
    assert lexicon.apply("~" * 60 + "0042 and more") == "b and more"
    assert time.monotonic() - t0 < 2.0  # a generous backstop: 0.03 s here, 7.8 s before (issue 35)
