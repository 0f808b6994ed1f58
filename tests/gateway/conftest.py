from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn

from engine import Engine, load_engine
from gateway.app import create_app
from gateway.connection import Limits
from gateway.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def cpu_engine() -> Iterator[Engine]:
    engine = load_engine("piper")  # the fastest real voice: English Piper joe
    yield engine
    engine.close()


def serve(engine: Engine, limits: Limits) -> Iterator[str]:
    port = free_port()
    app = create_app(Settings(model="piper", limits=limits), engine=engine)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, ws="websockets-sansio", log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def gateway(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=2.0))
