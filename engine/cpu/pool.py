"""A fixed pool of worker threads that runs the most urgent job first.

The CPU voices share one pool among all streams. A FIFO pool would let one stream's look-ahead
segments delay another stream's first audio; DESIGN §3 orders them instead, from the listener's side
(issue 14: a listener who has started hearing speech must keep hearing it):

1. a playing stream's job whose deadline (the time its listener runs out of audio) falls within
   `guard_s` from now, or within the expected run of the newcomer's job that would take the worker
   instead (jobs are never preempted: a Kokoro first piece that runs 2 s would leave that listener
   dry) — it is about to run dry, or has: it runs before any newcomer;
2. `first_audio` jobs (a stream whose listener has heard nothing yet), oldest first;
3. every other job, earliest deadline first.

So a newcomer's first piece goes first only while no playing stream is about to run dry. Under
overload (admission in front, gateway/admission.py, keeps the engine below its measured capacity, so
this is the exception) newcomers wait to start rather than playing streams breaking up. Jobs are meant
to be short (a bounded piece of a segment): a job is never preempted, so the longest one bounds how
long an urgent job waits for a worker. `guard_s` should be about one job's run time or more: a job
started later than that before its deadline finishes after it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

# deadline, seq, future, fn, owner, expected run seconds
_Entry = tuple[float, int, Future[Any], Callable[[], Any], object, float]


class UrgencyPool:
    def __init__(self, workers: int, name: str = "worker", *, guard_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._first: list[_Entry] = []  # first_audio jobs
        self._rest: list[_Entry] = []  # jobs of streams already playing (or with no listener tier)
        self._seq = itertools.count()  # ties (equal deadlines) run in submission order
        self._cond = threading.Condition()
        self._shutdown = False
        #: a playing stream's job due within this many seconds goes before first-audio jobs (settable:
        #: the CPU engine keeps it at about two measured job run times)
        self.guard_s = guard_s
        self._clock = clock
        self._busy_s = 0.0  # run time of the jobs finished so far, all workers together
        self._running: dict[int, float] = {}  # worker thread id → when its current job started
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, deadline: float, fn: Callable[[], Any], owner: object = None, *,
               first_audio: bool = False, run_s: float = 0.0) -> Future[Any]:
        """Run `fn` once a worker is free and no more urgent job waits (the order in the module doc).
        `deadline` is on the pool's clock; `owner` (say, the stream) only tells `ahead` whose jobs are
        whose; `run_s`: how long it is expected to run."""
        future: Future[Any] = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("the pool is shut down")
            entry = (deadline, next(self._seq), future, fn, owner, run_s)
            heapq.heappush(self._first if first_audio else self._rest, entry)
            self._cond.notify()
        return future

    def reschedule(self, future: Future[Any], deadline: float) -> bool:
        """Move a queued job's deadline (its owner learnt better: the audio before it came out shorter
        than estimated, say). False when it is not queued (running, done, or a first-audio job, whose
        place is its age). O(queued jobs), a few dozen."""
        with self._cond:
            for i, entry in enumerate(self._rest):
                if entry[2] is future:
                    if entry[0] != deadline:
                        self._rest[i] = (deadline, *entry[1:])
                        heapq.heapify(self._rest)
                    return True
        return False

    def _rank(self, entry: _Entry, first: bool, now: float) -> tuple[int, float, int]:
        """Under the lock: `entry`'s place in line now, smallest first."""
        if first:
            return (1, entry[0], entry[1])
        return (0 if entry[0] <= now + self.guard_s else 2, entry[0], entry[1])

    def _pop(self) -> _Entry:
        """Under the lock, with a job queued: the most urgent one, out of its queue."""
        if not self._first:
            return heapq.heappop(self._rest)
        # A playing stream's job goes first if it falls due before the newcomer's job would be over.
        horizon = self._clock() + max(self.guard_s, self._first[0][5])
        if self._rest and self._rest[0][0] <= horizon:
            return heapq.heappop(self._rest)
        return heapq.heappop(self._first)

    def ahead(self, future: Future[Any]) -> int | None:
        """How many other owners have a job queued to run before `future`'s; None once it is not queued."""
        with self._cond:
            now = self._clock()
            ranked = [(self._rank(e, first, now), e) for first, q in ((True, self._first), (False, self._rest))
                      for e in q]
            mine = next((r for r, e in ranked if e[2] is future), None)
            if mine is None:
                return None
            owner = next(e[4] for _, e in ranked if e[2] is future)
            return len({id(e[4]) for r, e in ranked if r < mine and e[4] is not owner})

    def strained(self) -> bool:
        """Whether the pool is behind now: a stream's first audio waits for a worker, or a playing
        stream's job is due within `guard_s` (queued, not running). Admission starts no stream then,
        whatever the measured cost says: a shared box's other work, or a burst of long jobs, shows here
        before the cost estimate moves."""
        with self._cond:
            return bool(self._first) or bool(self._rest and self._rest[0][0] <= self._clock() + self.guard_s)

    def busy_seconds(self) -> float:
        """Seconds the workers have spent running jobs so far (the jobs running now included)."""
        now = time.perf_counter()
        with self._cond:
            return self._busy_s + sum(now - t for t in self._running.values())

    def shutdown(self, wait: bool = True) -> None:
        """Cancel the jobs not started; with `wait`, join the workers (running jobs finish)."""
        with self._cond:
            self._shutdown = True
            queued = [e[2] for q in (self._first, self._rest) for e in q]
            self._first.clear()
            self._rest.clear()
            self._cond.notify_all()
        for future in queued:  # outside the lock: a future's done-callbacks may take their owner's locks
            future.cancel()
        if wait:
            for t in self._threads:
                t.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._first or self._rest or self._shutdown)
                if not (self._first or self._rest):
                    return  # shut down and drained
                _, _, future, fn, _, _ = self._pop()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            me = threading.get_ident()
            with self._cond:
                self._running[me] = time.perf_counter()
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered through the future, like concurrent.futures
                future.set_exception(exc)
            finally:
                with self._cond:
                    self._busy_s += time.perf_counter() - self._running.pop(me)
