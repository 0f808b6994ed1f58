"""The models one gateway serves: name → engine, its admission, its state; loaded and unloaded at run time.

Settings name the models (gateway/settings.py `model_specs()`: `--model piper,tiny`, `[[models]]` in the
TOML file); the first is the default, picked when a request names none (or names one of OpenAI's own
model names, which clients written for OpenAI send). `ModelRegistry.serving(name)` is how every route
finds its engine: it raises `ModelUnavailable` with a stable code — `unknown_model` (404), or 503 with
`engine_not_ready` (warming, or failed to load), `engine_restarting`, `model_unloading`, `model_not_loaded`.

Each model has its own `Admission` (gateway/admission.py) over its own `ServedEngine`
(gateway/served_engine.py), so one model's queue never holds another's streams. An engine is made by the
registry's factory — `in_process` (`load_engine`) unless another is given (engine processes) — in a
thread, never on the event loop. An unload drains as the server's drain does (gateway/drain.py): the
model takes no new streams at once (`model_unloading`), open streams get `grace_s` to finish, those left
are cut with an error, then the engine is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from engine import Engine, heap, load_engine
from gateway.admission import Admission
from gateway.aliases import SHIPPED, Aliases
from gateway.errors import ApiError
from gateway.protocol import ProtocolError
from gateway.served_engine import ServedEngine
from gateway.settings import ModelSpec, Settings

log = logging.getLogger("voxgate.models")

ModelState = Literal["unloaded", "warming", "ready", "restarting", "unloading", "failed"]
# What clients written for OpenAI (and vLLM-Omni's) send as `model`: the default model serves them.
CUT_WAIT_S = 2.0  # after the grace: how long cut streams get to end before the engine is closed anyway


EngineFactory = Callable[[ModelSpec], Engine]  # blocking: run in a thread


def in_process(spec: ModelSpec) -> Engine:
    """The engine in this process (`load_engine`): tests, benches, embedding."""
    return load_engine(spec.source, **spec.options)


def in_child(spec: ModelSpec) -> Engine:
    """The engine in a supervised child process of its own (engine/process): returns at once, warming;
    its `state` says when it is ready, restarting after a crash, or failed."""
    from engine.process import start_engine  # pyzmq stays unimported for in-process gateways

    return start_engine(spec.source, **spec.options)  # type: ignore[return-value]


class ModelUnavailable(ProtocolError):
    """A request for a model that cannot serve it now; `status` is its HTTP status."""

    def __init__(self, code: str, message: str, status: int = 503) -> None:
        super().__init__(code, message)
        self.status = status

    def api_error(self) -> ApiError:
        """As an HTTP route answers it (OpenAI's error body, param `model`)."""
        return ApiError(self.message, param="model", code=self.code, status=self.status)


_NOT_SERVING = {
    "unloaded": ("model_not_loaded", "is not loaded (POST /v1/admin/models/{name}/load)"),
    "warming": ("engine_not_ready", "is warming up"),
    "restarting": ("engine_restarting", "is restarting after its engine stopped"),
    "unloading": ("model_unloading", "is unloading: it takes no new sessions"),
    "failed": ("engine_not_ready", "failed to load"),  # the code a gateway without its engine always said
}


class ModelHandle:
    """One model: its spec, and while loaded its engine (served) and admission."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.served: ServedEngine | None = None
        self.admission: Admission | None = None
        self.error: str | None = None
        self._load_s: float | None = None
        self.loaded_at: float | None = None  # unix time
        self._state: ModelState = "unloaded"
        self.owned = True  # the registry made its engine (one attached is its owner's to close)
        self.task: asyncio.Task[None] | None = None  # its load or unload under way

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def engine(self) -> Engine | None:
        return None if self.served is None else self.served.engine

    @property
    def state(self) -> ModelState:
        """Its state; a ready engine that runs in a process of its own may say it is restarting or failed."""
        engine = self.engine
        if self._state == "ready" and engine is not None:
            said = getattr(engine, "state", "ready")
            if said in ("warming", "restarting", "failed"):
                return said
            if said == "closed":
                return "failed"
        return self._state

    @property
    def warm_up_s(self) -> float | None:
        """Seconds its engine took to warm: its own word (an engine process), else the load's time."""
        said = getattr(self.engine, "warmup_s", None)
        return said if isinstance(said, int | float) else self._load_s

    def unavailable(self) -> ModelUnavailable | None:
        """Why it cannot take a new stream now (None: it can)."""
        state = self.state
        if state == "ready":
            return None
        code, why = _NOT_SERVING[state]
        return ModelUnavailable(code, f"model {self.name!r} {why.replace('{name}', self.name)}")

    @property
    def streams(self) -> dict[str, int]:
        admission = self.admission
        open_ = 0 if self.served is None else self.served.open
        if admission is None:
            return {"active": open_, "waiting": 0}
        return {"active": max(admission.admitted, open_), "waiting": admission.waiting}


class ModelRegistry:
    """The gateway's models, by name, in the order configured (the first is the default)."""

    def __init__(self, specs: Sequence[ModelSpec], settings: Settings, factory: EngineFactory = in_process,
                 aliases: Aliases = SHIPPED) -> None:  # fmt: skip
        if not specs:
            raise ValueError("a gateway serves at least one model")
        self.handles: dict[str, ModelHandle] = {s.name: ModelHandle(s) for s in specs}
        self.default = specs[0].name
        self.settings = settings
        self.factory = factory
        self.aliases = aliases
        self._starting: asyncio.Task[None] | None = None

    def __iter__(self) -> Any:
        return iter(self.handles.values())

    def handle(self, name: str | None) -> ModelHandle:
        """The model a request names, through the aliases (gateway/aliases.py: None, "", an OpenAI or
        Qwen3-TTS model id: the default or the served Qwen3 model); unknown_model."""
        key = self.aliases.model(name, [h.spec for h in self], self.default)
        found = None if key is None else self.handles.get(key)
        if found is None:
            key = (name or "").strip() if key is None else key
            shown = key if len(key) <= 64 else key[:64] + "…"
            raise ModelUnavailable("unknown_model", f"no model {shown!r}; this gateway serves "
                                                    f"{', '.join(self.handles)}", status=404)  # fmt: skip
        return found

    def serving(self, name: str | None) -> ModelHandle:
        """The named model if it takes new streams now; ModelUnavailable otherwise."""
        found = self.handle(name)
        if (why := found.unavailable()) is not None:
            raise why
        return found

    def select(self, name: str | None) -> tuple[Engine, Admission, str]:
        """(engine, admission, name) of the model a session.config names (gateway/connection.py)."""
        handle = self.serving(name)
        assert handle.served is not None and handle.admission is not None
        return handle.served, handle.admission, handle.name  # type: ignore[return-value]

    def any_serving(self) -> ModelHandle | None:
        """The default model if it serves, else the first that does."""
        first = self.handles[self.default]
        if first.state == "ready":
            return first
        return next((h for h in self if h.state == "ready"), None)

    # -- loading and unloading ----------------------------------------------------------------------

    def attach(self, name: str, engine: Engine) -> ModelHandle:
        """Serve an engine already loaded (tests, embedding) under `name`."""
        handle = self.handles[name]
        self._serve(handle, engine, 0.0)
        handle.owned = False
        return handle

    def _serve(self, handle: ModelHandle, engine: Engine, took: float) -> None:
        served = ServedEngine(handle.name, engine)
        handle.admission = Admission(served, self.settings)  # type: ignore[arg-type]
        handle.served = served  # after the admission: no stream skips it
        handle.error, handle._load_s, handle.loaded_at = None, took, time.time()
        handle._state = "ready"

    def load(self, name: str) -> ModelHandle:
        """Start loading `name`; /health and the admin plane say `warming` until it is warm. A no-op while it
        is loaded or loading (its engine's own state decides: one in a process of its own may be warming or
        restarting by itself); a model that failed is tried again: an engine made whose process then
        failed to load is closed and made anew."""
        handle = self.handle(name)
        state = handle.state
        if state in ("ready", "warming", "restarting", "unloading"):
            return handle
        remake = handle.served is not None
        if remake and not handle.owned:  # attached by its owner: not the registry's to close or remake
            return handle
        handle._state, handle.error = "warming", None
        handle.task = asyncio.create_task(self._remake(handle) if remake else self._load(handle),
                                          name=f"load-{handle.name}")  # fmt: skip
        return handle

    async def _remake(self, handle: ModelHandle) -> None:
        """Close the failed engine (its streams already ended), then load the model again."""
        await self._close(handle, then="warming")
        await self._load(handle)

    async def _load(self, handle: ModelHandle) -> None:
        t0 = time.monotonic()
        engine: Engine | None = None
        try:
            engine = await asyncio.to_thread(self.factory, handle.spec)
            self._serve(handle, engine, time.monotonic() - t0)
            heap.settle(collect=False)  # the model's heap (in this process) leaves the full GC passes
        except Exception as e:  # reported on /health and the admin plane; the gateway stays up to say so
            log.exception("model %r failed to load", handle.name)
            handle._state, handle.error = "failed", f"{type(e).__name__}: {e}"[:500]
            if engine is not None:  # made, but it could not be served: nothing else would close it
                await asyncio.to_thread(engine.close)
            return
        handle.owned = True
        if handle.state == "warming":  # an engine process of its own: it says when it is ready, or why not
            log.info("model %r: its engine process is loading it", handle.name)
        else:
            log.info("model %r loaded in %.1f s", handle.name, handle._load_s)

    def unload(self, name: str, grace_s: float) -> ModelHandle:
        """Start unloading `name`: new streams are refused now; open ones get `grace_s` to finish."""
        handle = self.handle(name)
        if handle._state != "ready" or handle.served is None:
            raise ModelUnavailable("model_not_loaded", f"model {handle.name!r} is {handle.state}, not loaded",
                                   status=409)  # fmt: skip
        handle._state = "unloading"
        handle.served.unloading = True
        handle.task = asyncio.create_task(self._unload(handle, grace_s), name=f"unload-{handle.name}")
        return handle

    async def _unload(self, handle: ModelHandle, grace_s: float, poll_s: float = 0.02) -> None:
        served, admission = handle.served, handle.admission
        assert served is not None and admission is not None
        deadline = time.monotonic() + grace_s
        while _busy(handle) and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
        if _busy(handle):
            cut = served.cut(f"model {handle.name!r} was unloaded: the stream was cut after its {grace_s:g} s grace")
            log.warning("unloading %r: the grace period is over; %d streams cut", handle.name, cut)
            end = time.monotonic() + CUT_WAIT_S
            while _busy(handle) and time.monotonic() < end:
                await asyncio.sleep(poll_s)
        await self._close(handle)
        log.info("model %r unloaded", handle.name)

    async def _close(self, handle: ModelHandle, then: ModelState = "unloaded") -> None:
        served, admission = handle.served, handle.admission
        handle.served, handle.admission = None, None
        handle._state, handle._load_s, handle.loaded_at = then, None, None
        if admission is not None:
            await admission.close()
        engine = None if served is None else served.release()
        if engine is not None and handle.owned:
            try:
                await asyncio.to_thread(engine.close)
            except Exception:
                log.exception("closing model %r failed", handle.name)

    def start(self, preloaded: Mapping[str, Engine] | None = None,
              prepare: Callable[[], object] | None = None) -> None:  # fmt: skip
        """Serve what is given at once; load the rest that preload, in the background, after `prepare`
        (run in a thread: the segmenter's warm-up, say)."""
        for name, engine in (preloaded or {}).items():
            self.attach(name, engine)
        pending = [h for h in self if h.spec.preload and h.served is None]
        for handle in pending:
            handle._state = "warming"
        if pending:
            self._starting = asyncio.create_task(self._start(pending, prepare), name="load-models")

    async def _start(self, pending: list[ModelHandle], prepare: Callable[[], object] | None) -> None:
        if prepare is not None:
            await asyncio.to_thread(prepare)
        for handle in pending:
            handle._state = "unloaded"
            self.load(handle.name)

    async def start_failed(self, poll_s: float = 0.1) -> str | None:
        """Once the models that load at start-up have settled: None as soon as one is ready (or none
        loads at start-up, or an operator unloaded one meanwhile), else why each failed, in one line. The
        CLI exits with it: a gateway whose every model failed to start serves nothing. (A model of an
        engine process of its own says so from there, polled: its state lives in another process.)"""
        starting = [h for h in self if h.spec.preload]
        while starting:
            states = {h.state for h in starting}
            if states & {"ready", "unloaded", "unloading"}:
                return None
            if states == {"failed"}:
                return "; ".join(f"model {h.name!r}: {_why_failed(h)}" for h in starting)
            await asyncio.sleep(poll_s)
        return None

    def retire(self) -> None:
        """The gateway is leaving (a drain began; closing follows): engines that restart their own process
        (engine/process) restart no more, so nothing starts while the gateway stops."""
        for handle in self:
            retire = getattr(handle.engine, "retire", None)
            if retire is not None and handle.owned:
                retire()

    async def close(self) -> None:
        """Stop loads and unloads under way; close the engines the registry made."""
        if self._starting is not None:
            self._starting.cancel()
        for handle in self:
            if handle.task is not None and not handle.task.done():
                handle.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await handle.task
            await self._close(handle)


def api_serving(models: ModelRegistry, name: str | None) -> ModelHandle:
    """`serving` for an HTTP route: a model that cannot serve is OpenAI's error body (param `model`)."""
    try:
        return models.serving(name)
    except ModelUnavailable as e:
        raise e.api_error() from None


def _why_failed(handle: ModelHandle) -> str:
    """A failed model's reason, on one line: its load's error, or what its engine process said."""
    why = handle.error or getattr(handle.engine, "last_error", None) or "failed to load"
    return " ".join(str(why).split())


def _busy(handle: ModelHandle) -> bool:
    """Streams open or waiting on the model."""
    streams = handle.streams
    return streams["active"] > 0 or streams["waiting"] > 0
