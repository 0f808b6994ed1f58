"""Under `language: auto`, a segment with no letters is read in its utterance's language (issue 38 item 3).

"完成率：" | "12.5%。" was two segments, and the second, guessed alone, was read in English ("twelve point
five percent") in a Mandarin reply. A real gateway on loopback serves the real Piper engine behind a
proxy that records the text each stream is given: that text is what the listener hears.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support.recording import RecordingEngine
from support.servers import serve
from support.wsclient import open_session, until

from gateway.settings import Limits


@pytest.fixture(scope="module")
def recorded(piper_engine: Any) -> Iterator[tuple[str, RecordingEngine]]:
    engine = RecordingEngine(piper_engine)
    for addr in serve(engine, Limits(config_timeout=5.0)):  # type: ignore[arg-type]
        yield addr, engine


async def spoken(addr: str, engine: RecordingEngine, deltas: list[str], **config: Any) -> list[str]:
    """What the engine was given for one utterance fed as `deltas`."""
    engine.appended.clear()
    ws, _ = await open_session(addr, **({"language": "auto"} | config))
    async with ws:
        for d in deltas:
            await ws.send(json.dumps({"type": "input.text", "text": d}))
        await ws.send(json.dumps({"type": "input.done"}))
        events = await until(ws, "session.done", timeout=60)
    committed = [e["text"] for e in events if e["type"] == "segment.committed"]
    assert len(committed) >= 2, committed  # the case is about a segment read apart from the rest
    return list(engine.appended)


@pytest.mark.parametrize(
    ("deltas", "expected"),
    [
        (["完成率：12.5%。"], ["完成率：", "百分之十二点五。"]),
        (["要点如下：\n- 12.5%"], ["要点如下：", "百分之十二点五"]),
        (["会议时间：\n08:30"], ["会议时间：", "八点三十分"]),
    ],
)
async def test_a_segment_with_no_letters_is_read_in_its_utterances_language(
    recorded: tuple[str, RecordingEngine], deltas: list[str], expected: list[str]
) -> None:
    addr, engine = recorded
    assert await spoken(addr, engine, deltas, split_granularity="clause") == expected


async def test_an_english_reply_keeps_reading_its_numbers_in_english(recorded: tuple[str, RecordingEngine]) -> None:
    addr, engine = recorded
    got = await spoken(addr, engine, ["The completion rate:\n12.5%"], split_granularity="clause")
    assert got == ["The completion rate:", "twelve point five percent"]


async def test_a_named_language_is_kept(recorded: tuple[str, RecordingEngine]) -> None:
    addr, engine = recorded
    got = await spoken(addr, engine, ["完成率：\n12.5%"], split_granularity="clause", language="en")
    assert got[-1] == "twelve point five percent"


def test_the_speech_route_reads_a_segment_with_no_letters_in_its_requests_language(
    recorded: tuple[str, RecordingEngine],
) -> None:
    """POST /v1/audio/speech segments its input as a session does: the same rule."""
    addr, engine = recorded
    engine.appended.clear()
    body = json.dumps({"model": "piper", "input": "完成率：12.5%。", "voice": "joe", "response_format": "pcm"})
    req = urllib.request.Request(f"http://{addr}/v1/audio/speech", body.encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        r.read()  # Piper, an English voice, says nothing of the Han text: what it was given is the point
    assert engine.appended == ["完成率：", "百分之十二点五。"]
