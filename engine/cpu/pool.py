"""A fixed pool of worker threads that runs the most urgent job first.

The CPU voices share one pool among all streams. A FIFO pool would let one stream's look-ahead
segments delay another stream's first audio; this pool orders them instead, from the listener's side
(issue 14: a listener who has started hearing speech must keep hearing it):

1. a playing stream's job whose deadline (the time its listener runs out of audio) falls within
   `guard_s` from now, or within the expected run of the newcomer's job that would take the worker
   instead (a job runs to its end unless it can give its worker up, below: a Kokoro first piece that
   runs 2 s would leave that listener dry) — it is about to run dry, or has: it runs before any newcomer;
2. `first_audio` jobs (a stream whose listener has heard nothing yet), oldest first;
3. every other job, earliest deadline first.

So a newcomer's first piece goes first only while no playing stream is about to run dry. Under
overload (admission in front, gateway/admission.py, keeps the engine below its measured capacity, so
this is the exception) newcomers wait to start rather than playing streams breaking up. Jobs are meant
to be short (a bounded piece of a segment). `guard_s` should be about one job's run time or more: a job
started later than that before its deadline finishes after it.

**A look-ahead run gives its worker up to an urgent job** (`yield_to`). With every worker busy, the
longest running job bounded how long an urgent one waited: a Kokoro look-ahead piece runs 3–7 s on a
busy 2-core box, and an English reply admitted beside a Mandarin one (its Piper piece a tenth of that)
played with a gap while both workers ran Kokoro. Now, when the job that goes next is urgent (a playing
stream's, due within `guard_s`, or a newcomer's first audio) and every worker is busy, the running job
with the most time to spare gives its worker up, if it can still run again, whole, after the urgent one
and start by its own deadline (less `guard_s`; a newcomer's first audio, whose deadline is only its
age, always can for a playing stream's piece: it waits for those in line too), would not be over before
the urgent one must start (nor within `yield_min_s`), and would not throw away, with what its earlier
runs cut short threw away, more than half its expected run time. Its run is aborted (it has made no
audio yet: only its owner can say, `yield_to`), and it goes back in line at its old place. A job may
yield again on a later run within that bound: once only, both workers restarted long Kokoro runs that
had yielded before, and a due English piece waited 2 s behind them (its listener heard a 1 s gap); a
run asked a moment after it started throws almost nothing away.
One planning thread decides: it takes a snapshot of the jobs (queued and running) and asks
engine/cpu/policy.py for a frozen `CpuPlan` (which job goes next, which running job gives its worker
up to it, and when time alone makes the plan stale), carries it out, and sleeps until an event (a job
queued, started, over or moved; the guard changed; `wake`) or the plan's one timer. Workers take the
job the plan names. The rules are the policy's (`plan`, `rank`, `first_goes_next`, `choose_victim`);
this module is their mechanism.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from engine.cpu.policy import DEFAULT, CpuPlan, CpuPolicyConfig, QueuedJob, RunningJob, plan, rank


class Preempted(Exception):
    """Raised by a job that gave its worker up (`yield_to`): the pool puts it back in line to run again."""


@dataclass(eq=False)
class _Job:
    future: Future[Any]
    fn: Callable[[], Any]
    owner: object
    run_s: float  # how long it is expected to run
    first: bool  # a first-audio job
    yield_to: Callable[[], bool] | None  # asks a running job to give its worker up; True: it will
    started: float | None = None  # when it last started (the pool's clock), while it runs
    asked: bool = False  # asked to give its worker up in this run (then it keeps it, whatever it answered)
    yielding: bool = False  # asked, and it said it will: its worker is as good as free
    wasted_s: float = 0.0  # run time thrown away by its runs cut short (the pool's clock)


@dataclass(frozen=True, slots=True)
class QueuedView:
    """A queued job as the pool shows it (`UrgencyPool.queued`)."""

    owner: object
    deadline: float
    first: bool  # a first-audio job
    run_s: float
    future: Future[Any]


# deadline, seq (ties run in submission order, and a job is never compared), the job
_Entry = tuple[float, int, _Job]


class UrgencyPool:
    def __init__(self, workers: int, name: str = "worker", *, guard_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, config: CpuPolicyConfig = DEFAULT) -> None:
        self._config = config
        self._first: list[_Entry] = []  # first_audio jobs
        self._rest: list[_Entry] = []  # jobs of streams already playing (or with no listener tier)
        self._seq = itertools.count()
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # workers wait on it for a job
        self._changed = threading.Condition(lock)  # the planning thread waits on it for an event
        self._settled = threading.Condition(lock)  # `settled` waits on it for the planning thread to sleep
        self._told = 0  # events told the planning thread so far (`_tell`)
        self._planned_for = -1  # while it sleeps: the events its last plan saw (-1: it is awake)
        self._shutdown = False
        self._guard_s = guard_s
        self._clock = clock
        self._workers = workers
        self._busy_s = 0.0  # run time of the jobs finished so far, all workers together
        self._running: dict[int, tuple[float, _Entry]] = {}  # worker thread id → (perf_counter start, its job)
        # Rung at each event that moves a queued job's expected start (`watch`): a few held streams' bells.
        self._watchers: set[threading.Event] = set()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        self._threads.append(threading.Thread(target=self._plan_loop, name=f"{name}-plan", daemon=True))
        for t in self._threads:
            t.start()

    def submit(self, deadline: float, fn: Callable[[], Any], owner: object = None, *,
               first_audio: bool = False, run_s: float = 0.0,
               yield_to: Callable[[], bool] | None = None) -> Future[Any]:
        """Run `fn` once a worker is free and no more urgent job waits (the order in the module doc).
        `deadline` is on the pool's clock; `owner` (say, the stream) only tells `ahead` whose jobs are
        whose; `run_s`: how long it is expected to run. `yield_to`: while `fn` runs, asks it to give its
        worker up (the module doc); True if it will: its run stops and `fn` raises `Preempted`."""
        future: Future[Any] = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("the pool is shut down")
            job = _Job(future, fn, owner, run_s, first_audio, yield_to)
            heapq.heappush(self._first if first_audio else self._rest, (deadline, next(self._seq), job))
            self._cond.notify()
            self._tell()
            self._ring()
        return future

    @property
    def guard_s(self) -> float:
        """A playing stream's job due within this many seconds goes before first-audio jobs (settable: the
        CPU engine keeps it at about two measured job run times)."""
        return self._guard_s

    @guard_s.setter
    def guard_s(self, seconds: float) -> None:
        with self._cond:
            self._guard_s = seconds
            self._tell()
            self._ring()

    def watch(self, bell: threading.Event) -> None:
        """Set `bell` at each event that moves a queued job's expected start (a job queued, started, over
        or moved; `wake`), until `unwatch`: a held first audio's prediction (`expected_start`) looks
        again then, instead of at a fixed interval."""
        with self._cond:
            self._watchers.add(bell)

    def unwatch(self, bell: threading.Event) -> None:
        with self._cond:
            self._watchers.discard(bell)

    def _tell(self) -> None:
        """Under the lock: an event for the planning thread (a job queued, started, over or moved; the
        guard changed; `wake`; shutdown): it plans again."""
        self._told += 1
        self._changed.notify()

    def settled(self, timeout: float) -> bool:
        """Whether the planning thread has planned for every event told it so far, and sleeps, within
        `timeout` (wall seconds): what the pool decides of the jobs as they are now is decided (a victim
        asked to give its worker up, or none). A test's way to check that something does *not* happen,
        without giving the planner a stretch of wall time to do it in."""
        with self._cond:
            return self._settled.wait_for(lambda: self._planned_for == self._told, timeout)

    def _ring(self) -> None:
        """Under the lock: an event (`watch`). An Event's own lock is a leaf: setting it takes no other."""
        for bell in self._watchers:
            bell.set()

    def wake(self) -> None:
        """Plan again now: the clock moved in a way its timer cannot see (a fake clock in tests)."""
        with self._cond:
            self._tell()
            self._ring()

    def reschedule(self, future: Future[Any], deadline: float) -> bool:
        """Move a queued job's deadline (its owner learnt better: the audio before it came out shorter
        than estimated, say). A first-audio job moves to the playing streams' line with it: its owner's
        audio is out, so its listener hears now (a stream's pieces after its first are first-audio jobs
        until then). False when it is not queued (running or done). O(queued jobs), a few dozen."""
        with self._cond:
            for i, entry in enumerate(self._rest):
                if entry[2].future is future:
                    if entry[0] != deadline:
                        self._rest[i] = (deadline, *entry[1:])
                        heapq.heapify(self._rest)
                        self._tell()
                        self._ring()
                    return True
            for i, entry in enumerate(self._first):
                if entry[2].future is future:
                    self._first[i] = self._first[-1]
                    self._first.pop()
                    heapq.heapify(self._first)
                    entry[2].first = False
                    heapq.heappush(self._rest, (deadline, *entry[1:]))
                    self._tell()
                    self._ring()
                    return True
        return False

    def _rank(self, entry: _Entry, first: bool, now: float) -> tuple[int, float, int]:
        """Under the lock: `entry`'s place in line now, smallest first (`policy.rank`)."""
        return rank(entry[0], entry[1], first, now, self._guard_s)

    def _ranked(self, now: float) -> list[tuple[tuple[int, float, int], _Entry]]:
        """Under the lock: every queued job with its place in line now (`_rank`), unsorted."""
        return [(self._rank(e, first, now), e) for first, q in ((True, self._first), (False, self._rest)) for e in q]

    def _plan(self) -> CpuPlan:
        """Under the lock: the policy's plan for the jobs as they are now (`policy.plan`)."""
        queued = [QueuedJob(e[1], e[0], first, e[2].run_s)
                  for first, q in ((True, self._first), (False, self._rest)) for e in q]
        # A run that said it gives its worker up counts as over: one urgent job frees one worker.
        running = [RunningJob(e[1], e[0], job.run_s, job.started, job.wasted_s, job.first,
                              job.yield_to is not None and not job.asked)
                   for _, e in self._running.values() if (job := e[2]).started is not None and not job.yielding]
        return plan(queued, running, self._workers, self._clock(), self._guard_s, self._config)

    def _take(self, key: int) -> _Entry:
        """Under the lock: the queued job `key` out of its queue (the plan names a queue's head)."""
        queue = self._first if self._first and self._first[0][1] == key else self._rest
        assert queue[0][1] == key, "the plan names the head of a queue"
        return heapq.heappop(queue)

    def _plan_loop(self) -> None:
        """The planning thread: plan, ask the victim the plan names to give its worker up, sleep until an
        event or the plan's timer (`CpuPlan.wake_at`)."""
        while True:
            with self._cond:
                if self._shutdown:
                    return
                seen = self._told
                decided = self._plan()
                victim = None if decided.victim is None else self._running_entry(decided.victim)
                if victim is None:
                    wait = None if decided.wake_at is None else max(0.0, decided.wake_at - self._clock())
                    if wait is not None:
                        wait = min(wait, threading.TIMEOUT_MAX)  # a deadline far off: no overflow
                    self._planned_for = seen
                    self._settled.notify_all()
                    self._changed.wait(wait)
                    self._planned_for = -1
                    continue
                job = victim[2]
                job.asked = True
            answer = job.yield_to is not None and job.yield_to()  # outside the lock: it takes its owner's
            with self._cond:
                job.yielding = answer and job.asked  # not if its run is over meanwhile

    def _running_entry(self, key: int) -> _Entry | None:
        """Under the lock: the running job `key`."""
        return next((e for _, e in self._running.values() if e[1] == key), None)

    def expected_start(self, future: Future[Any], stretch: float = 1.0) -> float | None:
        """When (the pool's clock) `future`'s queued job is expected to take a worker: the jobs that go
        before it, in the order they would be taken now, each on the worker free soonest, from when each
        running job is expected to be over. Every job is taken to run `stretch` × its expected run time
        (a run goes past its estimate: `RtfMeter.overrun`). None once it is not queued (running or over).
        O(queued log workers), a few dozen: a stream's first audio asks it while it waits
        (`CpuStream._hold_first`)."""
        with self._cond:
            now = self._clock()
            ranked = sorted(self._ranked(now))
            if not any(e[2].future is future for _, e in ranked):
                return None
            free = self._free_at(now, stretch)
            for _, (_, _, job) in ranked:
                start = heapq.heappop(free)
                if job.future is future:
                    return start
                heapq.heappush(free, start + job.run_s * stretch)
        return None

    def expected_free(self, stretch: float = 1.0) -> float:
        """When (the pool's clock) a worker is expected to be free for a job that goes before every one
        queued (a playing stream's about to run dry): now if one is idle, else when the running job
        expected to be over soonest is, each taken to run `stretch` × its expected run time."""
        with self._cond:
            return self._free_at(self._clock(), stretch)[0]

    def _free_at(self, now: float, stretch: float) -> list[float]:
        """Under the lock: when each worker is expected to be free, soonest first (a heap)."""
        running = [now + max(0.0, e[2].run_s * stretch - (now - (e[2].started or now)))
                   for _, e in self._running.values()]
        return sorted(running + [now] * (self._workers - len(running)))

    def queued(self) -> list[QueuedView]:
        """The jobs queued now: first-audio jobs, then the others, each earliest deadline first."""
        with self._cond:
            return [QueuedView(e[2].owner, e[0], first, e[2].run_s, e[2].future)
                    for first, q in ((True, self._first), (False, self._rest)) for e in sorted(q)]

    def ahead(self, future: Future[Any]) -> int | None:
        """How many other owners have a job queued to run before `future`'s; None once it is not queued."""
        with self._cond:
            ranked = self._ranked(self._clock())
            mine = next((r for r, e in ranked if e[2].future is future), None)
            if mine is None:
                return None
            owner = next(e[2].owner for _, e in ranked if e[2].future is future)
            return len({id(e[2].owner) for r, e in ranked if r < mine and e[2].owner is not owner})

    def owners(self, also: object = None) -> int:
        """How many owners have a job queued or running, counting `also` among them (at least 1 then).
        O(queued jobs), a few dozen."""
        with self._cond:
            jobs = [e[2] for q in (self._first, self._rest) for e in q]
            jobs += [e[2] for _, e in self._running.values()]
            owners = {id(job.owner) for job in jobs}
        if also is not None:
            owners.add(id(also))
        return len(owners)

    def strained(self) -> bool:
        """Whether the pool is behind now: a stream's first audio waits for a worker, or a playing
        stream's job is due within `guard_s` (queued, not running). Admission starts no stream then,
        whatever the measured cost says: a shared box's other work, or a burst of long jobs, shows here
        before the cost estimate moves."""
        with self._cond:
            return bool(self._first) or bool(self._rest and self._rest[0][0] <= self._clock() + self._guard_s)

    def behind_s(self, job_s: float) -> float:
        """How long until the pool is caught up with what makes it `strained` (0: it is not): the first
        pieces waiting and the playing streams' jobs due within the guard run first, shared by the
        workers, once a worker is free (the soonest running job's expected end, when none is). A job of
        no stated run time counts `job_s` (the engine's measured long job)."""
        with self._cond:
            now = self._clock()
            urgent = [*self._first, *(e for e in self._rest if e[0] <= now + self._guard_s)]
            if not urgent:
                return 0.0
            work_s = sum(e[2].run_s or job_s for e in urgent)
            ends = [max(0.0, e[2].started + (e[2].run_s or job_s) - now) for _, e in self._running.values()
                    if e[2].started is not None and not e[2].yielding]  # fmt: skip
            free_in = 0.0 if len(ends) < self._workers else min(ends, default=0.0)
            return max(free_in + work_s / self._workers, 1e-3)  # strained: more than nothing, whatever the estimates

    def busy_seconds(self) -> float:
        """Seconds the workers have spent running jobs so far (the jobs running now included)."""
        now = time.perf_counter()
        with self._cond:
            return self._busy_s + sum(now - t for t, _ in self._running.values())

    def shutdown(self, wait: bool = True) -> None:
        """Cancel the jobs not started; with `wait`, join the workers (running jobs finish)."""
        with self._cond:
            self._shutdown = True
            queued = [e[2] for q in (self._first, self._rest) for e in q]
            self._first.clear()
            self._rest.clear()
            self._cond.notify_all()
            self._tell()
            self._ring()
        for job in queued:  # outside the lock: a future's done-callbacks may take their owner's locks
            if job.future.running():  # it gave its worker up: running, it can no longer be cancelled
                job.future.set_exception(RuntimeError("the pool is shut down"))
            else:
                job.future.cancel()
        if wait:
            for t in self._threads:
                t.join()

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._first or self._rest or self._shutdown)
                decided = self._plan()
                if decided.next is None:
                    return  # shut down and drained
                entry = self._take(decided.next)
            job = entry[2]
            # One that gave its worker up is running already (and can no longer be cancelled).
            if not job.future.running() and not job.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            with self._cond:
                job.started = self._clock()
                self._running[me] = (time.perf_counter(), entry)
                self._tell()  # a run that may give its worker up to an urgent job
                self._ring()
            requeue = False
            try:
                job.future.set_result(job.fn())
            except Preempted:  # it gave its worker up: back in line, in its old place
                requeue = True
            except BaseException as exc:  # delivered through the future, like concurrent.futures
                job.future.set_exception(exc)
            finally:
                with self._cond:
                    self._busy_s += time.perf_counter() - self._running.pop(me)[0]
                    if requeue and job.started is not None:
                        job.wasted_s += self._clock() - job.started
                    job.started, job.asked, job.yielding = None, False, False
                    closed = self._shutdown
                    if requeue and not closed:
                        heapq.heappush(self._first if job.first else self._rest, entry)
                        self._cond.notify()
                    self._tell()
                    self._ring()
            if requeue and closed:  # outside the lock, as in `shutdown`: its done-callbacks take their owner's
                job.future.set_exception(RuntimeError("the pool is shut down"))
