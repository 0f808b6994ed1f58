"""The Litestar app factory: routes, and the lifespan of the models and the session store."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

from litestar import Litestar, Response, get, post, websocket
from litestar.connection import WebSocket
from litestar.datastructures import State
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from engine import Engine, heap
from gateway import metrics
from gateway.admin import admin_guard, admin_routes
from gateway.aliases import Aliases
from gateway.auth import authenticate
from gateway.batch import batch_routes
from gateway.browser import browser_guard
from gateway.dependencies import DEPENDENCIES
from gateway.drain import Drain
from gateway.errors import EXCEPTION_HANDLERS, ApiError
from gateway.handshake import SessionCount, handshake_middleware
from gateway.lexicons import lexicon_routes
from gateway.model_routes import model_routes
from gateway.models import EngineFactory, ModelRegistry, in_child, in_process
from gateway.openai_api import openai_routes
from gateway.playground import playground_routes
from gateway.protocol import CancelBody, encode, error_event
from gateway.protocols.routes import protocol_routes
from gateway.request_id import request_id_middleware
from gateway.settings import Settings
from gateway.sockets import refusal, serve_connection
from gateway.voices import voice_routes
from segmentation import warm_up
from sessions import InvalidId, SessionNotFound, SessionStore, StoreSettings, Tenant

log = logging.getLogger("voxgate")


@get("/health")
async def health(state: State) -> Response[dict[str, object]]:
    """200 once a model is warm (the contract), each model's state in `models`; "degraded" while a model
    cannot serve or the state store's circuit is open. Answered from state alone, never waiting on an
    engine or Redis (the store's heartbeat keeps its view current), and unauthenticated: `detail` is a
    short stable phrase, never an address or an exception's text (the server's log has those)."""
    models: ModelRegistry = state.models
    states = {h.name: h.state for h in models}
    if models.any_serving() is None:
        status, detail = _none_serving(states.values())
        return Response({"status": status, "detail": detail, "models": states}, status_code=503)
    if state.drain.draining:  # a balancer's health check takes the replica out of rotation
        return Response({"status": "draining", "detail": "the server is draining", "models": states}, status_code=503)
    h = state.store.health()
    status = "ok" if h.status == "ok" and all(s == "ready" for s in states.values()) else "degraded"
    body = {"status": status, "model": models.default, "state": h.backend}
    if h.error:
        body["detail"] = h.error
    return Response(body | {"models": states})


def _none_serving(states: Iterable[str]) -> tuple[str, str]:
    """/health's status and detail while no model serves."""
    states = set(states)
    if states & {"warming", "restarting"}:
        return "warming", "the engine is loading"
    if states == {"failed"}:
        return "failed", "the engine failed to load"
    return "unavailable", "no model is loaded"


@post("/v1/sessions/{session_id:str}/cancel", status_code=202)
async def cancel_session(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], session_id: FromPath[str],
    data: JSONBody[CancelBody | None] = None,
) -> Response[dict[str, object]]:
    """Barge-in from anywhere: the replica holding the session's socket cancels within a cycle. The
    optional body's `played_ms` goes with it (audio.cancelled's heard_text)."""
    played_ms = data.played_ms if data is not None else None
    try:
        reached = await store.publish_cancel(tenant.name, session_id, played_ms=played_ms)
    except (SessionNotFound, InvalidId):  # a malformed id names no session either
        raise ApiError(f"no session {session_id[:128]!r}", code="session_not_found", status=404) from None
    return Response({"session_id": session_id, "cancelled": True, "replicas": reached}, status_code=202)


@get("/livez", sync_to_thread=False)
def livez() -> dict[str, str]:
    """200 while the event loop answers: a liveness probe's (not /health, which is 503 while a replica
    warms up or drains, nor /metrics, which is the admin plane's). Unauthenticated; says nothing."""
    return {"status": "alive"}


@get("/metrics", sync_to_thread=False, guards=[admin_guard])  # it names every tenant: the admin plane's
def metrics_endpoint(state: State) -> Response[bytes]:
    return Response(metrics.render(state.get("models")), media_type=metrics.CONTENT_TYPE_LATEST)


@websocket("/v1/audio/speech/stream")
async def speech_stream(
    socket: WebSocket, state: State, store: NamedDependency[SessionStore], settings: NamedDependency[Settings]
) -> None:
    # Not the `engine` dependency (a 503 before the upgrade): a WebSocket client is told why, in an event.
    await socket.accept()
    if (refused := refusal(socket, state)) is not None:
        await socket.send_text(encode(error_event(refused.code, refused.message)))
        await socket.close(code=refused.close_code, reason=refused.reason)
        return
    tenant = authenticate(socket, query=True)
    assert tenant is not None

    # The ASGI events themselves, to Litestar's state-checking send: its send_bytes/send_text build the same
    # event through two more calls, on every frame of every session (bench/results/capacity_s24.md).
    asgi_send = socket.send

    async def send(data: bytes | str) -> None:
        if isinstance(data, bytes):
            await asgi_send({"type": "websocket.send", "bytes": data, "text": None})
        else:
            await asgi_send({"type": "websocket.send", "bytes": None, "text": data})

    await serve_connection(state, store, settings, tenant, socket.receive, send, socket=socket)  # type: ignore[arg-type]


def _lifespan(
    settings: Settings, engines: Mapping[str, Engine], factory: EngineFactory
) -> Callable[[Litestar], contextlib.AbstractAsyncContextManager[None]]:
    """The app's start-up and shut-down: the models (those given served as they are, the rest loaded in
    the background while /health says 503), the API keys, the session store, the loop-lag watch."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.api_keys = settings.keys()
        if app.state.api_keys.is_open:
            log.warning("no API keys configured: the gateway is open to every caller on %s", settings.host)
        # A configured Redis that cannot be reached fails start-up (StateUnavailable), clearly.
        store_settings = StoreSettings(
            takeover=settings.takeover,  # type: ignore[arg-type]
            max_voices_per_tenant=settings.max_voices_per_tenant,
            max_voice_bytes_per_tenant=settings.max_voice_bytes_per_tenant,
            max_connections=settings.redis_max_connections,
            pool_wait_s=settings.redis_pool_wait_s,
        )
        app.state.store = SessionStore.from_url(settings.redis_url, settings=store_settings)
        await app.state.store.start()
        models: ModelRegistry = app.state.models
        models.start(engines, prepare=warm_up)  # the segmenter's first use before the models' loads
        heap.settle(collect=True)  # nothing is served yet: the start-up's heap leaves the full GC passes
        metrics.watch_gc()
        lag = asyncio.create_task(metrics.watch_loop_lag())
        try:
            yield
        finally:
            lag.cancel()
            await models.close()
            await app.state.store.close()

    return lifespan


def create_app(
    settings: Settings, engine: Engine | None = None, *, engines: Mapping[str, Engine] | None = None,
    factory: EngineFactory | None = None,
) -> Litestar:
    """Build the app. Engines given (`engine`: the default model's; `engines`: by model name) are served as
    they are and never closed by the app (tests, embedding); the other models are made by `factory`
    (gateway/models.py; by default in child processes, or in this one with `engine_processes` false) at
    start-up, and /health says 503 until one is warm."""
    if factory is None:
        factory = in_child if settings.engine_processes else in_process
    given = dict(engines or {})
    specs = settings.model_specs()
    if engine is not None:
        given.setdefault(specs[0].name, engine)
    routes = [health, livez, metrics_endpoint, speech_stream, cancel_session, *model_routes, *admin_routes]
    routes += [*openai_routes, *batch_routes, *voice_routes, *lexicon_routes, *playground_routes]
    routes += protocol_routes  # ElevenLabs- and Cartesia-compatible (gateway/protocols/)
    # Handlers raise (ApiError, EngineError, QueueFull, store errors, bad bodies); one table
    # (gateway/errors.py) turns each into its status and OpenAI's body. Handlers are given the engine,
    # store, settings and tenant (gateway/dependencies.py). Every response carries x-request-id.
    # Every body is small unless its route says otherwise (voices: a clip; speech: text): Litestar's
    # default would let any new route read 10 MB. No page of another origin, and in open mode no rebound
    # Host, is answered (gateway/browser.py).
    app = Litestar(route_handlers=routes, lifespan=[_lifespan(settings, given, factory)],
                   exception_handlers=EXCEPTION_HANDLERS, dependencies=DEPENDENCIES, guards=[browser_guard],
                   middleware=[request_id_middleware, handshake_middleware],
                   request_max_body_size=64 * 1024)  # fmt: skip
    app.state.drain = Drain(settings.drain_grace_s)  # SIGTERM runs it (gateway/server.py)
    # A WebSocket is refused before its upgrade (503) while the replica is full, draining or not ready.
    app.state.sessions = SessionCount(settings.max_sessions)
    # Each model its own admission (every stream, WebSocket, speech or batch, starts through it).
    app.state.aliases = Aliases.of(settings)  # every route resolves model ids and voice names by them
    app.state.models = ModelRegistry(specs, settings, factory, aliases=app.state.aliases)
    return app
