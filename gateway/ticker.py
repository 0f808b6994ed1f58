"""One timer for every socket's idle-commit check, instead of a timer per socket.

Each socket with an utterance open checks it every `Limits.poll_interval` (its segmenter's idle commit,
the utterance's idle timeout). An `asyncio.sleep` per socket per check is a timer made, heaped and fired
per socket: at hundreds of sockets, hundreds of heap entries every interval. A `Ticker` keeps one timer
per event loop and interval, armed only while someone waits, and wakes all its waiters when it fires:
each waiter wakes within one interval of asking (not exactly one interval after), which is all an idle
check needs.

    ticker = shared_ticker(limits.poll_interval)
    while open_utterances():
        await ticker.wait()
        check(time.monotonic())
"""

from __future__ import annotations

import asyncio
import weakref


class Ticker:
    """Wakes every waiter at its timer's next firing, `interval` seconds after the first waiter since the
    last one asked. One loop only (the one it was made on)."""

    def __init__(self, interval: float, loop: asyncio.AbstractEventLoop) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self._loop = loop
        # One future per waiter, not one shared: a waiter's task cancelled cancels the future it awaits,
        # and that must not cancel the others' wake-up. Bounded by the waiters of one interval.
        self._waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None

    @property
    def armed(self) -> bool:
        """A timer is pending (somebody waits)."""
        return self._timer is not None

    def wait(self) -> asyncio.Future[None]:
        """A future done at the timer's next firing (armed now if none is pending)."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append(fut)
        if self._timer is None:
            self._timer = self._loop.call_later(self.interval, self._fire)
        return fut

    def _fire(self) -> None:
        self._timer = None
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


_tickers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Ticker]] = weakref.WeakKeyDictionary()


def shared_ticker(interval: float) -> Ticker:
    """The running loop's ticker of `interval` seconds, made on first use; it goes with its loop."""
    loop = asyncio.get_running_loop()
    by_interval = _tickers.get(loop)
    if by_interval is None:
        by_interval = _tickers[loop] = {}
    ticker = by_interval.get(interval)
    if ticker is None:
        ticker = by_interval[interval] = Ticker(interval, loop)
    return ticker
