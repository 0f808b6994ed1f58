"""A real gateway on loopback, in a thread, for tests."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping

from engine import Engine
from gateway.app import create_app
from gateway.connection import Limits
from gateway.models import EngineFactory
from gateway.server import GatewayServer, server_config
from gateway.settings import Settings
from support.http import free_port


def serve(
    engine: Engine | None, limits: Limits | None = None, log_level: str = "warning", *,
    engines: Mapping[str, Engine] | None = None, factory: EngineFactory | None = None, **settings: object,
) -> Iterator[str]:
    """Yield "127.0.0.1:PORT" of a running gateway; stop it afterwards. `engine` serves the default model
    ("piper" unless `model=` says otherwise); `engines` more models by name (`model="a,b"` names them all,
    or `models=` gives their specs); `factory` makes those not given (gateway/models.py)."""
    port = free_port()
    settings.setdefault("model", "piper")
    # A test's server is a developer's loopback one: its admin plane and /metrics answer direct loopback
    # callers without a key. Tests of the admin plane's rules say admin_open_loopback=False.
    settings.setdefault("admin_open_loopback", True)
    # The first-audio SLO is off unless a test turns it on: on a shared box the voice's measured capacity
    # falls with the load, and the SLO would rightly refuse what a test means to serve (its own tests set it).
    settings.setdefault("first_audio_slo_s", 0.0)
    config = Settings(limits=limits or Limits(), port=port, **settings)  # type: ignore[arg-type]
    app = create_app(config, engine=engine, engines=engines, **({} if factory is None else {"factory": factory}))
    with running(GatewayServer(server_config(app, config, log_level=log_level), config.admin_socket)):
        deadline = time.monotonic() + 120
        while any(h.state == "warming" for h in app.state.models):  # the models not given load in the background
            assert time.monotonic() < deadline, "a model did not warm up"
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def running(server: GatewayServer) -> Iterator[GatewayServer]:
    """`server` running in a thread while the block runs (yielded once it has started), stopped after."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)
