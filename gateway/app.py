"""The Litestar app factory: routes, and the engine's lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from litestar import Litestar, Response, get, websocket
from litestar.connection import WebSocket
from litestar.datastructures import State

from engine import Engine, load_engine
from gateway import metrics
from gateway.connection import Connection
from gateway.openai_api import openai_routes
from gateway.settings import Settings
from segmentation import warm_up

log = logging.getLogger("voxgate")


@get("/health", sync_to_thread=False)
def health(state: State) -> Response[dict[str, str]]:
    if state.get("engine") is None:
        status = "failed" if state.get("engine_error") else "warming"
        return Response({"status": status, "detail": state.get("engine_error", "")}, status_code=503)
    return Response({"status": "ok", "model": state.settings.model})


@get("/metrics", sync_to_thread=False)
def metrics_endpoint() -> Response[bytes]:
    return Response(metrics.generate_latest(), media_type=metrics.CONTENT_TYPE_LATEST)


@websocket("/v1/audio/speech/stream")
async def speech_stream(socket: WebSocket) -> None:
    await socket.accept()
    engine: Engine | None = socket.app.state.get("engine")
    if engine is None:
        await socket.send_json(
            {"type": "error", "code": "engine_not_ready", "message": "the engine is warming up"}
        )
        await socket.close(code=1013)
        return

    async def send(data: bytes | str) -> None:
        if isinstance(data, bytes):
            await socket.send_bytes(data)
        else:
            await socket.send_text(data)

    conn = Connection(engine, socket.app.state.settings.limits, socket.receive, send, socket.close)
    try:
        await conn.run()
    finally:
        with contextlib.suppress(Exception):
            await socket.close()


def create_app(settings: Settings, engine: Engine | None = None) -> Litestar:
    """Build the app. With `engine` given, it is used as is (tests); otherwise `settings.model` is
    loaded in a thread at start-up and /health says 503 until it is warm."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.engine = engine
        task = None
        if engine is None:

            async def load() -> None:
                try:
                    await asyncio.to_thread(warm_up)
                    app.state.engine = await asyncio.to_thread(
                        load_engine, settings.model, **settings.engine_options
                    )
                    log.info("engine %r ready", settings.model)
                except Exception as e:  # reported on /health; the process stays up to say so
                    log.exception("engine %r failed to load", settings.model)
                    app.state.engine_error = f"{type(e).__name__}: {e}"

            task = asyncio.create_task(load())
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
            loaded = app.state.get("engine")
            if loaded is not None and engine is None:
                await asyncio.to_thread(loaded.close)

    return Litestar(route_handlers=[health, metrics_endpoint, speech_stream, *openai_routes], lifespan=[lifespan])
