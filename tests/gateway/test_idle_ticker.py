"""Idle commits (issue 37): every socket's idle check shares one timer per process (gateway/ticker.py), and a
socket with no utterance open arms none. The commit still comes after the segmenter's idle time, against a
real gateway over real WebSockets; the server loop's timers are counted with 256 idle sockets open."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.http import free_port
from support.servers import running
from support.wsclient import open_session

from engine import Engine
from gateway.app import create_app
from gateway.server import GatewayServer, server_config
from gateway.settings import Limits, Settings
from gateway.ticker import Ticker


def due_soon(loop: asyncio.AbstractEventLoop, within: float) -> int:
    """Timers of `loop` that fire within `within` seconds: what an idle socket's wake-ups would show as."""
    horizon = loop.time() + within
    return sum(1 for h in list(loop._scheduled) if not h.cancelled() and h.when() <= horizon)  # type: ignore[attr-defined]


async def test_many_waiters_share_one_timer_and_a_cancelled_one_leaves_the_others_waking() -> None:
    loop = asyncio.get_running_loop()
    ticker = Ticker(0.05, loop)
    before = due_soon(loop, 1.0)
    waiters = [asyncio.ensure_future(ticker.wait()) for _ in range(256)]
    await asyncio.sleep(0)
    assert ticker.armed and due_soon(loop, 1.0) - before == 1
    waiters[0].cancel()
    async with asyncio.timeout(10):
        await asyncio.gather(*waiters[1:])
    assert waiters[0].cancelled() and not ticker.armed  # fired once, and nobody waits: no timer left


@pytest.fixture(scope="module")
def served(cpu_engine: Engine) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """A gateway in a thread, and its event loop (to count its timers)."""
    port = free_port()
    # The reader's Deadline keeps one timer per socket, due at `config_timeout` and then at `idle_timeout`:
    # long enough here that it is not among the timers due soon that the idle-sockets test counts.
    # asyncio's loop, whatever is installed: its timers are counted from the loop's own heap.
    config = Settings(limits=Limits(config_timeout=60.0), port=port, model="piper", admin_open_loopback=True,
                      first_audio_slo_s=0.0, event_loop="asyncio")  # fmt: skip
    server = GatewayServer(server_config(create_app(config, engine=cpu_engine), config, log_level="warning"))
    with running(server):
        yield f"127.0.0.1:{port}", server.servers[0].get_loop()


async def test_text_left_open_is_committed_after_the_idle_time(served: tuple[str, asyncio.AbstractEventLoop]) -> None:
    addr, _ = served
    ws, ready = await open_session(addr)
    assert ready["type"] == "session.ready", ready
    try:
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "input.text", "text": "Hello there, this tail has no full stop "}))
        committed = ""
        async with asyncio.timeout(30):
            while "no full stop" not in committed:  # its head may go at once (a first cut); its tail waits
                m = await ws.recv()
                if isinstance(m, str) and (ev := json.loads(m))["type"] == "segment.committed":
                    committed += ev["text"]
        # the tail committed by the poller (no input.done came), once the segmenter's 1 s idle time passed
        assert time.monotonic() - t0 >= 0.9, committed
    finally:
        await ws.close()


async def test_idle_sockets_arm_no_timer_each(served: tuple[str, asyncio.AbstractEventLoop]) -> None:
    addr, loop = served
    baseline = due_soon(loop, 2.0)
    sockets: list[Any] = []
    try:
        for _ in range(256):
            ws, ready = await open_session(addr)
            assert ready["type"] == "session.ready", ready
            sockets.append(ws)
        await asyncio.sleep(0.3)  # every socket between turns, its poller asleep
        # Before: each idle socket's poller woke every second on its own timer (256 timers due within 2 s).
        assert due_soon(loop, 2.0) - baseline < 32, due_soon(loop, 2.0)
    finally:
        for ws in sockets:
            with contextlib.suppress(Exception):
                await ws.close()
