"""Prometheus metrics (GET /metrics)."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gateway import engine_report

SESSIONS = Gauge("voxgate_sessions", "open WebSocket sessions")
UTTERANCES = Counter("voxgate_utterances_total", "utterances started")
SEGMENTS = Counter("voxgate_segments_total", "segments committed", ["reason"])


class _LoopCounter:
    """A counter only the event loop's thread adds to (a plain `+=`), exported as a Prometheus counter when
    scraped. prometheus_client's `Counter.inc` takes a lock each time: for a number added to on every
    audio frame of every session, that lock was most of its cost (bench/results/capacity_s24.md)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name, self.documentation = name, documentation
        self.value = 0.0
        self._created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation)
        family.add_metric([], self.value, created=self._created)
        yield family


AUDIO_BYTES = _LoopCounter("voxgate_audio_bytes_total", "PCM bytes sent to clients")
REGISTRY.register(AUDIO_BYTES)  # type: ignore[arg-type]
TTFA = Histogram(
    "voxgate_ttfa_seconds",
    "time from an utterance's first text to its first audio",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10),
)
# Every response's timing record (gateway/timing.py), by model and tenant: the configured models and
# tenants from the key configuration keep the label sets bounded.
_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30)
QUEUE_WAIT = Histogram(
    "voxgate_response_queue_wait_seconds", "time admission held a response before its first text went to the engine",
    ["model", "tenant"], buckets=(0.001, *_LATENCY_BUCKETS),
)  # fmt: skip
RESPONSE_TTFA = Histogram(
    "voxgate_response_ttfa_seconds", "first text to the engine → first audio handed to the socket",
    ["model", "tenant"], buckets=_LATENCY_BUCKETS,
)  # fmt: skip
AUDIBLE_TTFA = Histogram(
    "voxgate_response_audible_ttfa_seconds", "first text to the engine → first audible audio handed to the socket",
    ["model", "tenant"], buckets=_LATENCY_BUCKETS,
)  # fmt: skip
RTF = Histogram(
    "voxgate_response_rtf", "synthesis time / audio time of a response (below 1: faster than it plays)",
    ["model", "tenant"], buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, 10),
)  # fmt: skip
CANCELS = Counter("voxgate_cancels_total", "barge-ins")
UNDERRUNS = Counter("voxgate_underruns_total", "gaps a real-time player starting at the first audio would hear")
OUTBOX = Gauge("voxgate_outbox_frames", "frames queued for WebSocket clients")
# Counted when scraped, from the live outboxes, not kept up per frame: an inc and a dec (a lock each) on
# every frame sent were paid hundreds of times a second per session for a number read every few seconds.
_OUTBOXES: weakref.WeakSet[Any] = weakref.WeakSet()


def track_outbox(outbox: Any) -> None:
    """Count `outbox` (anything with `queued()`) in `voxgate_outbox_frames` while it lives."""
    _OUTBOXES.add(outbox)


def _outbox_frames() -> float:
    for _ in range(3):  # the loop may open a connection while a scrape in another thread reads the set
        try:
            return float(sum(o.queued() for o in list(_OUTBOXES)))
        except RuntimeError:
            continue
    return float("nan")


OUTBOX.set_function(_outbox_frames)
ERRORS = Counter("voxgate_errors_total", "protocol error events sent", ["code"])

__all__ = ["CONTENT_TYPE_LATEST", "generate_latest"]

LOOP_LAG = Histogram(
    "voxgate_event_loop_lag_seconds",
    "how late the event loop woke a 20 ms timer: time some callback held the loop",
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


GC_PAUSE = Histogram(
    "voxgate_gc_pause_seconds",
    "how long each garbage collection held the process (its event loop with it), by generation",
    ["generation"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


class _GcTimer:
    """A `gc.callbacks` entry timing each collection into GC_PAUSE. Collections run one at a time (under
    the GIL), so one start time serves every thread; a generation-2 pass over a large heap holds the loop
    like any slow callback, and this says which of the loop's lags it was."""

    def __init__(self) -> None:
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            GC_PAUSE.labels(str(info.get("generation", "?"))).observe(time.perf_counter() - self._started)
            self._started = 0.0


_GC_TIMER = _GcTimer()


def watch_gc() -> None:
    """Time garbage collections from now on (GC_PAUSE); idempotent, for the process's life."""
    import gc

    if _GC_TIMER not in gc.callbacks:
        gc.callbacks.append(_GC_TIMER)


async def watch_loop_lag(interval: float = 0.02) -> None:
    """Sleep `interval` again and again and record how late each wake-up is (runs for the app's life)."""
    import asyncio
    import time

    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(interval)
        LOOP_LAG.observe(max(0.0, time.perf_counter() - t0 - interval))


class _ModelCollector:
    """Each model's admission, load and engine telemetry, read at scrape time from the app's models
    (gateway/models.py), labelled `model`: its state, how many streams wait and are admitted, what the
    engine says it can take (`engine.capacity()`), how busy its workers have been (rate() of the busy
    seconds ÷ workers is their utilisation), and the engine's own measures where it gives them
    (`engine.telemetry()`, gateway/engine_report.py: cycle time, batch size, queue depth, slots, restarts)."""

    def __init__(self) -> None:
        self._models: weakref.ref[Any] | None = None
        self._failed: set[str] = set()

    def track(self, models: Any) -> None:
        self._models = None if models is None else weakref.ref(models)

    def collect(self) -> Iterator[Metric]:
        models = self._models() if self._models is not None else None
        if models is None:
            return
        families = _Families()
        for handle in models:
            families.model(handle, self._capacity(handle))
        yield from families.all()

    def _capacity(self, handle: Any) -> Any:
        if handle.admission is None:
            return None
        try:
            return handle.admission.engine_capacity()
        except Exception:  # a scrape must not fail with the engine's estimate; said once per model
            if handle.name not in self._failed:
                logging.getLogger("voxgate.metrics").exception("engine.capacity() of %r failed", handle.name)
                self._failed.add(handle.name)
            return None


_STATES = ("unloaded", "warming", "ready", "restarting", "unloading", "failed")
_TELEMETRY = {  # engine.telemetry() key → (metric, help); restarts is a counter
    "cycle_seconds": ("voxgate_engine_cycle_seconds", "the engine's last cycle (one batched step) took this long"),
    "batch_size": ("voxgate_engine_batch_size", "streams in the engine's last batched step"),
    "queue_depth": ("voxgate_engine_queue_depth", "requests waiting inside the engine for a slot"),
    "slots_in_use": ("voxgate_engine_slots_in_use", "the engine's stream slots in use"),
    "slots_total": ("voxgate_engine_slots", "the engine's stream slots"),
}


class _Families:
    """One family per metric, a sample per model."""

    def __init__(self) -> None:
        g = self._gauge
        self.state = g("voxgate_model_state", "1 for the model's current state", ["model", "state"])
        self.waiting = g("voxgate_admission_waiting", "streams waiting for the model's engine")
        self.admitted = g("voxgate_admission_admitted", "streams admitted and not ended")
        self.load = g("voxgate_admission_load", "the cost of the streams admitted: streams, or worker-seconds "
                      "per second where the engine tells costs (voxgate_engine_capacity_budget)")  # fmt: skip
        by_class = ["model", "voice_class"]  # the engine's classes of voice (Piper, Kokoro): a few, bounded
        self.alone = g("voxgate_admission_first_audio_alone_seconds", "this box's measured start-to-first-"
                       "audio time of a stream alone, at the tail, per class of voice (\"\": the engine tells "
                       "none): what the first-audio SLO's forecast starts from", by_class)
        self.slo_room = g("voxgate_admission_slo_room", "the capacity the first-audio SLO last left a listener's "
                          "first stream of the class of voice, in voxgate_admission_load's units (+Inf before "
                          "its first judgement)", by_class)
        self.budget = g("voxgate_engine_capacity_budget",
                        "the cost of the streams the engine keeps ahead at once, where its streams differ in cost")
        self.capacity = g("voxgate_engine_capacity_streams",
                          "streams the engine says it can keep ahead of their listeners now")  # fmt: skip
        self.active = g("voxgate_engine_active_streams", "streams the engine serves now")
        self.workers = g("voxgate_engine_workers", "the engine's synthesis workers")
        self.busy = CounterMetricFamily("voxgate_engine_busy_seconds", "seconds the engine's workers spent "
                                        "synthesising", labels=["model"])  # fmt: skip
        self.restarts = CounterMetricFamily("voxgate_engine_restarts", "times the model's engine process was "
                                            "restarted", labels=["model"])  # fmt: skip
        self.telemetry = {k: g(name, doc) for k, (name, doc) in _TELEMETRY.items()}

    @staticmethod
    def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, documentation, labels=labels or ["model"])

    def model(self, handle: Any, capacity: Any) -> None:
        name = handle.name
        for state in _STATES:
            self.state.add_metric([name, state], 1.0 if handle.state == state else 0.0)
        if handle.admission is None:
            return
        self._admission(name, handle.admission)
        if capacity is not None:
            self.capacity.add_metric([name], capacity.streams)
            self.active.add_metric([name], capacity.active)
            self.workers.add_metric([name], capacity.workers)
            if capacity.budget is not None:
                self.budget.add_metric([name], capacity.budget)
            if capacity.busy_s is not None:
                self.busy.add_metric([name], capacity.busy_s)
        engine = handle.engine
        found = {} if engine is None else engine_report.telemetry(engine)
        for key, family in self.telemetry.items():
            if key in found:
                family.add_metric([name], found[key])
        if "restarts" in found:
            self.restarts.add_metric([name], found["restarts"])

    def _admission(self, name: str, admission: Any) -> None:
        self.waiting.add_metric([name], admission.waiting)
        self.admitted.add_metric([name], admission.admitted)
        self.load.add_metric([name], admission.load)
        for voice_class, seconds in admission.first_audio_alone_s().items():
            self.alone.add_metric([name, voice_class], seconds)
        for voice_class, room in admission.slo_room().items():
            self.slo_room.add_metric([name, voice_class], room)

    def all(self) -> Iterator[Metric]:
        yield self.state
        yield from (self.waiting, self.admitted, self.load, self.alone, self.slo_room, self.capacity, self.budget,
                    self.active, self.workers, self.busy, self.restarts)
        yield from self.telemetry.values()


MODELS = _ModelCollector()
REGISTRY.register(MODELS)  # type: ignore[arg-type]


def render(models: Any) -> bytes:
    """The exposition text, with the models (gateway/models.py `ModelRegistry`; None: none yet) of the app
    being scraped: one app per process in a deployment, several in a test process."""
    MODELS.track(models)
    return generate_latest()
