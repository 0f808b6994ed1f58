"""A real gateway (Piper voice) with the playground routes, on a loopback port, in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from litestar import Litestar


def with_playground(app: Litestar) -> Litestar:
    """Register the playground on an app that does not serve it yet (the app factory may already)."""
    from gateway.playground import playground_routes

    if not any(route.path == "/" for route in app.routes):
        for handler in playground_routes:
            app.register(handler)
    return app


@pytest.fixture(scope="module")
def playground_server() -> Iterator[str]:
    import uvicorn

    from engine import load_engine
    from gateway.app import Settings, create_app

    engine = load_engine("piper")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = with_playground(create_app(Settings(model="piper"), engine=engine))
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
