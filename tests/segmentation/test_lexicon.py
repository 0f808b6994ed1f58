"""Pronunciations applied to committed text: whole words, case-aware, Han text too, longest entry first."""

from __future__ import annotations

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
