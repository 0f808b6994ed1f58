"""Prometheus metrics (GET /metrics)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

SESSIONS = Gauge("voxgate_sessions", "open WebSocket sessions")
UTTERANCES = Counter("voxgate_utterances_total", "utterances started")
SEGMENTS = Counter("voxgate_segments_total", "segments committed", ["reason"])
AUDIO_BYTES = Counter("voxgate_audio_bytes_total", "PCM bytes sent to clients")
TTFA = Histogram(
    "voxgate_ttfa_seconds",
    "time from an utterance's first text to its first audio",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10),
)
# Every response's timing record (gateway/timing.py), by model and tenant: one model per process and
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
ERRORS = Counter("voxgate_errors_total", "protocol error events sent", ["code"])

__all__ = ["CONTENT_TYPE_LATEST", "generate_latest"]

LOOP_LAG = Histogram(
    "voxgate_event_loop_lag_seconds",
    "how late the event loop woke a 20 ms timer: time some callback held the loop",
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


async def watch_loop_lag(interval: float = 0.02) -> None:
    """Sleep `interval` again and again and record how late each wake-up is (runs for the app's life)."""
    import asyncio
    import time

    while True:
        t0 = time.perf_counter()
        await asyncio.sleep(interval)
        LOOP_LAG.observe(max(0.0, time.perf_counter() - t0 - interval))


class _AdmissionCollector:
    """Admission and engine load, read at scrape time from the app's `Admission` (gateway/admission.py):
    how many streams wait and are admitted, what the engine says it can take (`engine.capacity()`), and
    how busy its workers have been (rate() of the busy seconds ÷ workers is their utilisation)."""

    def __init__(self) -> None:
        self._admission: weakref.ref[Any] | None = None
        self._failed = False

    def track(self, admission: Any) -> None:
        self._admission = None if admission is None else weakref.ref(admission)

    def collect(self) -> Iterator[Metric]:
        admission = self._admission() if self._admission is not None else None
        if admission is None:
            return
        yield _gauge("voxgate_admission_waiting", "streams waiting for the engine", admission.waiting)
        yield _gauge("voxgate_admission_admitted", "streams admitted and not ended", admission.admitted)
        try:
            capacity = admission.engine_capacity()
        except Exception:  # a scrape must not fail with the engine's estimate; said once
            if not self._failed:
                logging.getLogger("voxgate.metrics").exception("engine.capacity() failed")
                self._failed = True
            return
        if capacity is None:
            return
        yield _gauge("voxgate_engine_capacity_streams", "streams the engine says it can keep ahead of their "
                     "listeners now", capacity.streams)
        yield _gauge("voxgate_engine_active_streams", "streams the engine serves now", capacity.active)
        yield _gauge("voxgate_engine_workers", "the engine's synthesis workers", capacity.workers)
        if capacity.busy_s is not None:
            busy = CounterMetricFamily("voxgate_engine_busy_seconds", "seconds the engine's workers spent synthesising")
            busy.add_metric([], capacity.busy_s)
            yield busy


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


ADMISSION = _AdmissionCollector()
REGISTRY.register(ADMISSION)  # type: ignore[arg-type]


def render(admission: Any) -> bytes:
    """The exposition text, with the admission (None: no engine yet) of the app being scraped: one app
    per process in a deployment, several in a test process."""
    ADMISSION.track(admission)
    return generate_latest()
