"""The agent-framework tier (`pytest -m clients`, run in .venv-clients, which has the real Pipecat and
LiveKit Agents from the package registry and no server): a real voxgate gateway serves the Piper voice
from the project's own venv in a subprocess, and the frameworks speak through it on loopback.

Outside that run (no `-m clients`) these files are not even collected: the default venv has neither
framework, and this tier must fail, not skip, where one is missing.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from processes import stop

ROOT = Path(__file__).resolve().parents[3]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if "clients" not in (config.getoption("markexpr") or ""):
        return True
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def voxgate_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's log: uvicorn writes a line per WebSocket it accepts (`Server.accepted` counts them)."""
    return tmp_path_factory.mktemp("server") / "server.log"


@pytest.fixture(scope="session")
def voxgate_server(voxgate_log: Path) -> Iterator[str]:
    """`voxgate serve --model piper` on a free loopback port ("127.0.0.1:PORT"), from the project's venv
    (VOXGATE_SERVER_PYTHON; default .venv/bin/python) and checkout (VOXGATE_SERVER_ROOT; default this one),
    for the whole run. Its /metrics answer loopback callers (a developer's server): tests read its counters."""
    python = os.environ.get("VOXGATE_SERVER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    root = os.environ.get("VOXGATE_SERVER_ROOT", str(ROOT))
    port = free_port()
    log = voxgate_log.open("w")
    env = os.environ | {"VOXGATE_ADMIN_OPEN_LOOPBACK": "true"}
    proc = subprocess.Popen([python, "-m", "gateway.cli", "serve", "--model", "piper", "--port", str(port)],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 180  # a cold start on a loaded 2-core box
        while True:
            assert proc.poll() is None, f"the server exited ({proc.returncode}); see {log.name}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the server did not come up; see {log.name}"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc, grace_s=15)
        log.close()
        print(f"voxgate server log: {log.name}", file=sys.stderr)


AUDIO_BYTES = "voxgate_audio_bytes_total"  # what the server has sent to its clients


@dataclass
class Server:
    """What a test reads of the running server: its address, the sockets it accepted, its counters."""

    addr: str  # "127.0.0.1:PORT"
    log: Path

    def accepted(self, path: str) -> int:
        """How many WebSockets on `path` (a prefix of the request's path) the server has accepted so far."""
        return sum(1 for line in self.log.read_text().splitlines()
                   if "[accepted]" in line and f'"WebSocket {path}' in line)  # fmt: skip

    def metric(self, name: str) -> float:
        """A counter or gauge of /metrics (summed over its labels)."""
        with urllib.request.urlopen(f"http://{self.addr}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name) and line[len(name)] in " {")  # fmt: skip

    async def audio_settles(self, quiet_s: float = 1.5, within_s: float = 10.0) -> float:
        """Seconds from now until the server's last audio byte to any client, seen once it has sent none
        for `quiet_s` (fails past `within_s`): how long a cut stream's audio went on at the server."""
        t0 = time.monotonic()
        last, changed = await asyncio.to_thread(self.metric, AUDIO_BYTES), t0
        while (now := time.monotonic()) - changed < quiet_s:
            assert now - t0 < within_s + quiet_s, f"the server still sends audio {now - t0:.1f} s on"
            await asyncio.sleep(0.1)
            if (sent := await asyncio.to_thread(self.metric, AUDIO_BYTES)) != last:
                last, changed = sent, time.monotonic()
        return round(changed - t0, 2)


@pytest.fixture
def voxgate(voxgate_server: str, voxgate_log: Path) -> Server:
    return Server(voxgate_server, voxgate_log)


@pytest.fixture
async def http_session() -> AsyncIterator[object]:
    """The aiohttp session a LiveKit plugin is given (outside a LiveKit job it has none of its own). aiohttp
    is imported here: the default venv loads this file (to skip the tier) and has none."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        yield session
