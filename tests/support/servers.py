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
from gateway.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(engine: Engine, limits: Limits | None = None, **settings: object) -> Iterator[str]:
    """Yield "127.0.0.1:PORT" of a running gateway; stop it afterwards."""
    port = free_port()
    app = create_app(Settings(model="piper", limits=limits or Limits(), **settings), engine=engine)  # type: ignore[arg-type]
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
