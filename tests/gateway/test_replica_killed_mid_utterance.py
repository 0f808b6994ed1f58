"""Issue 13, finding 10: a replica killed (SIGKILL) while an utterance's audio is going out. Before, that
utterance left nothing in the spoken log and the replica resuming the session reused its index. Now the
utterance is logged as started when its engine stream opens (write-behind, before its audio), so the
resume goes on after it and the log names it as started but unfinished."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from support.wsclient import open_session, utterance

from sessions import SessionStore

from .test_replica_processes import start_replica

pytestmark = [pytest.mark.redis, pytest.mark.slow]

LONG = " ".join(f"Sentence number {i} of a long answer that is cut off by a crash." for i in range(40))


async def test_a_resume_after_a_replica_dies_mid_utterance_goes_on_after_it(redis_server: Any, tmp_path: Path) -> None:
    (proc_a, a), (proc_b, b) = start_replica(redis_server.url, tmp_path), start_replica(redis_server.url, tmp_path)
    try:
        ws, ready = await open_session(a, "acme-key")
        sid = ready["session_id"]
        events, _ = await utterance(ws, "A first, finished reply.")
        assert events[-1]["type"] == "session.done" and events[-1]["utterance_index"] == 0, events[-1]
        await ws.send(json.dumps({"type": "input.text", "text": LONG}))
        await ws.send(json.dumps({"type": "input.done"}))
        while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
            pass  # utterance 1's audio is going out
        proc_a.send_signal(signal.SIGKILL)
        proc_a.wait(10)

        ws2, resumed = await open_session(b, "acme-key", session_id=sid)
        assert resumed["type"] == "session.ready" and resumed["resumed"], resumed
        assert resumed["next_utterance_index"] == 2, resumed  # not 1: that index was spoken (in part) on A
        async with SessionStore.from_url(redis_server.url) as store:
            rec = await store.load_session("acme", sid)
        assert rec is not None
        assert [(e.utterance_index, e.finished, e.cancelled) for e in rec.spoken] == [
            (0, True, False), (1, False, False),
        ], rec.spoken
        assert rec.spoken[0].text == "A first, finished reply." and rec.spoken[1].text == ""
        events, audio = await utterance(ws2, "Resumed on the other replica.")
        assert events[-1]["type"] == "session.done" and events[-1]["utterance_index"] == 2 and audio
        await ws2.close()
    finally:
        for proc in (proc_a, proc_b):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
