"""Two `voxgate serve` processes sharing one real Redis, as a deployment runs them: a voice registered
on A is used on B, a cancel posted to B stops a stream on A, a session started on A resumes on B after
A is killed with SIGKILL, and tenants stay apart across replicas."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
from support.servers import free_port
from support.wsclient import call, open_session, post, say, until, utterance

from sessions import hash_api_key

pytestmark = [pytest.mark.redis, pytest.mark.slow]
KEYS = f"acme={hash_api_key('acme-key')},beta={hash_api_key('beta-key')}"


def start_replica(redis_url: str, tmp: Path, model: str = "piper") -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", model, "--port", str(port),
           "--redis-url", redis_url, "--api-keys", KEYS]  # fmt: skip
    log = open(tmp / f"replica-{port}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc, f"127.0.0.1:{port}"
        except OSError:
            pass
        assert proc.poll() is None, (tmp / f"replica-{port}.log").read_text()
        assert time.monotonic() < deadline, "replica did not become healthy"
        time.sleep(0.2)


@pytest.fixture
def two_replicas(redis_server: Any, tmp_path: Path) -> Iterator[tuple[tuple[Any, str], tuple[Any, str]]]:
    a, b = start_replica(redis_server.url, tmp_path), start_replica(redis_server.url, tmp_path)
    yield a, b
    for proc, _ in (a, b):
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


async def test_replica_processes_share_voices_cancels_and_sessions(two_replicas: Any) -> None:
    (proc_a, a), (_, b) = two_replicas
    assert call(a, "POST", "/v1/audio/voices", "acme-key", {"voice_id": "agent", "base_voice": "joe"})[0] == 201

    # A voice registered on A is used on B.
    ws, ready = await open_session(b, "acme-key", voice="agent")
    assert ready["type"] == "session.ready" and ready["voice"] == "agent"
    assert (await say(ws, "Registered on the other replica."))[-1]["type"] == "session.done"
    await ws.close()

    # A cancel posted to B stops a stream held by A.
    ws, ready = await open_session(a, "acme-key")
    long = " ".join(f"Sentence number {i} of a long answer." for i in range(40))
    await ws.send(json.dumps({"type": "input.text", "text": long}))
    await ws.send(json.dumps({"type": "input.done"}))
    while not isinstance(await asyncio.wait_for(ws.recv(), 30), bytes):
        pass
    assert post(b, f"/v1/sessions/{ready['session_id']}/cancel", "beta-key")[0] == 404  # another tenant
    assert post(b, f"/v1/sessions/{ready['session_id']}/cancel", "acme-key")[0] == 202
    assert (await until(ws, "audio.cancelled"))[-1]["utterance_index"] == 0
    assert (await say(ws, "One more turn on A."))[-1]["utterance_index"] == 1

    # A dies without a goodbye; the session resumes on B where it left off.
    proc_a.send_signal(signal.SIGKILL)
    proc_a.wait(10)
    ws2, resumed = await open_session(b, "acme-key", session_id=ready["session_id"])
    assert resumed["type"] == "session.ready" and resumed["resumed"] and resumed["next_utterance_index"] == 2
    _, other = await open_session(b, "beta-key", session_id=ready["session_id"])
    assert other["code"] == "session_not_found"  # tenants stay apart across replicas
    assert (await say(ws2, "Resumed on B."))[-1]["utterance_index"] == 2
    await ws2.close()


async def test_a_voice_cloned_on_one_replica_speaks_on_another(redis_server: Any, tmp_path: Path) -> None:
    """The registry keeps the reference clip, not an engine's embedding: B's engine makes the voice from
    the clip A registered (two `--model tiny-base` processes, one Redis)."""
    t = np.arange(36000) / 24000
    buf = io.BytesIO()
    soundfile.write(buf, (0.3 * np.sin(2 * np.pi * 170 * t)).astype(np.float32), 24000, format="WAV")
    replicas = [start_replica(redis_server.url, tmp_path, "tiny-base") for _ in range(2)]
    try:
        (_, a), (_, b) = replicas
        body = {"voice_id": "alice", "ref_audio": base64.b64encode(buf.getvalue()).decode(), "ref_text": "Hello."}
        assert call(a, "POST", "/v1/audio/voices", "acme-key", body)[0] == 201
        ws, ready = await open_session(b, "acme-key", voice="alice")
        assert ready["type"] == "session.ready", ready
        events, audio = await utterance(ws, "Spoken in a voice cloned on the other replica.")
        assert events[-1]["type"] == "session.done" and sum(map(len, audio)) > 2 * 1920, events[-1]
        await ws.close()
        ws, ready = await open_session(b, "beta-key", voice="alice")  # another tenant has no such voice
        assert ready["type"] == "error", ready
        await ws.close()
    finally:
        for proc, _ in replicas:
            proc.terminate()
            proc.wait(10)
