"""The first-audio SLO's forecast of a stream's own time to first audio, as this box measures it
(engine/start_forecast.py, `FairQueue.slo_capacity`): fake clock, the policy's defaults (prior 0.5 s
alone, twice that beside a full engine, SLO 1.5 s) unless a test says otherwise."""

from __future__ import annotations

import pytest

from engine.fair_queue import FairQueue, FairQueueConfig, Refused, Waiter
from engine.listening import ListenerTimeline
from tests.support.clocks import ManualClock


def queue(clock: ManualClock, **knobs: float) -> FairQueue:
    return FairQueue(FairQueueConfig(first_audio_slo_s=1.5, **knobs), clock)  # type: ignore[arg-type]


def measure_alone(q: FairQueue, clock: ManualClock, *heard_after_s: float) -> None:
    """Streams started one at a time on an idle engine, each heard after the given seconds, then ended."""
    for s in heard_after_s:
        w = q.push("m", 1.0, 4)
        assert w.state == "admitted" and q.in_flight == 1
        clock.now += s
        q.heard(w)
        q.finish(w)


def admit_at_once(q: FairQueue, n: int, capacity: float = 4, key: str = "a") -> list[Waiter]:
    started = [q.push(key, 1.0, capacity) for _ in range(n)]
    assert all(w.state == "admitted" for w in started)
    return started


def test_a_fresh_server_uses_the_prior_and_admits_up_to_the_engines_capacity() -> None:
    clock = ManualClock()
    q = queue(clock)
    assert q.first_audio_tail_s() == pytest.approx(0.5)  # nothing measured: the prior
    assert q.slo_capacity(4) == 4  # 0.5 s alone, 1.0 s beside a full engine: within 1.5 s
    admit_at_once(q, 4)


def test_a_box_running_at_half_speed_refuses_what_it_can_no_longer_start_within_the_slo() -> None:
    # Streams alone are heard in 1.0 s, twice the prior: beside half the capacity a stream takes 1.5 s,
    # beside more it would miss. The engine's own word (4 streams) no longer says what fits.
    clock = ManualClock()
    q = queue(clock)
    measure_alone(q, clock, 1.0, 1.0, 1.0, 1.0)
    assert q.first_audio_tail_s() == pytest.approx(1.0)
    assert q.slo_capacity(4) == pytest.approx(3.0)  # half of it in flight, plus the one starting
    admit_at_once(q, 3)  # beside 0, 1 and 2 of 4: heard in 1.0, 1.25 and 1.5 s
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 4)  # beside three: its own 1.75 s, or waiting for room and then 1.5 s
    assert e.value.bound == "slo" and e.value.predicted_s is not None and e.value.predicted_s > 1.5
    assert q.waiting == 0  # refused as it asked, not after waiting


def test_continuations_keep_the_engines_whole_capacity_where_the_slo_shrinks_a_leaders_room() -> None:
    # The SLO's room is for leaders: a reply already heard needs its next sentence in time, or it has a
    # gap (a continuation refused, or let wait for a room only leaders are judged by, cuts the reply).
    clock = ManualClock()
    q = queue(clock)
    measure_alone(q, clock, 1.0, 1.0, 1.0, 1.0)  # a leader's room: 3 of 4
    admit_at_once(q, 3)
    with pytest.raises(Refused):
        q.push("b", 1.0, 4)  # a leader
    player = object()
    nxt = q.push("c", 1.0, 4, timeline=ListenerTimeline(clock.now + 0.5), listener=player)
    assert nxt.state == "admitted"  # its listener hears speech: the engine's fourth slot


def test_one_slow_outlier_does_not_close_the_door_but_the_box_slowing_down_does() -> None:
    clock = ManualClock()
    q = queue(clock)
    measure_alone(q, clock, *[0.3] * 10, 5.0)  # one stream stalled (a page fault, a GC pause)
    assert q.first_audio_tail_s() <= 0.5 and q.slo_capacity(4) == 4
    measure_alone(q, clock, 5.0)  # a second in a row: the box, not an outlier
    assert q.first_audio_tail_s() == pytest.approx(5.0)
    assert q.slo_capacity(4) < 2  # room for one alone


def test_one_slow_stream_on_a_fresh_server_does_not_close_the_door() -> None:
    clock = ManualClock()
    q = queue(clock)
    measure_alone(q, clock, 4.0)  # weighed against the prior's two: not yet the box's speed
    assert q.first_audio_tail_s() == pytest.approx(0.5) and q.slo_capacity(4) == 4


def test_a_box_too_slow_for_any_stream_still_starts_one_alone_and_refuses_the_rest_at_once() -> None:
    # Refusing the lone stream too would refuse everything and never measure the box again.
    clock = ManualClock()
    q = queue(clock)
    measure_alone(q, clock, 3.0, 3.0, 3.0)
    alone = q.push("a", 1.0, 4)
    assert alone.state == "admitted"
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 4)
    assert e.value.bound == "slo" and e.value.predicted_s is not None and e.value.predicted_s >= 3.0
    assert e.value.retry_after_s > 0  # once the one in flight has ended


def test_a_box_that_sped_up_reopens_as_its_slow_measurements_age() -> None:
    clock = ManualClock()
    q = queue(clock)
    measure_alone(q, clock, 3.0, 3.0, 3.0)
    assert q.slo_capacity(4) < 2
    clock.now += q.config.first_audio_memory_s  # the other work on the box has gone
    measure_alone(q, clock, 0.4)  # the lone streams it still starts are fast again
    assert q.first_audio_tail_s() == pytest.approx(0.5) and q.slo_capacity(4) == 4


def test_first_audio_measured_beside_a_full_engine_is_not_taken_for_the_speed_alone() -> None:
    # Two streams each started beside three of four were heard in 1.75 s: 1.0 s alone, not 1.75 s.
    clock = ManualClock()
    q = queue(clock)
    for _ in range(2):
        *others, last = admit_at_once(q, 4)
        clock.now += 1.75
        q.heard(last)
        for w in (*others, last):
            q.finish(w)
    assert q.first_audio_tail_s() == pytest.approx(1.0)


def test_without_an_slo_the_measured_speed_does_not_shrink_the_room() -> None:
    clock = ManualClock()
    q = FairQueue(FairQueueConfig(), clock)
    measure_alone(q, clock, 3.0, 3.0, 3.0)
    assert q.slo_capacity(4) == 4
    admit_at_once(q, 4)


def test_where_the_box_runs_as_measured_every_stream_admitted_after_learning_it_is_heard_within_the_slo() -> None:
    # A box twice as slow as the prior (1.0 s alone, 2.0 s beside a full engine), streams holding their
    # slot 2 s, one asking every 0.25 s (twice what four slots serve). Once its speed is measured, every
    # stream admitted is heard within 1.5 s; the rest are refused as they ask. Exact binary times.
    clock = ManualClock()
    q = queue(clock)
    step, running, waited = 0.0625, [], []
    heard_in: list[tuple[float, float]] = []  # (started at, heard after asking)
    refused = 0
    for i in range(int(24 / step)):
        if i * step % 0.25 == 0 and i * step < 20:
            try:
                w = q.push("a", 1.0, 4)
            except Refused:
                refused += 1
            else:
                due = clock.now + 1.0 * q.forecast.slowdown(w.busy)
                (running if w.state == "admitted" else waited).append((w, due))
        for w, _ in [r for r in running if clock.now - (r[0].started_at or 0.0) >= 2.0]:
            running = [r for r in running if r[0] is not w]
            q.release(w, 4)
        q.look(4)
        for w, _ in [r for r in waited if r[0].state == "admitted"]:
            waited = [r for r in waited if r[0] is not w]
            assert w.started_at is not None
            running.append((w, w.started_at + 1.0 * q.forecast.slowdown(w.busy)))
        for w, due in running:
            if clock.now >= due and not w.heard:
                q.heard(w)
                assert w.started_at is not None
                heard_in.append((w.started_at, clock.now - w.enqueued_at))
        clock.now += step
    learned = [s for at, s in heard_in if at >= 1000.0 + 4.0]  # a few streams measured by then
    assert refused > 0 and len(learned) >= 20
    assert max(learned) <= 1.5 + 1e-9


def long_streams_in_flight(q: FairQueue, clock: ManualClock, n: int, capacity: float, hold_s: float) -> list[Waiter]:
    """`n` streams admitted together after the queue learnt that streams hold their slots `hold_s`."""
    for _ in range(6):  # the running mean of how long a stream holds its slot
        w = q.push("m", 1.0, capacity)
        clock.now += hold_s
        q.finish(w)
    return admit_at_once(q, n, capacity)


def test_a_newcomer_waits_out_an_engine_catching_up_instead_of_being_refused() -> None:
    # The engine has room (4 of 10) but is a moment behind its urgent work (a first piece waiting for a
    # worker): the newcomer cannot start now, and will once that moment (0.3 s) has passed, long before
    # any of the 6 s streams in flight ends. Judged by those ends, it would be refused at once.
    clock = ManualClock()
    q = queue(clock)
    long_streams_in_flight(q, clock, 6, 10, hold_s=6.0)
    q.engine_behind(0.3)
    assert not q.fits(1.0, 10)
    w = q.push("b", 1.0, 10)
    assert w.state == "waiting"  # not refused: its start is predicted at 0.3 s
    assert q.start_of(w, 10) == pytest.approx(clock.now + 0.3)
    clock.now += 0.3
    q.engine_behind(0.0)
    assert q.look(10) == [] and w.state == "admitted"


def test_an_engine_behind_for_longer_than_the_slo_allows_refuses_a_newcomer_at_once() -> None:
    clock = ManualClock()
    q = queue(clock)
    long_streams_in_flight(q, clock, 6, 10, hold_s=6.0)
    q.engine_behind(1.4)  # 1.4 s to catch up, then its own first audio: past 1.5 s
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 10)
    assert e.value.bound == "slo" and e.value.predicted_s == pytest.approx(1.4 + q.forecast.own_s("", 0.6, clock.now))


def test_an_idle_engine_starts_a_stream_alone_whatever_it_says_of_catching_up() -> None:
    clock = ManualClock()
    q = queue(clock)
    q.engine_behind(5.0)  # nothing in flight: nothing to catch up with that a stream alone would wait for
    assert q.push("a", 1.0, 4).state == "admitted"
