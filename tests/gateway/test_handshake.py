"""A replica that cannot take a session refuses it before the WebSocket upgrade: HTTP 503, `Retry-After`
and the reason's code, so a balancer can retry it elsewhere (gateway/handshake.py). The policy with its
inputs given; the refusal from a real `voxgate serve --model synthetic` through a real websockets client."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from support.replicas import Replica
from support.wsclient import open_session, refused_at_handshake

import voxgate_client
from gateway import cli
from gateway.handshake import DRAINING, FULL, NOT_READY, SessionCount, refusal
from gateway.settings import load_settings


def test_the_reasons_in_their_order() -> None:
    assert refusal(serving=True, draining=False, open_sessions=5, max_sessions=0) is None  # 0: no bound
    assert refusal(serving=True, draining=False, open_sessions=1, max_sessions=2) is None
    assert refusal(serving=True, draining=False, open_sessions=2, max_sessions=2) is FULL
    assert refusal(serving=True, draining=True, open_sessions=2, max_sessions=2) is DRAINING
    assert refusal(serving=False, draining=True, open_sessions=2, max_sessions=2) is NOT_READY
    assert [r.code for r in (FULL, DRAINING, NOT_READY)] == ["replica_full", "draining", "engine_not_ready"]
    assert dict(FULL.headers())[b"retry-after"] == b"1"
    assert json.loads(FULL.body())["error"]["code"] == "replica_full"
    with pytest.raises(ValueError):
        SessionCount(-1)


def test_max_sessions_comes_from_the_file_the_environment_and_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "voxgate.toml"
    config.write_text("max_sessions = 3\n")
    assert load_settings(config, env={}).max_sessions == 3
    assert load_settings(config, env={"VOXGATE_MAX_SESSIONS": "5"}).max_sessions == 5
    assert load_settings(config, env={"VOXGATE_MAX_SESSIONS": "5"}, max_sessions=7).max_sessions == 7
    assert load_settings(config, env={}, max_sessions=None).max_sessions == 3  # a flag not given: the file's


def test_a_bad_max_sessions_flag_stops_serve_before_it_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--model", "synthetic", "--max-sessions", "-1"]) == 2
    assert "max_sessions" in capsys.readouterr().err


@pytest.fixture(scope="module")
def two_seats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    logdir = Path(tmp_path_factory.mktemp("handshake"))
    config = logdir / "voxgate.toml"
    config.write_text("max_sessions = 9\ndrain_grace_s = 5\n[engine_options]\nspeed = 8.0\nfirst_audio_s = 0.02\n")
    # The flag wins over the file (as over VOXGATE_MAX_SESSIONS): two seats.
    replica = Replica("", logdir, "--config", str(config), "--max-sessions", "2", model="synthetic").spawn()
    try:
        replica.wait_healthy(60)
        yield replica
    finally:
        replica.kill()


async def test_a_full_replica_refuses_at_the_handshake_and_takes_the_next_once_one_leaves(two_seats: Replica) -> None:
    addr = two_seats.addr
    held = [await open_session(addr, voice="synthetic") for _ in range(2)]
    try:
        assert all(ready["type"] == "session.ready" for _, ready in held), held
        status, retry_after, body = await refused_at_handshake(addr)
        assert (status, retry_after) == (503, "1") and body["error"]["code"] == "replica_full", body
        with pytest.raises(voxgate_client.Refused) as e:  # the Python client says so in its terms
            await voxgate_client.connect(addr, voice="synthetic")
        assert (e.value.status, e.value.code, e.value.retry_after_s) == (503, "replica_full", 1.0)
        await held.pop()[0].close()
        for _ in range(50):  # the server sees the close within a few ms
            try:
                ws, ready = await open_session(addr, voice="synthetic")
                break
            except websockets.InvalidStatus:
                await asyncio.sleep(0.02)
        assert ready["type"] == "session.ready", ready
        held.append((ws, ready))
    finally:
        for ws, _ in held:
            await ws.close()


async def test_a_draining_replica_refuses_at_the_handshake(two_seats: Replica) -> None:
    """Last in this module: the replica drains and exits."""
    assert two_seats.proc is not None
    ws, ready = await open_session(two_seats.addr, voice="synthetic")  # keeps the drain from ending at once
    assert ready["type"] == "session.ready"
    await ws.send(json.dumps({"type": "input.text", "text": "An utterance under way while the replica drains."}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 10), bytes):  # it is speaking
        pass
    two_seats.proc.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    status, retry_after, body = await refused_at_handshake(two_seats.addr)
    assert (status, retry_after) == (503, "1") and body["error"]["code"] == "draining", body
    await ws.close()
