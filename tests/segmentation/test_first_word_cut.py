"""auto's first-piece cut (issue 14: Mandarin first audio), on a fake clock: when no clause end of a
Mandarin utterance's first clause has come `first_cut_hold` after its first text, the first piece goes
at the first jieba word with 4 Han characters before it; the clause's rest goes at its clause end,
and later segments keep auto's sentence rule."""

from __future__ import annotations

import re

import jieba
import pytest
from support.segcases import Case, clause_ends, load_cases, sentence_ends

from segmentation import Segment, StreamSegmenter

HAN = re.compile(r"[\u4e00-\u9fff]+")
TOKEN = re.compile(r"[\u4e00-\u9fff]{1,2}|\s*[A-Za-z0-9'.%]+|.", re.S)  # a Mandarin LLM's tokens, as in bench/load.py


def stream(text: str, granularity: str = "auto", per_token: float = 0.05,
           **policy: object) -> list[tuple[float, Segment]]:
    """Feed `text` a token every `per_token` seconds (20 tokens/s) on a fake clock; each segment with
    the clock at its commit, the flush's included."""
    now = [0.0]
    seg = StreamSegmenter("zh", granularity, clock=lambda: now[0], **policy)
    out: list[tuple[float, Segment]] = []
    for i, token in enumerate(TOKEN.findall(text)):
        now[0] = i * per_token
        out += [(now[0], s) for s in seg.feed(token)]
    out += [(now[0], s) for s in seg.flush()]
    assert "".join(s.text for _, s in out) == text
    return out


def test_a_long_first_clause_goes_at_its_first_words_and_its_rest_at_the_clause_end() -> None:
    got = stream("今天下午可能会下雨，出门记得带伞，别忘了。明天晴。")
    assert [(s.text, s.reason) for _, s in got] == [
        ("今天下午", "word"), ("可能会下雨，", "clause"), ("出门记得带伞，别忘了。", "sentence"), ("明天晴。", "flush")]
    assert got[0][0] == pytest.approx(0.1)  # the token after 下午 confirms the word; the hold is over


def test_a_clause_end_within_the_hold_keeps_the_clause_whole() -> None:
    got = stream("这个问题，我来回答。")  # 这个|问题|，: the mark is there at 0.1 s
    assert [s.reason for _, s in got][:1] == ["clause"] and got[0][1].text == "这个问题，"
    assert [s.text for _, s in stream("好的，我来帮您安排一下。")][:1] == ["好的，"]


def test_no_cut_while_the_hold_lasts() -> None:
    now = [0.0]
    seg = StreamSegmenter("zh", "auto", clock=lambda: now[0])
    assert seg.feed("今天下午可能会") == []  # the whole burst at once: the hold has not passed
    now[0] = 0.09
    assert seg.feed("下") == [] and seg.poll(0.09) == []
    now[0] = 0.1
    assert [(s.text, s.reason) for s in seg.feed("雨")] == [("今天下午", "word")]


def test_poll_cuts_when_the_llm_stalls_mid_clause() -> None:
    seg = StreamSegmenter("zh", "auto", clock=lambda: 0.0)
    assert seg.feed("您的航班明天") == []
    assert seg.poll(0.05) == []
    assert [(s.text, s.reason) for s in seg.poll(0.2)] == [("您的航班", "word")]
    assert seg.poll(5.0) == []  # once per utterance; the rest waits for its sentence end (or the idle rule)


def test_a_mark_waiting_for_its_next_character_is_a_clause_end() -> None:
    seg = StreamSegmenter("zh", "auto", clock=lambda: 0.0)
    assert seg.feed("今天下午可能会下雨，") == []
    assert seg.poll(0.5) == []  # the clause end has come: it commits on the next character, whole
    assert [s.text for s in seg.feed("出")] == ["今天下午可能会下雨，"]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("根据您提供的信息，我们查了账单。", "根据您提供的"),  # not before 的: it leans on the word before it
        ("您需要两个鸡蛋、一杯面粉。", "您需要两个"),  # the first boundary with 4 before it: 您|需要|两个
        ("我们的系统会自动推荐套餐", "我们的系统"),  # no punctuation at all
        ("好，我们现在开始处理您的订单。", "好，我们现在"),  # a one-syllable opening is not a clause end
        ("我用Python写了一个脚本，很快。", "我用Python写了"),  # Han characters count, Latin words ride along
    ],
)
def test_the_cut_is_the_first_jieba_word_with_four_han_characters_before_it(text: str, first: str) -> None:
    got = stream(text)
    assert (got[0][1].text, got[0][1].reason) == (first, "word")
    whole = text[: next((i for i, c in enumerate(text) if c in "，、。"), len(text))]
    if "，" not in first:
        assert len(first) in {e for _, _, e in jieba.tokenize(whole)}  # a word of the whole clause, too


@pytest.mark.parametrize(
    ("text", "granularity", "policy"),
    [
        ("今天下午可能会下雨，出门记得带伞。", "sentence", {}),
        ("今天下午可能会下雨，出门记得带伞。", "clause", {}),
        ("今天下午可能会下雨，出门记得带伞。", "auto", {"first_cut_han": 0}),  # off
        ("The weather this afternoon may turn rainy, so take an umbrella.", "auto", {}),  # no Han
        ("OK，我用Python。", "auto", {}),  # 2 Han characters: too few for a piece
    ],
)
def test_no_cut(text: str, granularity: str, policy: dict[str, object]) -> None:
    assert all(s.reason != "word" for _, s in stream(text, granularity, **policy))


def test_each_utterance_has_its_own_first_piece() -> None:
    now = [0.0]
    seg = StreamSegmenter("zh", "auto", clock=lambda: now[0])
    out: list[Segment] = []
    for text in ("今天下午可能会下雨。", "您的航班明天出发。"):
        for token in TOKEN.findall(text):
            now[0] += 0.05
            out += seg.feed(token)
        out += seg.flush()
    assert [(s.text, s.reason) for s in out if s.reason == "word"] == [("今天下午", "word"), ("您的航班", "word")]


def test_the_policy_is_checked() -> None:
    with pytest.raises(ValueError):
        StreamSegmenter(first_cut_hold=-1.0)


ZH = [c for c in load_cases() if c.lang == "zh"]


@pytest.mark.parametrize("case", ZH, ids=[c.id for c in ZH])
def test_corpus_at_20_tokens_a_second_no_false_splits_no_missed_ends(case: Case) -> None:
    """The sentence and clause decisions stay exact with the cut on; a word cut is an extra commit
    between two Han characters: an utterance's first segment, with 4 Han characters before it, or a long
    run's piece (tests/segmentation/test_run_cut.py), with at most 16 (and a particle) and at least 8 more to
    come before the next sentence end."""
    got = [s for _, s in stream(case.text)]
    allowed = sentence_ends(case) | clause_ends(case.text)
    words = [s for s in got if s.reason == "word"]
    for s in words:
        assert HAN.fullmatch(case.text[s.end - 1 : s.end + 1]), s.text
        han = sum(map(len, HAN.findall(s.text)))
        if s is got[0]:
            assert han >= 4, s.text
        else:
            rest = case.text[s.end : min((b for b in sentence_ends(case) if b > s.end), default=len(case.text))]
            leaning = s.text[-1] in "的地得了着过吗呢吧啊呀么"  # a particle goes with the word before it
            assert han <= 16 + leaning and sum(map(len, HAN.findall(rest))) >= 8, (s.text, rest)
    decided = [s.end for s in got[:-1] if s.reason != "word"]
    assert not [e for e in decided if e not in allowed], [s.text for s in got]
    assert not [b for b in sentence_ends(case) if b not in {s.end for s in got}], [s.text for s in got]
