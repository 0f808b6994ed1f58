"""Per-segment language detection and sentence cutting for the CPU voices."""

from __future__ import annotations

import pytest

from engine.cpu.text import canonical_language, detect_language, han_latin_runs, sentences, split_long


@pytest.mark.parametrize(
    ("text", "lang"),
    [("Hello there.", "en"), ("你好。", "zh"), ("我用iPhone打电话。", "zh"), ("Call 好吗", "zh"),
     ("3.14", "en")],
)
def test_detect_language_any_han_means_mandarin(text: str, lang: str) -> None:
    assert detect_language(text) == lang


@pytest.mark.parametrize(
    ("given", "canonical"),
    [("English", "en"), ("en-US", "en"), ("Chinese", "zh"), ("zh-CN", "zh"), ("Auto", "auto"), ("", "auto"),
     ("fr", None)],
)
def test_language_aliases(given: str, canonical: str | None) -> None:
    assert canonical_language(given) == canonical


def test_sentences_keep_decimals_whole_and_cut_han_marks() -> None:
    assert sentences("It is 3.14 today! Ok? And more") == ["It is 3.14 today!", "Ok?", "And more"]
    assert sentences("你好，这是测试。今天很好！走吧") == ["你好，这是测试。", "今天很好！", "走吧"]


def test_han_latin_runs_lose_nothing() -> None:
    text = "我用iPhone打电话，好吗？OK."
    runs = han_latin_runs(text)
    assert "".join(r for _, r in runs) == text
    assert [h for h, _ in runs] == [True, False, True, False]


def test_split_long_respects_limit_and_prefers_clause_marks() -> None:
    text = "a" * 30 + ", " + "b" * 30 + ". " + "c" * 50
    pieces = split_long(text, 40)
    assert all(len(p) <= 40 for p in pieces)
    assert pieces[0].endswith(",") and pieces[1].endswith(".")
    assert "".join(pieces).replace(" ", "") == text.replace(" ", "")
