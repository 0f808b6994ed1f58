"""A fixed pool of worker threads that runs the most urgent job first.

The CPU voices share one pool among all streams. A FIFO pool would let one stream's look-ahead
segments delay another stream's first audio; DESIGN §3 orders them instead: streams with no audio yet
first (`first_audio` jobs), then the rest; within each, earliest deadline first (the time each
listener will run out of audio; for a stream with none yet, when it asked). A stream that has run dry
has a deadline in the past, yet still comes after one whose listener has heard nothing at all: under
overload (long streams slower than real time) a newcomer still waits for one running job at most.
Jobs are meant to be short (a bounded piece of a segment): a job is never preempted, so the longest
one bounds how long a new stream waits for a worker.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class UrgencyPool:
    def __init__(self, workers: int, name: str = "worker") -> None:
        self._heap: list[tuple[bool, float, int, Future[Any], Callable[[], Any], object]] = []
        self._seq = itertools.count()  # ties (equal deadlines) run in submission order
        self._cond = threading.Condition()
        self._shutdown = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, deadline: float, fn: Callable[[], Any], owner: object = None, *,
               first_audio: bool = False) -> Future[Any]:
        """Run `fn` once a worker is free and no more urgent job waits: `first_audio` jobs (a listener
        that has heard nothing yet) before all others, then the earliest `deadline`. `owner` (say, the
        stream) only tells `ahead` whose jobs are whose."""
        future: Future[Any] = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("the pool is shut down")
            heapq.heappush(self._heap, (not first_audio, deadline, next(self._seq), future, fn, owner))
            self._cond.notify()
        return future

    def ahead(self, future: Future[Any]) -> int | None:
        """How many other owners have a job queued to run before `future`'s; None once it is not queued."""
        with self._cond:
            mine = next((e for e in self._heap if e[3] is future), None)
            if mine is None:
                return None
            return len({id(e[5]) for e in self._heap if e[:3] < mine[:3] and e[5] is not mine[5]})

    def shutdown(self, wait: bool = True) -> None:
        """Cancel the jobs not started; with `wait`, join the workers (running jobs finish)."""
        with self._cond:
            self._shutdown = True
            queued = [e[3] for e in self._heap]
            self._heap.clear()
            self._cond.notify_all()
        for future in queued:  # outside the lock: a future's done-callbacks may take their owner's locks
            future.cancel()
        if wait:
            for t in self._threads:
                t.join()

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._heap or self._shutdown)
                if not self._heap:
                    return  # shut down and drained
                *_, future, fn, _ = heapq.heappop(self._heap)
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                future.set_result(fn())
            except BaseException as exc:  # delivered through the future, like concurrent.futures
                future.set_exception(exc)
