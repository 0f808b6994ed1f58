"""A stream's first piece ends at its first Han clause (issue 14: Mandarin first audio): the cut in
engine/cpu/text.py, the audio of such a short piece, and a real gateway committing "好的，" first; and
auto's first piece cut at a word inside a long first clause ("今天下午"), spoken whole and first."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.segcases import load_cases, mandarin_deltas
from support.servers import serve
from support.wsclient import open_session

from engine.cpu.policy import DEFAULT
from engine.cpu.text import cost, first_clause_end, pieces
from engine.cpu.voice_config import VOICE_DEFAULT, VoiceConfig

REPLY = "好的，我来帮您安排。您周五晚上七点半在海港餐厅的四人桌已经订好了。"


@pytest.mark.parametrize(
    ("text", "first"),
    [
        (REPLY, "好的，"),
        ("你好，欢迎致电客服中心。请问有什么可以帮您？", "你好，"),
        ("雨大概晚上七点以后会停，明天天气晴朗，气温稍微低一点。", "雨大概晚上七点以后会停，"),
        ("他说：“明天见。”然后就挂了电话。", "他说："),
        ("Of course，我来查一下。", "Of course，"),  # two Latin words before a Han mark
        ("  好的，我明白了", "好的，"),
    ],
)
def test_the_first_piece_is_the_first_clause_and_the_rest_is_packed_as_before(text: str, first: str) -> None:
    out = list(pieces(text, 90, first=True))
    assert out[0] == first
    rest = text[text.index(first) + len(first) :]
    assert out[1:] == list(pieces(rest, 90))  # later pieces: the normal bound and packing
    assert "".join(out).replace(" ", "") == text.replace(" ", "")  # nothing lost or repeated


@pytest.mark.parametrize(
    "text",
    [
        "好，我来帮您安排。",  # one syllable: too short a run to sound like speech
        "OK，我们开始吧。",  # one Latin word
        "您的航班明天早上九点十五分出发。登机，在起飞前。",  # the first sentence has no clause mark
        "好的，。再见",  # nothing speakable after the mark in its sentence
        "好的，",  # the clause is the whole segment already
        "Sure, I can help with that. Then, more.",  # English keeps whole sentences
    ],
)
def test_no_early_cut_where_the_first_clause_would_not_stand_alone(text: str) -> None:
    assert first_clause_end(text, 90) == 0
    assert list(pieces(text, 90, first=True)) == list(pieces(text, 90))


def test_a_first_clause_longer_than_the_bound_is_cut_as_before() -> None:
    text = "根据您提供的信息我们已经为您查询了最近三个月的账单记录，其中有两笔费用存在异常。"
    assert first_clause_end(text, 60) == 0  # 27 Han characters cost 81
    out = list(pieces(text, 60, first=True))
    assert out == list(pieces(text, 60)) and all(cost(p) <= 60 for p in out)


def test_english_corpus_pieces_are_unchanged() -> None:
    for case in load_cases():
        if case.lang == "en":
            assert list(pieces(case.text, 120, first=True)) == list(pieces(case.text, 120)), case.id


def test_the_shortest_first_clause_is_the_voice_configs() -> None:
    assert first_clause_end(REPLY, 90, VoiceConfig(first_clause_syllables=3).first_clause_syllables) == 0
    assert first_clause_end(REPLY, 90, VOICE_DEFAULT.first_clause_syllables) == 3  # "好的，"
    with pytest.raises(ValueError, match="first_clause_syllables"):
        VoiceConfig(first_clause_syllables=-1)


def test_the_cut_looks_only_at_a_piece_bound_of_a_huge_segment() -> None:
    text = "好的，" + "我" * 200_000 + "。"
    assert first_clause_end(text, 90) == 3
    head, second = list(pieces(text, 90, first=True))[:2]
    assert head == "好的，" and cost(second) <= 90


def test_only_a_streams_first_segment_is_cut(cpu_engine: Any) -> None:
    voice = cpu_engine.voice(cpu_engine.default_voice("zh"))
    first = [p.text for p in cpu_engine.cut_pieces(voice, "zh", 0, REPLY)]
    later = [p.text for p in cpu_engine.cut_pieces(voice, "zh", 1, REPLY)]
    assert first[0] == "好的，" and later == list(pieces(REPLY, DEFAULT.piece_limit("kokoro")))
    assert [p.last for p in cpu_engine.cut_pieces(voice, "zh", 0, REPLY)][-1] is True


# The clauses the segmenter commits alone, and first pieces it cuts at a jieba word (reason "word").
@pytest.mark.parametrize("clause", ["好的，", "你好，", "他说：", "今天下午"])
def test_a_short_first_piece_is_speech_that_starts_and_ends_cleanly(cpu_engine: Any, clause: str) -> None:
    voice = cpu_engine.voice(cpu_engine.default_voice("zh"))
    runs = list(cpu_engine.synthesise(voice, "zh", clause, 1.0, threading.Event(), None))
    assert len(runs) == 1  # one model run: what the listener waits for
    audio, rate, _ = runs[0]  # with its word timings
    assert 0.3 < audio.size / rate < 1.6 * len(clause) / 3, audio.size / rate
    frames = audio[: audio.size // (rate // 100) * (rate // 100)].reshape(-1, rate // 100)  # 10 ms frames
    loud = np.sqrt((frames**2).mean(axis=1)) > 0.02
    assert loud.sum() * 0.01 > 0.25, "under 250 ms of speech"
    # The pads the silence trim leaves: the onset is not cut (it starts quiet) and neither is the tail
    # (the speech has decayed before the end, so the clause is not clipped mid-syllable).
    assert np.abs(audio[: rate // 100]).max() < 0.05
    assert np.abs(audio[-rate // 20 :]).max() < 0.05
    assert not loud[:2].any() and not loud[-5:].any()


@pytest.fixture(scope="module")
def zh_gateway(cpu_engine: Any) -> Iterator[str]:
    yield from serve(cpu_engine)


@pytest.mark.parametrize("granularity", ["auto", "clause"])
async def test_a_real_gateway_commits_and_speaks_the_first_clause_first(zh_gateway: str, granularity: str) -> None:
    text = "好的，我来帮您安排。"
    ws, ready = await open_session(zh_gateway, voice="jf_gongitsune", language="zh", split_granularity=granularity)
    assert ready["type"] == "session.ready", ready
    try:
        committed: list[dict[str, Any]] = []
        first_audio_after: int | None = None  # segments committed when the first audio came
        for d in mandarin_deltas(text, 0):
            await ws.send(json.dumps({"type": "input.text", "text": d}))
            await asyncio.sleep(0.02)
        await ws.send(json.dumps({"type": "input.done"}))
        audio = 0
        while True:
            m = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(m, bytes):
                if first_audio_after is None:
                    first_audio_after = len(committed)
                audio += len(m)
                continue
            ev = json.loads(m)
            assert ev["type"] != "error", ev
            if ev["type"] == "segment.committed":
                committed.append(ev)
            if ev["type"] == "session.done":
                break
        assert [c["text"] for c in committed] == ["好的，", "我来帮您安排。"]
        assert committed[0]["reason"] == "clause"
        assert first_audio_after is not None and audio / 2 / ready["sample_rate"] > 1.0
    finally:
        await ws.close()


async def test_a_real_gateway_cuts_a_long_first_clause_at_a_word_and_speaks_it_first(zh_gateway: str) -> None:
    """At 20 tokens a second with no clause end in sight, auto's first piece is the first words with 4 Han
    characters: the stream's first piece, spoken first (then the test barges in: the rest is not judged)."""
    ws, ready = await open_session(zh_gateway, voice="jf_gongitsune", language="zh", split_granularity="auto")
    assert ready["type"] == "session.ready", ready
    try:
        for token in ("今天", "下午", "可能", "会下", "雨", "。"):
            await ws.send(json.dumps({"type": "input.text", "text": token}))
            await asyncio.sleep(0.05)
        await ws.send(json.dumps({"type": "input.done"}))
        committed: list[dict[str, Any]] = []
        first_audio_after: int | None = None  # segments committed when the first audio came
        cancelled = False
        while True:
            m = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(m, bytes):
                if first_audio_after is None:
                    first_audio_after = len(committed)
            else:
                ev = json.loads(m)
                assert ev["type"] != "error", ev
                if ev["type"] == "segment.committed":
                    committed.append(ev)
                if ev["type"] in ("session.done", "audio.cancelled"):
                    break
            if first_audio_after is not None and len(committed) == 2 and not cancelled:
                cancelled = True  # both commits and the first audio are in: the rest is not judged
                await ws.send(json.dumps({"type": "input.cancel"}))
        assert [(c["text"], c["reason"]) for c in committed] == [("今天下午", "word"), ("可能会下雨。", "flush")]
        assert first_audio_after is not None
    finally:
        await ws.close()
