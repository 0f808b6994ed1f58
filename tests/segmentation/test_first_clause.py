"""The first clause of an utterance goes early (issue 14: Mandarin first audio), fed 1–2 characters at a
time as an LLM streams Mandarin; later segments stay sentence-sized."""

from __future__ import annotations

import pytest
from support.segcases import mandarin_deltas

from segmentation import Segment, StreamSegmenter


def commits(text: str, deltas: list[str], granularity: str = "auto") -> list[tuple[Segment, int]]:
    """Each segment (flush included) with how many characters had arrived when it was committed."""
    seg = StreamSegmenter(granularity=granularity, clock=lambda: 0.0)  # no first-piece cut: no time passes
    out: list[tuple[Segment, int]] = []
    received = 0
    for d in deltas:
        received += len(d)
        out += [(s, received) for s in seg.feed(d)]
    out += [(s, received) for s in seg.flush()]
    assert "".join(s.text for s, _ in out) == text
    return out


REPLY = "好的，我来帮您安排。您周五晚上七点半的四人桌已经订好了，确认信息已经发到您的邮箱。"


@pytest.mark.parametrize("seed", range(6))
def test_auto_commits_an_opening_of_two_han_characters_alone_at_the_next_character(seed: int) -> None:
    got = commits(REPLY, mandarin_deltas(REPLY, seed))
    first, received = got[0]
    assert (first.text, first.reason) == ("好的，", "clause")
    assert received <= len("好的，") + 2  # the delta carrying the character after "，" (one or two)
    # Later segments are sentences: their short clauses do not break them.
    assert [s.text for s, _ in got[1:]] == ["我来帮您安排。", REPLY[len("好的，我来帮您安排。") :]]


@pytest.mark.parametrize("granularity", ["auto", "clause"])
@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("你好，欢迎致电客服中心。", "你好，"),
        ("当然，这个问题很简单。", "当然，"),
        ("他说：明天见。", "他说："),
        ("好的，let me check that. 稍等。", "好的，"),  # mixed: the Han opening counts
        ("Of course，我来查一下。", "Of course，"),  # two Latin words are an opening too
    ],
)
def test_first_clause_goes_alone(granularity: str, text: str, first: str) -> None:
    for seed in range(3):
        assert commits(text, mandarin_deltas(text, seed), granularity)[0][0].text == first


@pytest.mark.parametrize("granularity", ["auto", "clause"])
@pytest.mark.parametrize("text", ["好，我来帮您安排。", "OK，我们开始吧。", "Sure, I can help with that. Then"])
def test_a_one_syllable_or_one_word_opening_waits_for_more(granularity: str, text: str) -> None:
    for seed in range(3):
        first = commits(text, mandarin_deltas(text, seed), granularity)[0][0]
        assert len(first.text) > text.index(next(c for c in text if c in ",，")) + 2


def test_clause_mode_keeps_its_length_rule_after_the_first_clause() -> None:
    text = "好的，我明白了，明天的会议，我们改到下午三点开始。"
    got = [s.text for s, _ in commits(text, list(text), "clause")]
    assert got[0] == "好的，"
    assert got[1] == "我明白了，明天的会议，"  # 4 then 4 characters: the 6-character rule holds


def test_each_utterance_has_its_own_first_clause() -> None:
    seg = StreamSegmenter(granularity="auto", clock=lambda: 0.0)
    out = []
    for d in mandarin_deltas("好的，我明白了。", 0):
        out += seg.feed(d)
    out += seg.flush()
    for d in mandarin_deltas("是的，就是这样。", 1):
        out += seg.feed(d)
    out += seg.flush()
    assert [s.text for s in out] == ["好的，", "我明白了。", "是的，", "就是这样。"]
