"""Admin `load` of a model whose engine process failed tries it again (docs/models.md): the failed engine
is closed and made anew, so a model whose files were fixed serves without a gateway restart. A real
gateway on loopback, the model's engine in a child process, the admin plane reached with its key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import open_session, utterance

from engine import Engine
from engine.qwen3 import make_tiny_checkpoint
from gateway.settings import ModelSpec

pytestmark = pytest.mark.slow
ADMIN = "retry-admin-secret"
TINY = {"max_streams": 1, "warm_up": False, "frames_per_token": 2.0, "min_frames": 6}


def admin(addr: str, method: str, path: str) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://{addr}{path}", b"" if method == "POST" else None, method=method,
                                 headers={"X-API-Key": ADMIN, "Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def wait_state(addr: str, name: str, wanted: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status, record = admin(addr, "GET", f"/v1/admin/models/{name}")
        assert status == 200, record
        if record["state"] == wanted:
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.1)


async def test_load_retries_a_model_whose_engine_process_failed(piper_engine: Engine, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()  # no config.json: its engine process fails to load it
    models = (ModelSpec(name="ckpt", path=str(ckpt), options=TINY),)
    key = hashlib.sha256(ADMIN.encode()).hexdigest()
    for addr in serve(piper_engine, model="piper,ckpt", models=models, admin_key=key):
        failed = await asyncio.to_thread(wait_state, addr, "ckpt", "failed")
        assert "config.json" in json.dumps(failed) or failed.get("error"), failed
        await asyncio.to_thread(make_tiny_checkpoint, ckpt)  # the files are fixed
        status, record = admin(addr, "POST", "/v1/admin/models/ckpt/load")
        assert status == 202 and record["state"] in ("warming", "ready"), record
        ready = await asyncio.to_thread(wait_state, addr, "ckpt", "ready")
        assert ready["pid"] is not None, ready
        ws, hello = await open_session(addr, model="ckpt", voice="ryan")
        assert hello["type"] == "session.ready", hello
        events, audio = await utterance(ws, "Loaded again.")
        assert events[-1]["type"] == "session.done" and audio, events
        await ws.close()
        # loaded now: a second load changes nothing
        assert admin(addr, "POST", "/v1/admin/models/ckpt/load")[1]["pid"] == ready["pid"]
