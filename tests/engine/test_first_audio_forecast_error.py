"""A leader let wait is judged by its forecast moved by how far off such forecasts were lately
(engine/start_forecast.py `StartForecast.erred`/`error_s`, `FairQueue._misses`): fake clock, one stream
of capacity, the load's slowdown off (first audio does not depend on the load here), SLO 1.5 s."""

from __future__ import annotations

import pytest

from engine.fair_queue import FairQueue, FairQueueConfig, Refused, Waiter
from engine.start_forecast import StartForecast
from tests.support.clocks import ManualClock


def queue(clock: ManualClock) -> FairQueue:
    return FairQueue(FairQueueConfig(first_audio_slo_s=1.5, first_audio_load_slowdown=0.0), clock)


def alone(q: FairQueue, clock: ManualClock, *heard_after_s: float) -> None:
    """Streams started one at a time on an idle engine, each heard after the given seconds, holding its
    slot 1 s in all."""
    for s in heard_after_s:
        w = q.push("a", 1.0, 1)
        assert w.state == "admitted"
        clock.now += s
        q.heard(w)
        clock.now += 1.0 - s
        q.finish(w)


def behind_one(q: FairQueue, clock: ManualClock, asks_after_s: float) -> tuple[Waiter, Waiter]:
    """A stream admitted now (holding its slot 1 s) and a leader asking `asks_after_s` later (raises
    Refused as the queue does)."""
    holder = q.push("a", 1.0, 1)
    assert holder.state == "admitted"
    clock.now += asks_after_s
    return holder, q.push("a", 1.0, 1)


def waits_then_heard(q: FairQueue, clock: ManualClock, holder: Waiter, waiter: Waiter, heard_after_s: float) -> None:
    """`holder` ends 1 s after it started; `waiter` starts then and is heard `heard_after_s` after."""
    assert holder.started_at is not None and waiter.state == "waiting"
    clock.now = holder.started_at + 1.0
    q.release(holder, 1)
    q.look(1)
    assert waiter.state == "admitted"
    clock.now += heard_after_s
    q.heard(waiter)
    clock.now = (waiter.started_at or 0.0) + 1.0
    q.finish(waiter)


def test_a_forecast_that_proved_pessimistic_lets_wait_the_callers_it_would_have_refused() -> None:
    # First audio alone is mostly 0.2 s, now and then 0.9 s: the forecast takes the tail, 0.9 s. Leaders
    # let wait behind one stream are heard 0.7 s sooner than forecast; once that is measured, a caller
    # forecast 1.6 s (0.7 s of wait, 0.9 s of its own) waits rather than being refused, and is heard in
    # 0.9 s.
    clock = ManualClock()
    q = queue(clock)
    alone(q, clock, *[0.2] * 10, 0.9, 0.9, 0.9)
    assert q.first_audio_tail_s() == pytest.approx(0.9)
    holder = q.push("a", 1.0, 1)
    clock.now += 0.3
    with pytest.raises(Refused) as e:
        q.push("a", 1.0, 1)
    assert e.value.bound == "slo" and e.value.predicted_s == pytest.approx(1.6)
    clock.now += 0.7
    q.finish(holder)
    for _ in range(6):
        holder, waiter = behind_one(q, clock, asks_after_s=0.5)  # forecast 1.4 s: let wait
        assert waiter.forecast_s == pytest.approx(1.4)
        waits_then_heard(q, clock, holder, waiter, 0.2)  # heard 0.7 s after asking
    assert q.forecast.error_s("", clock.now) == pytest.approx(-0.7)
    holder, waiter = behind_one(q, clock, asks_after_s=0.3)  # forecast 1.6 s as measured: let wait
    assert waiter.state == "waiting" and waiter.forecast_s == pytest.approx(1.6)
    waits_then_heard(q, clock, holder, waiter, 0.2)


def test_forecasts_that_proved_right_are_taken_as_they_are() -> None:
    clock = ManualClock()
    q = queue(clock)
    alone(q, clock, *[0.5] * 12)
    for _ in range(6):
        holder, waiter = behind_one(q, clock, asks_after_s=0.5)  # forecast 1.0 s
        waits_then_heard(q, clock, holder, waiter, 0.5)  # heard 1.0 s after asking
    assert q.forecast.error_s("", clock.now) == pytest.approx(0.0)
    with pytest.raises(Refused):
        behind_one(q, clock, asks_after_s=-0.1)  # 1.1 s of wait and 0.5 s of its own: 1.6 s


def test_forecasts_that_proved_optimistic_refuse_sooner() -> None:
    clock = ManualClock()
    forecast = StartForecast(FairQueueConfig(first_audio_slo_s=1.5))
    for _ in range(8):
        clock.now += 1.0
        forecast.heard("", 0.5, 0.0, clock.now)
        forecast.erred("", 0.4, clock.now)  # heard 0.4 s later than forecast
    assert forecast.error_s("", clock.now) == pytest.approx(0.4)


def test_the_forecasts_error_is_read_at_its_quantile_with_the_prior_counted() -> None:
    clock = ManualClock()
    forecast = StartForecast(FairQueueConfig(first_audio_forecast_quantile=0.75))
    assert forecast.error_s("", clock.now) == 0.0  # none measured: the forecast as it is
    forecast.heard("", 0.5, 0.0, clock.now)
    forecast.erred("", -0.6, clock.now)  # one: with the prior's two zeros, the 75th percentile is 0
    assert forecast.error_s("", clock.now) == 0.0
    for _ in range(9):
        forecast.erred("", -0.6, clock.now)
    forecast.erred("", 0.3, clock.now)  # one late among ten early: not the 75th percentile
    assert forecast.error_s("", clock.now) == pytest.approx(-0.6)


def test_errors_are_kept_per_class_bounded_and_forgotten_with_age() -> None:
    clock = ManualClock()
    config = FairQueueConfig()
    forecast = StartForecast(config)
    forecast.heard("piper", 0.2, 0.0, clock.now)
    for _ in range(3 * config.first_audio_samples):
        forecast.erred("piper", -0.5, clock.now)
    forecast.erred("kokoro", 2.0, clock.now)  # a class never heard keeps no errors
    assert forecast.error_s("piper", clock.now) == pytest.approx(-0.5)
    assert forecast.error_s("kokoro", clock.now) == 0.0
    clock.now += config.first_audio_memory_s + 1.0
    assert forecast.error_s("piper", clock.now) == 0.0
