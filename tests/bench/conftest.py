"""bench/ is a folder of scripts, not a package: its modules are imported from there. Also a real
gateway on loopback for the load harness's smoke test."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def piper_gateway() -> Iterator[str]:
    """A real gateway with the English Piper voice on a loopback port, in a thread: http://HOST:PORT."""
    import uvicorn

    from engine import load_engine
    from gateway.app import Settings, create_app

    engine = load_engine("piper")
    port = _free_port()
    app = create_app(Settings(model="piper"), engine=engine)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, ws="websockets-sansio", log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    engine.close()
