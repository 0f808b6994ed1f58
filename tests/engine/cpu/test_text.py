"""Sentence cutting and pieces for the CPU voices."""

from __future__ import annotations

import time

from engine.cpu.text import cost, han_latin_runs, pieces, sentences, split_long


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


def test_pieces_pack_whole_sentences_and_cut_only_longer_ones() -> None:
    text = "Hi there. How are you? " + "and then it went on and on " * 12 + "to the end, finally."
    out = list(pieces(text, 80))
    assert out[0] == "Hi there. How are you?"  # whole sentences packed while they fit
    assert all(cost(p) <= 80 for p in out)
    assert " ".join(out).split() == text.split()  # no word lost, split or repeated


def test_pieces_cut_long_sentences_after_clause_marks_before_spaces() -> None:
    text = "one two three four five six seven, eight nine ten eleven twelve thirteen fourteen fifteen"
    assert list(pieces(text, 50)) == ["one two three four five six seven,",
                                      "eight nine ten eleven twelve thirteen fourteen", "fifteen"]


def test_pieces_cut_mandarin_at_punctuation_else_between_words() -> None:
    punctuated = "好的，我来帮您处理。您的订单明天发货。" * 6
    out = list(pieces(punctuated, 60))
    assert all(p.endswith("。") for p in out) and "".join(out).replace(" ", "") == punctuated
    unpunctuated = "今天天气很好我们一起去公园散步然后吃饭再回家看电视" * 40  # no space, no mark
    out = list(pieces(unpunctuated, 60))
    assert len(out) > 40 and all(cost(p) <= 60 for p in out)
    assert "".join(out) == unpunctuated
    assert not any(p.startswith(("天气", "们", "园", "步", "饭", "家", "电视")) for p in out)  # whole words


def test_pieces_of_text_without_any_break_are_still_bounded() -> None:
    for text in ("a" * 5000, "!" * 5000 + "a", ",,,," * 1000 + "x"):
        out = list(pieces(text, 200))
        assert all(cost(p) <= 200 for p in out) and "".join(out) == text


def test_sentences_are_linear_in_a_run_of_marks() -> None:
    # `.+?(?:[.!?…]+…)` backtracked through a run of marks not followed by a space: 20000 "!" and a
    # letter took about 8 s (quadratic). The bound is generous; linear takes milliseconds.
    t0 = time.perf_counter()
    assert sentences("!" * 20000 + "a") == ["!" * 20000 + "a"]
    assert time.perf_counter() - t0 < 1.0
