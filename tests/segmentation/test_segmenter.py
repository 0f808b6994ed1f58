"""Behaviour of StreamSegmenter, one rule per test."""

from __future__ import annotations

import pytest

from segmentation import Segment, StreamSegmenter


def feed_all(seg: StreamSegmenter, deltas: list[str]) -> list[Segment]:
    out = []
    for d in deltas:
        out += seg.feed(d)
    return out


def texts(segs: list[Segment]) -> list[str]:
    return [s.text for s in segs]


@pytest.mark.parametrize(
    "text",
    [
        "Dr. Smith",
        "Mr. Jones",
        "St. Louis",
        "e.g. This",
        "i.e. That",
        "J. R. R. Tolkien",
        "3.14 is pi",
        "version 2.4.1 ships",
        "at 10.0.0.1 now",
        "see example.com today",
        "mail jane.doe@acme.co.uk now",
        "open notes.txt now",
        "No. 5 wins",
        "Fig. 3 shows",
        "1. First item",
        "Brazil vs. Germany",
        "The U.S. economy",
    ],
)
def test_period_inside_a_sentence_never_commits(text: str) -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert feed_all(seg, list(text + " and more words")) == []


def test_sentence_commits_on_the_next_non_space_character() -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert seg.feed("It works.") == []
    assert seg.feed("   ") == []
    [s] = seg.feed("T")
    assert (s.text, s.start, s.end, s.reason) == ("It works.   ", 0, 12, "sentence")
    assert seg.pending == "T"


def test_han_sentence_end_waits_one_character_for_a_closing_quote() -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert seg.feed("他说：“明天见。") == []
    assert seg.feed("”") == []
    assert texts(seg.feed("然")) == ["他说：“明天见。”"]


def test_closing_quote_stays_with_the_english_sentence() -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert texts(feed_all(seg, list('"Stop." Then'))) == ['"Stop." ']


def test_exclamation_inside_quotes_before_lowercase_is_not_an_end() -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert feed_all(seg, list('"Watch out!" he shouted')) == []


def test_ambiguous_abbreviation_is_confirmed_by_pysbd() -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert texts(feed_all(seg, list("I work at Acme Inc. It"))) == ["I work at Acme Inc. "]


def test_clause_needs_enough_words_and_never_splits_numbers() -> None:
    seg = StreamSegmenter(granularity="clause")
    assert feed_all(seg, list("Yes, sure")) == []  # too short
    seg = StreamSegmenter(granularity="clause")
    out = feed_all(seg, list("We have 1,250,000 users and $1,024.50 in fees, as of today"))
    assert texts(out) == ["We have 1,250,000 users and $1,024.50 in fees, "]
    assert out[0].reason == "clause"


def test_sentence_mode_ignores_clause_marks() -> None:
    seg = StreamSegmenter(granularity="sentence")
    assert feed_all(seg, list("I looked at your account carefully, and it is fine")) == []


def test_han_clause_is_measured_in_characters() -> None:
    seg = StreamSegmenter(granularity="clause")  # after the first clause, 2 characters are too few
    assert texts(feed_all(seg, list("根据您提供的信息，你好，再"))) == ["根据您提供的信息，"]
    seg = StreamSegmenter(granularity="clause")
    assert texts(feed_all(seg, list("根据您提供的信息，我们"))) == ["根据您提供的信息，"]


def test_auto_lets_the_first_clause_go_early_then_prefers_sentences() -> None:
    seg = StreamSegmenter(granularity="auto")
    out = feed_all(seg, list("Sure thing, I can help, let me look. Then more"))
    assert texts(out) == ["Sure thing, ", "I can help, let me look. "]
    assert [s.reason for s in out] == ["clause", "sentence"]


def test_auto_breaks_a_long_sentence_at_a_clause() -> None:
    seg = StreamSegmenter(granularity="auto")
    first = "Okay then, "
    long = "the payment you made last Tuesday was received and it was applied to the wrong invoice, "
    out = feed_all(seg, list(first + long + "so I"))
    assert texts(out) == [first, long]


def test_none_mode_waits_for_flush() -> None:
    seg = StreamSegmenter(granularity="none")
    assert feed_all(seg, list("One. Two, three! 四。")) == []
    [s] = seg.flush()
    assert (s.text, s.reason) == ("One. Two, three! 四。", "flush")


def test_flush_starts_a_new_utterance_at_offset_zero() -> None:
    seg = StreamSegmenter(granularity="sentence")
    seg.feed("Hello. Wor")
    assert texts(seg.flush()) == ["Wor"]
    [s] = seg.feed("Bye. N")
    assert (s.start, s.end) == (0, 5)


def test_reset_drops_pending_text() -> None:
    seg = StreamSegmenter()
    seg.feed("half a sent")
    seg.reset()
    assert seg.pending == "" and seg.flush() == []


def test_long_english_run_is_cut_at_a_word_boundary() -> None:
    seg = StreamSegmenter(granularity="sentence", max_chars=40)
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"
    out = feed_all(seg, list(text))
    assert out and all(s.reason == "forced" for s in out)
    for s in out:
        assert len(s.text) <= 40
        assert s.text.endswith(" "), s.text  # never mid-word
    assert "".join(texts(out)) + seg.pending == text


def test_long_han_run_is_cut_between_jieba_words() -> None:
    text = "我们的系统会自动根据您的使用习惯推荐最合适的套餐方案并在每个月初发送详细的账单说明给您"
    seg = StreamSegmenter(granularity="sentence", max_chars=16)
    out = feed_all(seg, list(text))
    assert out
    import jieba

    words_end = {0}
    for w in jieba.cut(text):
        words_end.add(max(words_end) + len(w))
    for s in out:
        assert s.end in words_end, f"cut inside a word at {s.end}: {s.text}"


def test_latin_token_inside_chinese_is_never_cut() -> None:
    word = "Supercalifragilisticexpialidocious"
    text = "我们使用了" + word + "这个词来测试切分的逻辑是否正确无误而且足够长"
    seg = StreamSegmenter(granularity="sentence", max_chars=40)
    out = feed_all(seg, list(text)) + seg.flush()
    assert any(word in s.text for s in out), texts(out)


def test_one_giant_token_is_still_bounded() -> None:
    seg = StreamSegmenter(granularity="sentence", max_chars=64)
    out = seg.feed("x" * 1000)
    assert all(len(s.text) == 64 for s in out)
    assert len(seg.pending) <= 64


def test_megabyte_delta_is_handled_and_the_buffer_stays_bounded() -> None:
    text = ("The quick brown fox jumps over the lazy dog, again and again. 你好，世界。" * 20000)[: 1 << 20]
    seg = StreamSegmenter(granularity="clause")
    out = seg.feed(text)
    assert len(seg.pending) <= seg.policy.max_chars
    assert "".join(texts(out + seg.flush())) == text
    assert len(seg._buf) < 4 * seg.policy.max_chars


def test_poll_commits_a_clean_tail_after_the_idle_time() -> None:
    now = [100.0]
    seg = StreamSegmenter(granularity="auto", clock=lambda: now[0], idle_timeout=0.5)
    assert seg.feed("Let me check that for you.") == []
    assert seg.poll(100.2) == []
    [s] = seg.poll(100.6)
    assert (s.text, s.reason) == ("Let me check that for you.", "timeout")


def test_poll_never_commits_mid_word() -> None:
    now = [0.0]
    seg = StreamSegmenter(granularity="auto", clock=lambda: now[0], idle_timeout=0.5)
    seg.feed("Let me chec")
    assert seg.poll(10.0) == []
    seg.feed("k ")
    assert texts(seg.poll(20.0)) == ["Let me check "]


def test_poll_does_nothing_in_none_mode() -> None:
    seg = StreamSegmenter(granularity="none", clock=lambda: 0.0)
    seg.feed("Waiting. ")
    assert seg.poll(100.0) == []


@pytest.mark.parametrize("bad", [None, 42, b"bytes", ["list"]])
def test_non_string_input_is_a_clear_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="must be a str"):
        StreamSegmenter().feed(bad)  # type: ignore[arg-type]


def test_lone_surrogate_is_a_clear_value_error() -> None:
    seg = StreamSegmenter()
    seg.feed("ok ")
    with pytest.raises(ValueError, match="surrogate"):
        seg.feed("bad \ud83d here")
    assert seg.pending == "ok "  # the bad delta changed nothing


def test_unknown_granularity_is_rejected() -> None:
    with pytest.raises(ValueError, match="granularity"):
        StreamSegmenter(granularity="word")


def test_code_fence_is_one_segment() -> None:
    seg = StreamSegmenter(granularity="clause")
    text = "Run:\n```py\nx = 1. Y = 2, z = 3; ok\n```\nDone. Now"
    out = feed_all(seg, list(text))
    assert texts(out) == ["Run:\n", "```py\nx = 1. Y = 2, z = 3; ok\n```\n", "Done. "]


def test_waiting_for_lookahead_never_grows_the_buffer_past_the_bound() -> None:
    seg = StreamSegmenter(granularity="sentence", max_chars=32)
    seg.feed("Hello.")
    for _ in range(100):
        seg.feed("   ")
        assert len(seg.pending) <= 32
