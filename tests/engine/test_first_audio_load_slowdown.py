"""How much a stream's first audio slows beside a loaded engine, as this box measures it
(engine/start_forecast.py `load_slowdown`, `StartForecast.load_slowdown`): fake clock, the policy's
defaults (prior 0.5 s alone, slowdown prior 1.0: twice as long beside a full engine; SLO 1.5 s)."""

from __future__ import annotations

import pytest

from engine.fair_queue import FairQueue, FairQueueConfig, Refused
from engine.start_forecast import StartForecast, load_slowdown
from tests.support.clocks import ManualClock


def queue(clock: ManualClock, **knobs: float) -> FairQueue:
    return FairQueue(FairQueueConfig(first_audio_slo_s=1.5, **knobs), clock)  # type: ignore[arg-type]


def run_box(q: FairQueue, clock: ManualClock, heard_after: float, slows: float, rounds: int) -> int:
    """`rounds` of as many streams as the queue admits at once beside each other (up to 4 of 4), each
    heard `heard_after × (1 + slows × busy)` after it started, then all ended. The most admitted in one."""
    most = 0
    for _ in range(rounds):
        started = []
        for _ in range(4):
            try:
                w = q.push("a", 1.0, 4)
            except Refused:
                break
            if w.state != "admitted":
                q.withdraw(w)
                break
            started.append(w)
        most = max(most, len(started))
        due = sorted((heard_after * (1.0 + slows * w.busy), i) for i, w in enumerate(started))
        t0 = clock.now
        for at, i in due:
            clock.now = t0 + at
            q.heard(started[i])
        for w in started:
            q.finish(w)
        clock.now += 0.25
    return most


def test_a_box_whose_first_audio_does_not_slow_with_load_admits_its_whole_capacity_once_measured() -> None:
    # Heard 0.9 s after starting at any load. The configured slowdown (1.0) says 1.8 s beside a full
    # engine, past the SLO, so at first a leader starts beside at most two of four; measured at several
    # loads, the box is believed and four start together, every one heard within the SLO.
    clock = ManualClock()
    q = queue(clock)
    for _ in range(4):  # measured alone first: 0.9 s, so 1.8 s beside a full engine as configured
        w = q.push("a", 1.0, 4)
        clock.now += 0.9
        q.heard(w)
        q.finish(w)
    assert run_box(q, clock, 0.9, slows=0.0, rounds=1) == 3
    assert run_box(q, clock, 0.9, slows=0.0, rounds=30) == 4
    assert q.forecast.load_slowdown() < 0.5
    assert q.forecast.own_s("", 1.0, clock.now) <= 1.5


def test_a_box_whose_first_audio_slows_more_than_configured_is_believed() -> None:
    # Heard 0.4 s alone, three times that beside a full engine (slowdown 2, where 1 is configured): the
    # forecast beside a full engine grows toward 1.2 s, not the configured 0.8 s.
    clock = ManualClock()
    q = queue(clock)
    run_box(q, clock, 0.4, slows=2.0, rounds=30)
    assert q.forecast.load_slowdown() > 1.5
    assert q.forecast.own_s("", 0.75, clock.now) == pytest.approx(0.4 * (1 + 2.0 * 0.75), rel=0.2)


def test_a_server_that_only_ever_ran_at_one_load_keeps_the_configured_slowdown() -> None:
    # Every measurement alone: nothing says how load slows, so beside a full engine it is the prior's.
    clock = ManualClock()
    forecast = StartForecast(FairQueueConfig())
    for _ in range(40):
        clock.now += 1.0
        forecast.heard("", 0.3, 0.0, clock.now)
    assert forecast.load_slowdown() == 1.0
    assert forecast.own_s("", 1.0, clock.now) == pytest.approx(2 * forecast.alone_s("", clock.now))


def test_one_stream_heard_late_beside_a_full_engine_does_not_make_the_box_slow_with_load() -> None:
    # Medians: a long hold among a dozen measurements at load is not how load slows the box.
    samples = [(0.0, 0.3)] * 12 + [(0.9, 0.3)] * 11 + [(0.9, 3.0)]
    assert load_slowdown(samples, prior=1.0, prior_weight=4.0, most=10.0) < 0.5


def test_the_measured_slowdown_outweighs_the_prior_as_measurements_spread_over_loads() -> None:
    flat = [(0.0, 0.3), (1.0, 0.3)]  # no slowdown, measured at both ends of the load
    assert load_slowdown(flat * 2, prior=1.0, prior_weight=4.0, most=10.0) == pytest.approx(4 / 6)  # two a half: 2 vs 4
    assert load_slowdown(flat * 12, prior=1.0, prior_weight=4.0, most=10.0) == pytest.approx(4 / 16)  # twelve: 12 vs 4
    near = [(0.5, 0.3), (0.6, 0.3)] * 12  # twelve a half, but 0.1 apart in load: worth 0.12
    assert load_slowdown(near, prior=1.0, prior_weight=4.0, most=10.0) == pytest.approx(4 / 4.12)
    faster = [(0.0, 0.6), (1.0, 0.3)] * 50  # quicker beside load (a warm cache): never below 0
    assert 0.0 <= load_slowdown(faster, prior=1.0, prior_weight=4.0, most=10.0) < 0.1


def test_the_slowdown_is_the_line_through_both_halves_not_their_ratio() -> None:
    # 0.4 s alone, slowdown 2, measured at loads 0.5 to 1.0 only: the halves' ratio (1.83 at loads 0.6
    # and 0.9) is the line's, not k; the line through them, extrapolated to an idle engine, is k = 2.
    samples = [(b, 0.4 * (1 + 2.0 * b)) for b in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)] * 40
    worth = 120 * 0.3**2  # 120 a half, 0.3 apart in load: 10.8 against the prior's 4
    expected = (worth * 2.0 + 4.0 * 1.0) / (worth + 4.0)
    assert load_slowdown(samples, prior=1.0, prior_weight=4.0, most=10.0) == pytest.approx(expected)
    steep = [(0.5, 0.1), (1.0, 5.0)] * 40  # steeper than any line through 0 s at idle: believed at most `most`
    worth = 40 * 0.5**2
    assert load_slowdown(steep, prior=1.0, prior_weight=4.0, most=10.0) == pytest.approx((worth * 10 + 4) / (worth + 4))


def test_the_slowdown_is_measured_per_class_of_voice() -> None:
    # Kokoro's pieces share the workers with the load; Piper's are short enough not to notice it.
    clock = ManualClock()
    forecast = StartForecast(FairQueueConfig())
    for i in range(40):
        clock.now += 1.0
        busy = (i % 2) * 0.9
        forecast.heard("piper", 0.2, busy, clock.now)
        forecast.heard("kokoro", 1.0 * (1 + 2.0 * busy), busy, clock.now)
    assert forecast.load_slowdown("piper") < 0.3 < 1.5 < forecast.load_slowdown("kokoro")
    assert forecast.load_slowdown("never-heard") == 1.0


def test_measurements_older_than_the_memory_no_longer_set_the_slowdown() -> None:
    clock = ManualClock()
    forecast = StartForecast(FairQueueConfig())
    for i in range(40):  # a busy spell that slowed first audio threefold
        clock.now += 1.0
        busy = (i % 2) * 1.0
        forecast.heard("", 0.3 * (1 + 2.0 * busy), busy, clock.now)
    assert forecast.load_slowdown() > 1.5
    clock.now += forecast.config.first_audio_memory_s + 1.0
    for i in range(40):  # the other work has gone: load no longer slows it
        clock.now += 1.0
        busy = (i % 2) * 1.0
        forecast.heard("", 0.3, busy, clock.now)
    assert forecast.load_slowdown() < 0.3
