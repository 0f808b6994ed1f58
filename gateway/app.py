"""The Litestar app factory: routes, and the lifespan of the engine and the session store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from litestar import Litestar, Response, get, post, websocket
from litestar.connection import WebSocket
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath

from engine import Engine, load_engine
from gateway import metrics
from gateway.admission import Admission
from gateway.auth import authenticate
from gateway.batch import batch_routes
from gateway.connection import Connection
from gateway.dependencies import DEPENDENCIES
from gateway.drain import DRAIN_REASON, Drain
from gateway.errors import EXCEPTION_HANDLERS, ApiError
from gateway.openai_api import openai_routes
from gateway.playground import playground_routes
from gateway.protocol import CLOSE_POLICY, CLOSE_RECONNECT, CLOSE_TRY_LATER, encode, error_event
from gateway.request_id import request_id_middleware
from gateway.session_state import SessionBinding
from gateway.settings import Settings
from gateway.voices import voice_routes
from segmentation import warm_up
from sessions import InvalidId, SessionNotFound, SessionStore, StoreSettings, Tenant

log = logging.getLogger("voxgate")


@get("/health")
async def health(state: State) -> Response[dict[str, str]]:
    """200 once the engine is warm (the contract); "degraded" while the state store's circuit is open.
    Answered from state alone, never waiting on Redis (the store's heartbeat keeps its view current), and
    unauthenticated: `detail` is a short stable phrase, never an address or an exception's text (the
    server's log has those)."""
    if state.get("engine") is None:
        failed = bool(state.get("engine_error"))
        detail = "the engine failed to load" if failed else "the engine is loading"
        return Response({"status": "failed" if failed else "warming", "detail": detail}, status_code=503)
    if state.drain.draining:  # a balancer's health check takes the replica out of rotation
        return Response({"status": "draining", "detail": "the server is draining"}, status_code=503)
    store: SessionStore = state.store
    h = store.health()
    body = {"status": "ok" if h.status == "ok" else "degraded", "model": state.settings.model, "state": h.backend}
    if h.error:
        body["detail"] = h.error
    return Response(body)


@post("/v1/sessions/{session_id:str}/cancel", status_code=202)
async def cancel_session(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], session_id: FromPath[str]
) -> Response[dict[str, object]]:
    """Barge-in from anywhere: the replica holding the session's socket cancels within a cycle."""
    try:
        reached = await store.publish_cancel(tenant.name, session_id)
    except (SessionNotFound, InvalidId):  # a malformed id names no session either
        raise ApiError(f"no session {session_id[:128]!r}", code="session_not_found", status=404) from None
    return Response({"session_id": session_id, "cancelled": True, "replicas": reached}, status_code=202)


@get("/metrics", sync_to_thread=False)
def metrics_endpoint(state: State) -> Response[bytes]:
    return Response(metrics.render(state.get("admission")), media_type=metrics.CONTENT_TYPE_LATEST)


@websocket("/v1/audio/speech/stream")
async def speech_stream(
    socket: WebSocket, state: State, store: NamedDependency[SessionStore], settings: NamedDependency[Settings],
    admission: NamedDependency[Admission | None],
) -> None:
    await socket.accept()
    # Not the `engine` dependency (a 503 before the upgrade): a WebSocket client is told why, in an event.
    engine: Engine | None = state.get("engine")
    tenant = authenticate(socket, query=True)
    if tenant is None:
        message = "a valid API key is required (Authorization: Bearer, X-API-Key or ?api_key=)"
        await socket.send_text(encode(error_event("unauthorized", message)))
        await socket.close(code=CLOSE_POLICY, reason="unauthorized")
        return
    if engine is None:
        await socket.send_text(encode(error_event("engine_not_ready", "the engine is warming up")))
        await socket.close(code=CLOSE_TRY_LATER, reason="engine not ready")
        return
    drain: Drain = state.drain
    if drain.draining:
        await socket.send_text(encode(error_event("draining", DRAIN_REASON)))
        await socket.close(code=CLOSE_RECONNECT, reason="draining")
        return

    async def send(data: bytes | str) -> None:
        if isinstance(data, bytes):
            await socket.send_bytes(data)
        else:
            await socket.send_text(data)

    binding = SessionBinding(store, tenant)
    conn = Connection(engine, settings.limits, binding, socket.receive, send, model=settings.model,
                      admission=admission)  # fmt: skip
    drain.opened(conn)
    try:
        await conn.run()
    finally:
        drain.closed(conn)
        with contextlib.suppress(Exception):
            await socket.close(code=conn.close_code, reason=conn.close_reason)


def create_app(settings: Settings, engine: Engine | None = None) -> Litestar:
    """Build the app. With `engine` given, it is used as is (tests); otherwise `settings.model` is
    loaded in a thread at start-up and /health says 503 until it is warm."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.engine = engine
        # Every stream (WebSocket, speech, batch) starts through one admission per engine.
        app.state.admission = None if engine is None else Admission(engine, settings)
        app.state.api_keys = settings.keys()
        if app.state.api_keys.is_open:
            log.warning("no API keys configured: the gateway is open to every caller on %s", settings.host)
        # A configured Redis that cannot be reached fails start-up (StateUnavailable), clearly.
        store_settings = StoreSettings(
            takeover=settings.takeover,  # type: ignore[arg-type]
            max_voices_per_tenant=settings.max_voices_per_tenant,
            max_voice_bytes_per_tenant=settings.max_voice_bytes_per_tenant,
        )
        app.state.store = SessionStore.from_url(settings.redis_url, settings=store_settings)
        await app.state.store.start()
        task = None
        if engine is None:

            async def load() -> None:
                try:
                    await asyncio.to_thread(warm_up)
                    loaded = await asyncio.to_thread(load_engine, settings.model, **settings.engine_options)
                    app.state.admission = Admission(loaded, settings)  # before the engine: no stream skips it
                    app.state.engine = loaded
                    log.info("engine %r ready", settings.model)
                except Exception as e:  # reported on /health; the process stays up to say so
                    log.exception("engine %r failed to load", settings.model)
                    app.state.engine_error = f"{type(e).__name__}: {e}"

            task = asyncio.create_task(load())
        lag = asyncio.create_task(metrics.watch_loop_lag())
        try:
            yield
        finally:
            lag.cancel()
            if task is not None:
                task.cancel()
            if app.state.get("admission") is not None:
                await app.state.admission.close()
            loaded = app.state.get("engine")
            if loaded is not None and engine is None:
                await asyncio.to_thread(loaded.close)
            await app.state.store.close()

    routes = [health, metrics_endpoint, speech_stream, cancel_session]
    routes += [*openai_routes, *batch_routes, *voice_routes, *playground_routes]
    # Handlers raise (ApiError, EngineError, QueueFull, store errors, bad bodies); one table
    # (gateway/errors.py) turns each into its status and OpenAI's body. Handlers are given the engine,
    # store, settings and tenant (gateway/dependencies.py). Every response carries x-request-id.
    # Every body is small unless its route says otherwise (voices: a clip; speech: text): Litestar's
    # default would let any new route read 10 MB.
    app = Litestar(route_handlers=routes, lifespan=[lifespan], exception_handlers=EXCEPTION_HANDLERS,
                   dependencies=DEPENDENCIES, middleware=[request_id_middleware],
                   request_max_body_size=64 * 1024)  # fmt: skip
    app.state.drain = Drain(settings.drain_grace_s)  # SIGTERM runs it (gateway/server.py)
    return app
