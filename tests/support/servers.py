"""A real gateway on loopback, in a thread, for tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from engine import Engine
from gateway.app import create_app
from gateway.connection import Limits
from gateway.server import server_config
from gateway.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(
    engine: Engine, limits: Limits | None = None, log_level: str = "warning", **settings: object
) -> Iterator[str]:
    """Yield "127.0.0.1:PORT" of a running gateway; stop it afterwards."""
    port = free_port()
    config = Settings(model="piper", limits=limits or Limits(), port=port, **settings)  # type: ignore[arg-type]
    app = create_app(config, engine=engine)
    server = uvicorn.Server(server_config(app, config, log_level=log_level))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
