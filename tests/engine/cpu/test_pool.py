"""UrgencyPool: earliest deadline first, a look-ahead giving its worker up, cancellation, shutdown."""

from __future__ import annotations

import threading
import time

import pytest
from support.waits import until_blocking

from engine.cpu.pool import Preempted, UrgencyPool


def test_queued_jobs_run_earliest_deadline_first() -> None:
    pool = UrgencyPool(1)
    gate = threading.Event()
    order: list[str] = []
    blocker = pool.submit(0.0, gate.wait)  # holds the only worker while the others queue
    futures = [pool.submit(d, lambda n=n: order.append(n)) for n, d in (("late", 9.0), ("soon", 1.0),
                                                                         ("mid", 5.0), ("soon2", 1.0))]
    gate.set()
    for f in [blocker, *futures]:
        f.result(timeout=5)
    assert order == ["soon", "soon2", "mid", "late"]  # equal deadlines keep submission order
    pool.shutdown()


def test_owners_counts_those_with_a_job_queued_or_running() -> None:
    pool = UrgencyPool(1)
    gate, running = threading.Event(), threading.Event()
    assert pool.owners() == 0 and pool.owners(also="me") == 1
    blocker = pool.submit(0.0, lambda: (running.set(), gate.wait(5)), owner="a")
    assert running.wait(5)
    queued = [pool.submit(1.0, lambda: None, owner=o) for o in ("b", "b", "c")]
    queued.append(pool.submit(1.0, lambda: None, owner="d", first_audio=True))
    assert pool.owners() == 4  # a running, b twice, c and d queued
    assert pool.owners(also="b") == 4 and pool.owners(also="e") == 5
    gate.set()
    for f in [blocker, *queued]:
        f.result(timeout=5)
    until_blocking(lambda: pool.owners() == 0, "every owner gone", 5)  # a worker sets its job's result, then leaves it
    pool.shutdown()


def test_a_rescheduled_job_takes_its_new_place_and_only_queued_jobs_move() -> None:
    now = [100.0]  # a fake clock: the guard's line does not move while the test runs
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []
    blocker = pool.submit(0.0, lambda: (started.set(), gate.wait(10)))
    assert started.wait(5)
    mid = pool.submit(104.0, lambda: order.append("mid"))
    late = pool.submit(109.0, lambda: order.append("late"))
    first = pool.submit(100.0, lambda: order.append("first"), first_audio=True)
    assert pool.reschedule(late, 100.5)  # its owner learnt it is due sooner
    assert not pool.reschedule(blocker, 0.0)  # running: no place in line to move
    assert pool.reschedule(first, 103.0)  # its owner's audio is out: it joins the playing streams' line
    gate.set()
    for f in (blocker, mid, late, first):
        f.result(timeout=5)
    assert order == ["late", "first", "mid"]  # due within the guard first; then by deadline
    assert not pool.reschedule(late, 0.0)  # done
    pool.shutdown()


@pytest.mark.parametrize(("first_run_s", "order"), [(3.0, ["playing", "new"]), (0.2, ["new", "playing"])])
def test_a_long_first_audio_job_waits_while_a_playing_stream_would_run_dry_during_it(
        first_run_s: float, order: list[str]) -> None:
    # A job that cannot give its worker up (no yield_to) runs to its end. A newcomer's Kokoro piece
    # that runs 3 s, started now, leaves a playing stream due in 2 s dry (a sentence-mode continuation
    # heard a 2.4 s gap so): that stream goes first. A short newcomer's piece still goes before it, as
    # the guard allows.
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, started = threading.Event(), threading.Event()
    ran: list[str] = []
    blocker = pool.submit(0.0, lambda: (started.set(), gate.wait(10)))
    assert started.wait(5)
    futures = [pool.submit(102.0, lambda: ran.append("playing"), run_s=0.3),
               pool.submit(100.0, lambda: ran.append("new"), first_audio=True, run_s=first_run_s)]
    gate.set()
    for f in [blocker, *futures]:
        f.result(timeout=5)
    assert ran == order
    pool.shutdown()


def test_first_audio_jobs_run_before_playing_streams_that_have_time() -> None:
    # A listener that has heard nothing goes before one whose audio lasts past the guard (fake clock).
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []
    blocker = pool.submit(0.0, lambda: (started.set(), gate.wait(10)))
    assert started.wait(5)  # running, not queued: it is no one's "ahead"
    futures = [pool.submit(d, lambda n=n: order.append(n), owner=n, first_audio=f)
               for n, d, f in (("comfy", 104.0, False), ("new", 100.0, True), ("new2", 100.5, True))]
    assert pool.ahead(futures[0]) == 2 and pool.ahead(futures[2]) == 1 and pool.ahead(futures[1]) == 0
    gate.set()
    for f in [blocker, *futures]:
        f.result(timeout=5)
    assert order == ["new", "new2", "comfy"]
    assert pool.ahead(futures[0]) is None  # no longer queued
    pool.shutdown()


def test_cancelled_and_failing_jobs() -> None:
    pool = UrgencyPool(1)
    gate = threading.Event()
    ran: list[int] = []
    pool.submit(0.0, gate.wait)
    queued = pool.submit(1.0, lambda: ran.append(1))
    assert queued.cancel()

    def boom() -> None:
        raise ValueError("boom")

    failing = pool.submit(2.0, boom)
    gate.set()
    with pytest.raises(ValueError, match="boom"):
        failing.result(timeout=5)
    assert ran == []
    pool.shutdown()


def test_shutdown_cancels_queued_jobs_and_refuses_new_ones() -> None:
    pool = UrgencyPool(1)
    gate = threading.Event()
    started = threading.Event()
    running = pool.submit(0.0, lambda: (started.set(), gate.wait()))
    queued = pool.submit(1.0, lambda: None)
    assert started.wait(5)
    threading.Timer(0.05, gate.set).start()
    pool.shutdown(wait=True)
    assert running.done() and not running.cancelled()
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(0.0, lambda: None)


def test_the_pool_is_strained_while_first_audio_or_a_due_job_waits_and_counts_busy_time() -> None:
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, started = threading.Event(), threading.Event()
    blocker = pool.submit(0.0, lambda: (started.set(), gate.wait(10)))
    assert started.wait(5)
    assert not pool.strained()  # a running job alone: nothing waits
    comfy = pool.submit(105.0, lambda: None)
    assert not pool.strained()  # queued, but due well after the guard
    now[0] = 104.5
    assert pool.strained()  # now due within the guard, and no worker free
    gate.set()
    for f in (blocker, comfy):
        f.result(timeout=5)
    assert not pool.strained()
    gate.clear()
    started.clear()
    blocker = pool.submit(0.0, lambda: (started.set(), gate.wait(10)))
    assert started.wait(5)
    newcomer = pool.submit(200.0, lambda: None, first_audio=True)
    assert pool.strained()  # a listener who has heard nothing waits for a worker
    gate.set()
    for f in (blocker, newcomer):
        f.result(timeout=5)
    assert pool.busy_seconds() > 0
    pool.shutdown()


def test_the_pool_says_how_long_it_takes_to_catch_up_with_its_urgent_work() -> None:
    # One worker runs a job expected to end in 0.4 s; behind it wait a first piece (0.2 s) and a playing
    # stream's piece due within the guard (0.3 s): a newcomer could start once all three have run. A job
    # due after the guard, or a worker free, is not behind anything.
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, started = threading.Event(), threading.Event()
    blocker = pool.submit(0.0, lambda: (started.set(), gate.wait(10)), run_s=0.5)
    assert started.wait(5)
    now[0] += 0.1
    assert pool.behind_s(job_s=9.0) == 0.0  # nothing waits
    later = pool.submit(110.0, lambda: None, run_s=0.3)
    assert pool.behind_s(job_s=9.0) == 0.0  # queued, due well after the guard
    first = pool.submit(200.0, lambda: None, first_audio=True, run_s=0.2)
    due = pool.submit(100.5, lambda: None, run_s=0.3)
    assert pool.strained() and pool.behind_s(job_s=9.0) == pytest.approx(0.4 + 0.2 + 0.3)
    unknown = pool.submit(100.6, lambda: None)  # no run time stated: the engine's measured long job
    assert pool.behind_s(job_s=1.0) == pytest.approx(0.4 + 0.2 + 0.3 + 1.0)
    gate.set()
    for f in (blocker, later, first, due, unknown):
        f.result(timeout=5)
    assert pool.behind_s(job_s=9.0) == 0.0
    pool.shutdown()


class LookAhead:
    """A running job that gives its worker up when asked (as a Kokoro look-ahead run aborts): a run
    asked stops and raises Preempted; one not asked runs whole (until `finish`)."""

    def __init__(self, answer: bool = True) -> None:
        self.answer, self.runs, self.asks, self.started = answer, 0, 0, threading.Event()
        self.finish = threading.Event()

    def __call__(self) -> str:
        self.runs += 1
        self.started.set()
        while not self.finish.is_set():
            if self.asks >= self.runs:  # the pool asks a run at most once: this one was
                raise Preempted
            self.finish.wait(0.01)
        return "whole"

    def yield_to(self) -> bool:
        if self.answer:
            self.asks += 1
        return self.answer

    def wait_runs(self, runs: int) -> None:
        until_blocking(lambda: self.runs >= runs, lambda: f"run {runs} (ran {self.runs})", 5)


def pool_with_a_running(job: LookAhead, deadline: float, run_s: float = 3.0) -> tuple[UrgencyPool, list[float]]:
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    future = pool.submit(deadline, job, run_s=run_s, yield_to=job.yield_to)
    assert job.started.wait(5)
    job.future = future  # type: ignore[attr-defined]
    return pool, now


def test_a_running_look_ahead_gives_its_worker_up_to_an_urgent_job_and_runs_again_whole() -> None:
    job = LookAhead()
    pool, _ = pool_with_a_running(job, deadline=110.0)  # seconds to spare
    ran: list[str] = []
    urgent = pool.submit(100.5, lambda: ran.append("urgent"), run_s=0.3)
    assert urgent.result(timeout=5) is None and ran == ["urgent"]
    job.finish.set()
    assert job.future.result(timeout=5) == "whole" and job.runs == 2  # type: ignore[attr-defined]
    pool.shutdown()


@pytest.mark.parametrize(("deadline", "run_s", "answer", "now", "due", "why"), [
    (101.0, 3.0, True, 100.0, 100.5, "it could not start again by its own deadline"),
    (110.0, 0.1, True, 100.0, 100.5, "it is about to be over"),
    (110.0, 1.0, True, 100.0, 101.0, "it is over before the urgent one must start"),
    (110.0, 3.0, True, 101.6, 102.1, "it has run past half its time: more would be thrown away"),
    (110.0, 3.0, False, 100.0, 100.5, "it has made audio already: it cannot"),
])  # fmt: skip
def test_a_running_job_keeps_its_worker(deadline: float, run_s: float, answer: bool, now: float, due: float,
                                        why: str) -> None:
    job = LookAhead(answer)
    pool, clock = pool_with_a_running(job, deadline, run_s)
    clock[0] = now
    ran: list[str] = []
    urgent = pool.submit(due, lambda: ran.append("urgent"), run_s=0.3)
    assert pool.settled(5)  # the planner has looked at the urgent job, and decided
    assert not urgent.done() and job.runs == 1 and job.asks == 0, why
    job.finish.set()
    urgent.result(timeout=5)
    assert job.runs == 1 and job.future.result(timeout=5) == "whole"  # type: ignore[attr-defined]
    pool.shutdown()


@pytest.mark.parametrize(("urgent_first", "yields"), [(False, True), (True, False)])
def test_a_newcomers_first_audio_gives_its_worker_up_to_a_playing_streams_piece_not_to_another_newcomer(
    urgent_first: bool, yields: bool
) -> None:
    # Sentence by sentence on a busy cpu engine: a listener's next English sentence, due within the
    # guard, waited for a worker while both ran newcomers' Kokoro first pieces, whose deadline (their age,
    # long past) said they could never run again in time: its listener heard a gap. A newcomer has no
    # listener to run dry yet; another newcomer waits its turn, first come.
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    job = LookAhead()
    newcomer = pool.submit(97.0, job, first_audio=True, run_s=3.0, yield_to=job.yield_to)  # its age: past
    assert job.started.wait(5)
    urgent = pool.submit(100.5, lambda: "urgent", first_audio=urgent_first, run_s=0.3)
    if yields:
        assert urgent.result(timeout=5) == "urgent"  # it ran while the newcomer's run waited
        job.wait_runs(2)  # the newcomer's piece runs again, whole
    else:
        assert pool.settled(5)  # the planner has looked at the urgent job, and decided
        assert not urgent.done() and job.runs == 1 and job.asks == 0
    job.finish.set()
    assert urgent.result(timeout=5) == "urgent" and newcomer.result(timeout=5) == "whole"
    pool.shutdown()


def test_a_job_with_time_to_spare_waits_and_the_watcher_frees_a_worker_once_it_falls_due() -> None:
    job = LookAhead()
    pool, now = pool_with_a_running(job, deadline=120.0, run_s=10.0)
    later = pool.submit(105.0, lambda: "later", run_s=0.3)  # due in 5 s: it waits its turn
    assert pool.settled(5)
    assert not later.done() and job.runs == 1 and job.asks == 0
    now[0] = 104.5  # now it falls due: the fake clock's move is told (a real one's is the plan's timer)
    pool.wake()
    assert later.result(timeout=1) == "later"
    job.finish.set()
    assert job.future.result(timeout=5) == "whole" and job.runs == 2  # type: ignore[attr-defined]
    pool.shutdown()


def test_the_plans_timer_frees_a_worker_when_a_job_falls_due_with_no_event() -> None:
    # Nothing happens between the submit and the moment the job falls within the guard: the planning
    # thread wakes at the time its plan named (`CpuPlan.wake_at`), no sooner, and not by polling.
    job = LookAhead()
    pool = UrgencyPool(1, guard_s=1.0)  # the real monotonic clock
    running = pool.submit(time.monotonic() + 60, job, run_s=10.0, yield_to=job.yield_to)
    assert job.started.wait(5)
    queued_at = time.monotonic()
    later = pool.submit(queued_at + 1.0 + 0.3, lambda: time.monotonic(), run_s=0.1)  # due within the guard in 0.3 s
    ran_at = later.result(timeout=5)
    assert 0.25 <= ran_at - queued_at < 1.0
    job.finish.set()
    assert running.result(timeout=5) == "whole" and job.runs == 2
    pool.shutdown()


@pytest.mark.parametrize(("first_ran", "then_ran", "again"), [
    (0.2, 0.4, True),  # 0.6 s thrown away in all, of 3: a moment into each run, it gives its worker up again
    (1.0, 0.6, False),  # 1.6 s would be, past half its run: it keeps its worker
])  # fmt: skip
def test_a_job_throws_away_at_most_half_its_run_in_all(first_ran: float, then_ran: float, again: bool) -> None:
    # Yielding once only, both workers restarted long Kokoro runs that had yielded before, and a due
    # English piece (its listener's next sentence) waited 2 s behind them: a 1 s gap.
    job = LookAhead()
    pool, now = pool_with_a_running(job, deadline=110.0)
    now[0] += first_ran
    assert pool.submit(now[0] + 0.5, lambda: "first", run_s=0.3).result(timeout=5) == "first"
    job.wait_runs(2)
    now[0] += then_ran
    second = pool.submit(now[0] + 0.5, lambda: "second", run_s=0.3)
    if again:
        assert second.result(timeout=5) == "second"
        job.wait_runs(3)
    else:
        assert pool.settled(5)  # the planner has looked at the second urgent job, and decided
        assert not second.done() and job.runs == 2 and job.asks == 1
    job.finish.set()
    assert second.result(timeout=5) == "second" and job.future.result(timeout=5) == "whole"  # type: ignore[attr-defined]
    assert job.runs == (3 if again else 2)
    pool.shutdown()


def test_a_queued_job_is_expected_to_start_once_the_jobs_before_it_have_run() -> None:
    now = [100.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, started = threading.Event(), threading.Event()
    running = pool.submit(0.0, lambda: (started.set(), gate.wait(10)), run_s=2.0)
    assert started.wait(5)
    later = pool.submit(105.0, lambda: None, run_s=0.3)
    due = pool.submit(100.5, lambda: None, run_s=0.5)  # queued after, goes before: it is due
    now[0] = 100.5  # the running job has 1.5 s left
    assert pool.expected_start(due) == pytest.approx(102.0)
    assert pool.expected_start(later) == pytest.approx(102.5)
    assert pool.expected_start(running) is None  # not queued
    gate.set()
    for f in (running, later, due):
        f.result(timeout=5)
    assert pool.expected_start(later) is None
    pool.shutdown()


def test_a_worker_is_expected_free_when_the_soonest_running_job_is_over_each_stretched() -> None:
    # A next piece of text still to come waits for a worker too; runs go past their estimates.
    now = [100.0]
    pool = UrgencyPool(2, guard_s=1.0, clock=lambda: now[0])
    assert pool.expected_free() == 100.0  # idle
    gate, started = threading.Event(), threading.Semaphore(0)
    long = pool.submit(0.0, lambda: (started.release(), gate.wait(10)), run_s=2.0)
    assert started.acquire(timeout=5)
    assert pool.expected_free() == 100.0  # one worker still idle
    short = pool.submit(0.0, lambda: (started.release(), gate.wait(10)), run_s=1.0)
    assert started.acquire(timeout=5)
    now[0] = 100.5
    assert pool.expected_free() == pytest.approx(101.0)  # the 1 s run, half over
    assert pool.expected_free(stretch=1.5) == pytest.approx(101.5)  # taken to run 1.5 s
    queued = pool.submit(0.0, lambda: None, run_s=1.0)
    assert pool.expected_start(queued, stretch=1.5) == pytest.approx(101.5)
    now[0] = 102.5  # both past their estimates and not yet over: a worker is taken to be free at once
    assert pool.expected_free(stretch=1.5) == pytest.approx(102.5)
    gate.set()
    for f in (long, short, queued):
        f.result(timeout=5)
    pool.shutdown()


def test_a_watched_bell_rings_at_each_event_that_moves_a_queued_jobs_start() -> None:
    # A held first audio sleeps on its bell: a job queued, started or over moves its pieces' expected
    # starts, so each rings it; once unwatched, none does.
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: 0.0)
    bell = threading.Event()
    pool.watch(bell)
    gate = threading.Event()
    running = pool.submit(0.0, gate.wait)
    assert bell.wait(5)  # queued (and started)
    bell.clear()
    queued = pool.submit(5.0, lambda: None)
    assert bell.wait(5)
    bell.clear()
    gate.set()
    running.result(timeout=5)
    queued.result(timeout=5)
    assert bell.wait(5)  # over
    pool.unwatch(bell)
    bell.clear()
    pool.submit(1.0, lambda: None).result(timeout=5)
    assert not bell.is_set()
    pool.shutdown()
