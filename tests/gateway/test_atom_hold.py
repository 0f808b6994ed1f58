"""An LLM pause inside a number commits the text before it and holds the number (issue 38 item 1), on a
real gateway on loopback: `完成率12.` then a pause past the idle commit (1 s) sends `完成率` alone
(reason `timeout`); `12.` waits for `5%。` and is spoken whole. The engine is the real Piper engine
behind a proxy that records each stream's text (tests/support/recording.py)."""

from __future__ import annotations

import asyncio
import json
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


async def committed_within(ws: Any, seconds: float) -> list[dict[str, Any]]:
    """The segment.committed events that arrive within `seconds`."""
    out: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        try:
            m = await asyncio.wait_for(ws.recv(), left)
        except TimeoutError:
            break
        if isinstance(m, str) and (ev := json.loads(m))["type"] == "segment.committed":
            out.append(ev)
    return out


@pytest.mark.parametrize(
    ("head", "tail", "said", "held"),
    [
        ("完成率12.", "5%。", "完成率", "12.5%。"),
        ("时间08:", "30开始。", "时间", "08:30开始。"),
        ("Go to 127.0.", "0.1 now.", "Go to ", "127.0.0.1 now."),
    ],
)
async def test_a_pause_inside_a_number_holds_it_and_speaks_what_is_before(
    recorded: tuple[str, RecordingEngine], head: str, tail: str, said: str, held: str
) -> None:
    addr, engine = recorded
    engine.appended.clear()
    ws, _ = await open_session(addr, language="auto")
    async with ws:
        await ws.send(json.dumps({"type": "input.text", "text": head}))
        paused = await committed_within(ws, 2.0)  # the idle commit comes after 1 s
        assert [(e["text"], e["reason"]) for e in paused] == [(said, "timeout")]
        await ws.send(json.dumps({"type": "input.text", "text": tail}))
        await ws.send(json.dumps({"type": "input.done"}))
        events = await until(ws, "session.done", timeout=60)
    assert [e["text"] for e in events if e["type"] == "segment.committed"] == [held]
    assert len(engine.appended) == 2 and "." not in engine.appended[0]
