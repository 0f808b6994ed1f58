"""A long Mandarin run with no mark is cut at jieba words as it streams (issue 14: `no-punct`, a reply's
45-character sentence with no comma, was committed only once it had all come, and gapped under load).
`auto` and `clause` cut the pending text once `run_cut_han + run_cut_look` (16 + 8) Han characters of a
run have come with no mark among them, at the last word boundary within the run's first 16."""

from __future__ import annotations

import itertools
import re

import jieba
import pytest

from segmentation import Segment, StreamSegmenter, jieba_pysbd

HAN = re.compile(r"[\u4e00-\u9fff]")
TOKEN = re.compile(r"[\u4e00-\u9fff]{1,2}|\s*[A-Za-z0-9'.%]+|.", re.S)  # a Mandarin LLM's tokens, as in bench/load.py
NO_PUNCT = "我们的系统会自动根据您的使用习惯推荐最合适的套餐方案并在每个月初发送详细的账单说明给您"
LONG = "根据您提供的信息我们已经为您查询了最近三个月的所有账单记录并发现其中有两笔重复扣款的情况需要处理。"
CLITICS = "的地得了着过吗呢吧啊呀么"


def stream(text: str, granularity: str = "auto", **policy: object) -> list[tuple[float, Segment]]:
    """Feed `text` a token every 50 ms (20 tokens/s) on a fake clock; each segment with the clock at
    its commit, the flush's included."""
    now = [0.0]
    seg = StreamSegmenter("zh", granularity, clock=lambda: now[0], **policy)
    out: list[tuple[float, Segment]] = []
    for i, token in enumerate(TOKEN.findall(text)):
        now[0] = i * 0.05
        out += [(now[0], s) for s in seg.feed(token)]
    out += [(now[0], s) for s in seg.flush()]
    assert "".join(s.text for _, s in out) == text
    return out


def still(text: str, deltas: list[str], granularity: str = "auto", **policy: object) -> list[Segment]:
    """The segments of `deltas` on a still clock (no first-piece cut: it needs time to pass)."""
    seg = StreamSegmenter("zh", granularity, clock=lambda: 0.0, **policy)
    out = [s for d in deltas for s in seg.feed(d)] + seg.flush()
    assert "".join(s.text for s in out) == text
    return out


def han(text: str) -> int:
    return len(HAN.findall(text))


def test_a_long_run_goes_in_pieces_while_it_streams() -> None:
    got = stream(NO_PUNCT)
    last_token_at = (len(TOKEN.findall(NO_PUNCT)) - 1) * 0.05
    assert [s.reason for _, s in got] == ["word", "word", "flush"]
    assert got[0][1].text == "我们的系统"  # the first piece's own cut (test_first_word_cut.py)
    # The run's pieces go while the LLM is still writing it: a second of text sooner than at its end.
    assert got[1][0] <= last_token_at - 0.3
    for _, s in got[1:-1]:
        assert han(s.text) <= 16 + (s.text[-1] in CLITICS)  # 会自动根据您的使用习惯推荐最合适 + 的
        assert s.end in {s.start + e for _, _, e in jieba.tokenize(NO_PUNCT[s.start : s.end + 8])}


def test_off_the_run_waits_for_its_end() -> None:
    got = stream(NO_PUNCT, run_cut_han=0)
    assert [s.text for _, s in got] == ["我们的系统", NO_PUNCT[len("我们的系统") :]]


MIXED = "我用Python写了一个脚本然后每天早上自动检查服务器的日志并且把异常情况发邮件通知运维同事。"


@pytest.mark.parametrize("text", [NO_PUNCT, LONG, MIXED])
@pytest.mark.parametrize("granularity", ["auto", "clause"])
def test_the_pieces_do_not_depend_on_the_chop(text: str, granularity: str) -> None:
    one = still(text, [text], granularity)
    assert any(s.reason == "word" for s in one)
    assert still(text, list(text), granularity) == one
    assert still(text, TOKEN.findall(text), granularity) == one
    assert still(text, [text[i : i + 5] for i in range(0, len(text), 5)], granularity) == one


def test_each_piece_keeps_at_least_the_look_for_the_next_and_the_pieces_double() -> None:
    for text in (NO_PUNCT, LONG, NO_PUNCT + "。" + LONG, NO_PUNCT * 4):
        segs = still(text, [text])
        cuts = 0
        for s, nxt in itertools.pairwise(segs):
            if s.reason == "word":
                assert han(s.text) <= (16 << cuts) + (s.text[-1] in CLITICS)  # 16, 32, 64 ...: a ramp
                assert han(nxt.text) >= 8  # never a stub of a word or two left behind
                cuts += 1


def test_a_long_run_ramps_up_to_max_chars() -> None:
    text = NO_PUNCT * 20  # 860 Han characters with no mark
    sizes = [(han(s.text), s.reason) for s in still(text, [text])]
    # About 16, 32, 64, 128, 256 (the last word boundary within each); then max_chars (300) cuts.
    assert [(n + 4) // 8 for n, _ in sizes[:5]] == [2, 4, 8, 16, 32]
    assert [r for _, r in sizes] == ["word"] * 5 + ["forced"] + ["flush"]
    # A flood of Mandarin with no mark is as many segments as max_chars makes, not one per 16 characters.
    flood = NO_PUNCT * 1000
    assert len(still(flood, [flood])) <= len(flood) // 300 + 8


def test_a_particle_goes_with_the_word_before_it() -> None:
    # The run's 16th character ends 查询, and 了 comes after it: the cut moves past 了.
    segs = still(LONG, [LONG])
    assert segs[0].text == "根据您提供的信息我们已经为您查询了"
    for s in segs[:-1]:
        assert s.text[-1] in CLITICS or LONG[s.end] not in CLITICS


def test_a_word_that_starts_with_a_particle_is_not_one() -> None:
    # 以后|的确|已经: the run's 16th character is 的 of 的确 (a word, "indeed"), so the cut falls before it.
    text = "这个方案我们大家都仔细讨论以后的确已经考虑过很多次了并且每次都认真讨论过所有细节"
    assert still(text, [text])[0].text == "这个方案我们大家都仔细讨论以后"


@pytest.mark.parametrize(
    ("text", "granularity", "language", "policy"),
    [
        (NO_PUNCT, "sentence", "zh", {}),  # whole sentences, as asked
        (NO_PUNCT, "auto", "en", {}),  # an English session does not cut Han text at words
        (NO_PUNCT, "auto", "zh", {"run_cut_han": 0}),
        # A mark ends a run: each run here is under 24 Han characters, and auto's clause rule decides.
        ("您周五晚上七点半的四人桌已经订好了，确认信息已经发到您的邮箱。", "auto", "zh", {}),
        ("Our system recommends the most suitable plan for your usage and sends a detailed bill each month "
         "without any punctuation at all in this long English sentence", "auto", "zh", {}),
    ],
)
def test_no_run_cut(text: str, granularity: str, language: str, policy: dict[str, object]) -> None:
    seg = StreamSegmenter(language, granularity, clock=lambda: 0.0, **policy)
    assert all(s.reason != "word" for s in seg.feed(text) + seg.flush())


def test_a_run_with_no_word_boundary_waits_for_max_chars_and_asks_jieba_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def one_word(run: str) -> list[int]:  # a run jieba finds no word boundary in
        calls.append(run)
        return [len(run)]

    monkeypatch.setattr(jieba_pysbd, "jieba_cuts", one_word)
    text = "甲" * 60
    seg = StreamSegmenter("zh", "auto", clock=lambda: 0.0, max_chars=48)
    got = [s for c in text for s in seg.feed(c)] + seg.flush()
    assert [(s.reason, len(s.text)) for s in got] == [("forced", 48), ("flush", 12)]
    # Asked when the run's 24th character came, then not again for that run until the forced cut.
    assert len([r for r in calls if len(r) <= 24]) == 1


def test_the_policy_is_checked() -> None:
    with pytest.raises(ValueError):
        StreamSegmenter(run_cut_han=-1)
    with pytest.raises(ValueError):
        StreamSegmenter(run_cut_look=0)
