"""Shutdown is the gateway's: a SIGTERM to the whole process group (systemd's default KillMode, `tini -g`,
`kill -- -PGID`) reaches the engine children too, and they leave it to their parent: the utterance under
way finishes with all its audio, then the socket closes with 1012. Once the gateway is leaving, no engine
process is restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from support.servers import free_port
from support.wsclient import open_session

from engine.process import ProcessEngine, start_engine

pytestmark = pytest.mark.slow
SIX = " ".join(f"This is sentence number {n} of a long answer, spoken while the gateway is told to stop."
               for n in ("one", "two", "three", "four", "five", "six"))  # fmt: skip


def _healthy(addr: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """`voxgate serve --model piper` in a process group of its own (the group signal must not reach pytest)."""
    port = free_port()
    log = tmp_path / "gateway.log"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", "piper", "--port", str(port), "--drain-grace", "30"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=os.environ | {"PYTHONUNBUFFERED": "1"})  # fmt: skip
    addr = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _healthy(addr):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the gateway did not become healthy"
            time.sleep(0.2)
        yield proc, addr, log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


async def test_a_process_group_sigterm_lets_the_utterance_under_way_finish_with_its_audio(
    gateway: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    proc, addr, log = gateway
    ws, ready = await open_session(addr)
    assert ready["type"] == "session.ready", ready
    await ws.send(json.dumps({"type": "input.text", "text": SIX}))
    await ws.send(json.dumps({"type": "input.done"}))
    audio = len(await asyncio.wait_for(_first_audio(ws), 60))  # speaking: the engine child is busy
    os.killpg(os.getpgid(proc.pid), signal.SIGTERM)
    events: list[dict[str, object]] = []
    with pytest.raises(websockets.ConnectionClosed) as closed:
        while True:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, bytes):
                audio += len(message)
            else:
                events.append(json.loads(message))
    kinds = [e["type"] for e in events]
    print(f"\ngroup SIGTERM mid-utterance: {audio} audio bytes, then {kinds[-3:]}, close {closed.value.rcvd}")
    assert "error" not in kinds and kinds[-1] == "session.done", (events, log.read_text())
    assert audio > 300_000, audio  # six sentences at 22.05 kHz: about 0.9 MB (the review's control run)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012, closed.value
    assert proc.wait(30) == 0, log.read_text()
    assert "restart" not in log.read_text(), log.read_text()


async def test_an_engine_process_that_dies_during_the_drain_is_not_restarted(
    gateway: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    proc, addr, log = gateway
    ws, ready = await open_session(addr)
    assert ready["type"] == "session.ready", ready
    await ws.send(json.dumps({"type": "input.text", "text": SIX}))
    await ws.send(json.dumps({"type": "input.done"}))
    await asyncio.wait_for(_first_audio(ws), 60)
    (child,) = _children(proc.pid)
    proc.send_signal(signal.SIGTERM)  # the gateway alone: it drains while the utterance plays
    await asyncio.sleep(0.5)
    os.kill(child, signal.SIGKILL)
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            await asyncio.wait_for(ws.recv(), 60)
    assert proc.wait(30) == 0, log.read_text()
    said = log.read_text()
    assert said.count("started its process") == 1 and "restart 1" not in said, said
    assert "not restarted: the gateway is shutting down" in said, said


def _children(pid: int) -> list[int]:
    """The engine processes among `pid`'s children (of any of its threads; not multiprocessing's tracker)."""
    found = [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]
    return [c for c in found if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]


async def _first_audio(ws: websockets.ClientConnection) -> bytes:
    while not isinstance(message := await ws.recv(), bytes):
        pass
    return message


@pytest.fixture(scope="module")
def child() -> Iterator[ProcessEngine]:
    engine = start_engine("piper")
    try:
        engine.wait_ready(240)
        yield engine
    finally:
        engine.close()


def test_a_retired_engine_does_not_restart_a_child_that_dies(child: ProcessEngine) -> None:
    pid = child.pid
    assert pid is not None
    child.retire()  # the gateway began to drain
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while child.state == "ready":
        assert time.monotonic() < deadline, "the child's death was not seen"
        time.sleep(0.05)
    time.sleep(1.5)  # past the first back-off (0.5 s)
    assert child.state == "closed" and child.pid is None and child.restarts == 0, (child, child.last_error)
    assert "shutting down" in (child.last_error or ""), child.last_error


def test_the_engine_child_ignores_sigterm_and_sigint() -> None:
    engine = start_engine("piper")
    try:
        engine.wait_ready(240)
        pid = engine.pid
        assert pid is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            os.kill(pid, sig)
        time.sleep(1.0)
        assert engine.state == "ready" and engine.pid == pid and engine.restarts == 0, (engine, engine.last_error)
    finally:
        engine.close()
    assert not _alive(pid), "the child outlived its engine's close"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
