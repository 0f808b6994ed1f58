"""A time limit on many short awaits of one task, for one timer over the task's life.

`asyncio.timeout` makes and cancels a timer (and a `Timeout` with its task bookkeeping) per await. The
connection's writer bounds every frame it sends (`send_timeout`) and its reader every message it waits
for (`idle_timeout`): at hundreds of sessions, a frame every few tens of milliseconds each, those timers
were a tenth of the event loop's time (bench/results/capacity_s22.md). A `Deadline` costs a timestamp per
await instead: its one timer, when it fires, either finds the await still under way and past its limit
(the task is cancelled, and `TimeoutError` comes out of the `with`, as from `asyncio.timeout`) or moves
itself to the current await's limit, or, between awaits, lapses until the next one starts.

    quiet = Deadline(10.0)
    while True:
        with quiet:                         # TimeoutError 10 s into this await, not 10 s after the first
            message = await receive()
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class Deadline:
    """`with deadline:` around an await bounds it to `seconds` (settable between awaits). One task only:
    the first `with` binds it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._since: float | None = None  # when the await under way began; None: none is
        self._expired = False
        self._cancelling = 0  # the task's cancel requests before this await (asyncio.timeout's rule)
        self._checked = False  # every `with` checks it is the bound task's (asyncio debug mode)

    def __enter__(self) -> Deadline:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._checked = self._loop.get_debug()
        elif self._checked:
            # Per await only in asyncio's debug mode: `current_task` is a third of a `with`'s cost, paid
            # per frame. Otherwise a second task is caught where it does harm: an await that expires
            # under it (its `__exit__`, below) would have cancelled the first task instead.
            self._one_task()
        self._cancelling = self._task.cancelling() if self._task is not None else 0
        self._since = now = self._loop.time()
        due = now + self.seconds
        if self._timer is not None and self._timer.when() > due:  # the limit was shortened: fire sooner
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer = self._loop.call_at(due, self._fire)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._since = None
        if self._expired:
            self._expired = False
            self._one_task()
            assert self._task is not None
            # Ours, unless someone else asked for a cancel meanwhile: then theirs goes on.
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                raise TimeoutError from exc

    def _one_task(self) -> None:
        assert self._task is asyncio.current_task(self._loop), "a Deadline bounds one task's awaits"

    def close(self) -> None:
        """The task is done with it: its timer goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self._since is None or self._loop is None or self._task is None:
            return  # between awaits: the next one arms it again
        due = self._since + self.seconds
        if self._loop.time() >= due:
            self._expired = True
            self._task.cancel()
        else:
            self._timer = self._loop.call_at(due, self._fire)
