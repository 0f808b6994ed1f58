"""The agent-framework tier (`pytest -m clients`, run in .venv-clients, which has the real Pipecat and
LiveKit Agents from the package registry and no server): a real voxgate gateway serves the Piper voice
from the project's own venv in a subprocess, and the frameworks speak through it on loopback.

Outside that run (no `-m clients`) these files are not even collected: the default venv has neither
framework, and this tier must fail, not skip, where one is missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

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
def voxgate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`voxgate serve --model piper` on a free loopback port ("127.0.0.1:PORT"), from the project's venv
    (VOXGATE_SERVER_PYTHON; default .venv/bin/python) and checkout (VOXGATE_SERVER_ROOT; default this one),
    for the whole run."""
    python = os.environ.get("VOXGATE_SERVER_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
    root = os.environ.get("VOXGATE_SERVER_ROOT", str(ROOT))
    port = free_port()
    log = (tmp_path_factory.mktemp("server") / "server.log").open("w")
    proc = subprocess.Popen([python, "-m", "gateway.cli", "serve", "--model", "piper", "--port", str(port)],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
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
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        print(f"voxgate server log: {log.name}", file=sys.stderr)
