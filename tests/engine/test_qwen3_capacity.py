"""Qwen3 engine capacity: the throughput meter driven with given cycle costs, and
`Qwen3Engine.capacity()` after real synthesis on the tiny model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.streams import collect

from engine import load_engine
from engine.qwen3.serving.scheduler import ThroughputMeter
from engine.types import Capacity, StreamEnd

BUCKETS = (4, 8, 16, 32)
NEED = 12.5 * 1.25  # frames per second per stream, with headroom


def test_one_stream_until_a_cycle_is_measured() -> None:
    meter = ThroughputMeter(BUCKETS)
    assert meter.stream_rate(4) is None and meter.streams(32) == 1
    meter.record(0, 0, 0.01)  # nothing generating: nothing learnt
    meter.record(3, 3, float("nan"))
    assert meter.streams(32) == 1


def test_streams_from_cycle_time_at_each_bucket() -> None:
    meter = ThroughputMeter(BUCKETS, alpha=1.0)
    for rows in (4, 8, 16, 32):  # cycle time grows with the batch: 10, 20, 40, 80 ms, a frame a row each
        meter.record(rows, rows, 0.01 * rows / 4)
    assert meter.stream_rate(4) == pytest.approx(100.0) and meter.stream_rate(32) == pytest.approx(12.5)
    # 16 rows: 25 frames/s per stream ≥ 15.6; 32 rows: 12.5 < 15.6, so 16 is the most
    assert meter.streams(32) == 16
    assert meter.streams(8) == 8  # capped by the slots


def test_unmeasured_buckets_are_judged_conservatively() -> None:
    meter = ThroughputMeter(BUCKETS, alpha=1.0)
    meter.record(1, 1, 0.01)  # one stream, 100 frames/s
    # Larger batches as if the cycle grew with the rows: 8 → 50, 16 → 25, 32 → 12.5 frames/s
    assert meter.stream_rate(8) == pytest.approx(50.0) and meter.stream_rate(32) == pytest.approx(12.5)
    assert meter.streams(32) == 16
    meter.record(16, 16, 0.02)  # measured: batching pays (50 frames/s at 16 rows)
    assert meter.stream_rate(8) == pytest.approx(50.0)  # as fast as the next larger measured one, no faster
    assert meter.stream_rate(32) == pytest.approx(25.0)  # from the 16 bucket
    assert meter.streams(32) == 32


def test_the_warm_ups_step_costs_judge_larger_batches() -> None:
    meter = ThroughputMeter(BUCKETS, alpha=1.0)
    meter.set_step_costs({4: 0.010, 8: 0.012, 16: 0.016, 32: 0.040, 64: 1.0, 1: float("nan")})  # 64: no bucket
    meter.record(4, 4, 0.01)  # 4 rows, 100 frames/s each
    # a step at 16 rows cost 1.6× one at 4 at the warm-up: 62.5 frames/s judged (25 without the costs)
    assert meter.stream_rate(16) == pytest.approx(62.5) and meter.stream_rate(32) == pytest.approx(25.0)
    assert meter.streams(32) == 32
    meter.set_step_costs({4: 0.02, 8: 0.01})  # a cheaper larger step is never believed faster per stream
    assert meter.stream_rate(8) == pytest.approx(100.0)
    meter.record(16, 16, 0.05)  # measured slower than judged: the measurement wins
    assert meter.stream_rate(16) == pytest.approx(20.0)


def test_decode_time_and_idle_rows_lower_the_rate() -> None:
    meter = ThroughputMeter(BUCKETS, alpha=0.5, alpha_up=0.5)
    meter.record(4, 4, 0.05)  # 80 frames/s per stream
    meter.record(4, 0, 0.05)  # a decode-only cycle: time, no frames
    assert meter.stream_rate(4) == pytest.approx((4 / 4 * 0.5) / 0.05)  # per-row 0.5, cycle 0.05 s
    for _ in range(40):
        meter.record(4, 4, 0.5)  # a slow box: 2 frames/s per stream, not real time
    assert meter.streams(32) == 1  # never zero


def test_a_slowdown_is_believed_at_once_a_speedup_slowly() -> None:
    meter = ThroughputMeter(BUCKETS, alpha=0.1, alpha_up=0.5)
    meter.record(4, 4, 0.02)
    meter.record(4, 4, 0.06)  # the box got busier: halfway to 60 ms at once
    assert meter.snapshot()[4][1] == pytest.approx(0.04)
    meter.record(4, 4, 0.0 + 1e-9)  # a fast cycle: a tenth of the way down
    assert meter.snapshot()[4][1] == pytest.approx(0.036, rel=1e-6)


def test_more_streams_than_batch_rows_share_the_steps() -> None:
    meter = ThroughputMeter((4,), alpha=1.0)
    meter.record(4, 4, 0.01)  # 100 frames/s per stream at the 4-row batch
    assert meter.streams(32) == 25  # 25 streams: each stepped in 4/25 of the cycles, 16 frames/s ≥ 15.6
    assert meter.streams(32) == max(n for n in range(1, 33) if 100 * min(1, 4 / n) >= NEED)


def test_reads_while_the_core_records() -> None:
    meter = ThroughputMeter(BUCKETS)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            meter.record(1 + i % 32, 1 + i % 32, 0.001 * (1 + i % 7))
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(2000):
            assert 1 <= meter.streams(32) <= 32
    finally:
        stop.set()
        t.join()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    eng = load_engine("tiny", cache_dir=tmp_path_factory.mktemp("cache"), max_streams=8, frames_per_token=2.0,
                      min_frames=6)
    yield eng
    eng.close()


async def test_capacity_after_real_synthesis(tiny: Any) -> None:
    prior = tiny.capacity()
    assert isinstance(prior, Capacity) and prior == Capacity(1, 0)  # nothing measured yet
    streams = [tiny.open_stream(None, "en", seed=i) for i in range(3)]
    assert tiny.capacity().active == 3  # open and not ended, slot or not
    for i, s in enumerate(streams):
        s.append(f"Stream {i} speaks a short sentence so the core can measure its cycles.")
        s.finish()
    results = await asyncio.gather(*(collect(s, 120) for s in streams))
    assert all(end == StreamEnd("done") and events for events, end in results)
    cap = tiny.capacity()
    assert cap.active == 0
    assert 1 <= cap.streams <= 8
    snap = tiny.core.meter.snapshot()
    assert snap and all(per_row > 0 and cycle_s > 0 for per_row, cycle_s in snap.values())
    assert cap.streams == tiny.core.meter.streams(8)
    assert set(tiny.core.meter._costs) == set(tiny.core._buckets)  # the warm-up timed every bucket


def test_memory_and_telemetry_after_real_synthesis(tiny: Any) -> None:
    """What the gateway's admin plane and /metrics read of the engine (gateway/engine_report.py)."""
    memory = tiny.memory()
    assert memory["weights_bytes"] > 1_000_000, memory  # the tiny model's weights are some megabytes
    assert 0 < memory["kv_bytes"] <= memory["slot_bytes"], memory
    per_slot = tiny.core.bytes_per_slot()
    assert memory["slot_bytes"] == sum(per_slot.values()) * 8, (memory, per_slot)
    telemetry = tiny.telemetry()  # after test_capacity_after_real_synthesis's streams (or none: 0 cycles)
    assert telemetry["slots_total"] == 8 and telemetry["slots_in_use"] == 0 and telemetry["queue_depth"] == 0
    assert telemetry.get("cycle_seconds", 0.1) > 0 and telemetry["batch_size"] >= 0, telemetry
