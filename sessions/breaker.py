"""A circuit breaker in front of Redis: every store call passes through it.

Closed, a call gets at most ``op_timeout_s``; one timeout, or ``failures`` consecutive connection
errors, opens it. Open, every call fails at once with ``StateUnavailable`` and a background probe pings
Redis with back-off (0.1 s doubling to 1 s); the first answered ping closes it again and runs the
``on_close`` hooks (replay queued writes, renew leases). While closed, a heartbeat ping every
``heartbeat_s`` notices a Redis that stopped answering even when nobody is calling, so ``/health``
can be answered from the state alone, without waiting on Redis.

Waiting for a connection is not Redis's time: with a ``ConnectionGate`` (sessions/gate.py) a call first
waits its turn for one of the store's connections, and only then is its op timeout running. A pool that
ran out (redis-py's ``MaxConnectionsError``) is local demand too: neither opens the circuit; the caller
gets ``StoreBusy`` (a capacity refusal) instead.

A timeout the event loop caused is not Redis's either: a burst of hundreds of sessions connecting at
once keeps the loop busy past the op timeout while Redis's replies wait in the socket (512 at once on 2
busy cores: the circuit opened and 138 sessions were refused `state_unavailable`). A timeout is the
loop's when Redis answered another call after this one began, or when the timeout itself fired more than
``loop_late_s`` late (the loop was held that long). Such a call keeps waiting for its answer, which is on
its way (refusing it would throw away what Redis already did), up to ``busy_grace_s`` more; past that it
gets ``StoreBusy`` (a capacity refusal) and the circuit stays closed. A Redis that answers nobody, on
time, still opens it on the first timeout.

Why this shape: a Redis that accepts connections but never answers (a stopped process, a frozen VM)
costs every caller its full timeout and retries. One caller paying ≤ 0.5 s to find out, and everyone
after it failing in microseconds, keeps that cost off audio and acknowledgements.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import MaxConnectionsError

from . import metrics
from .errors import StateUnavailable, StoreBusy
from .gate import ConnectionGate

log = logging.getLogger("voxgate.sessions")
T = TypeVar("T")
BreakerState = Literal["closed", "open", "half_open"]

# What "Redis is not answering" looks like from redis-py (after its own quick retries) and asyncio.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    aioredis.ConnectionError, aioredis.TimeoutError, OSError, TimeoutError,
)
_TIMEOUTS: tuple[type[BaseException], ...] = (aioredis.TimeoutError, TimeoutError)

# What a client is told: stable, and free of addresses (the log has the details).
UNAVAILABLE_MESSAGE = "the session state store is unavailable"


def _discard(op: Awaitable[object]) -> None:
    """An op refused before it ran: close its coroutine so it is not reported as never awaited."""
    if inspect.iscoroutine(op):
        op.close()


class _Limit:
    """One call's deadline: `op_s` after it began; when that passes on this process's account (see
    ``CircuitBreaker.local``) it moves on by `op_s` at a time, up to ``busy_grace_s`` past the first.
    `local` says whether the call was finally timed out on this process's account."""

    def __init__(self, breaker: CircuitBreaker, timer: asyncio.Timeout, began: float, op_s: float) -> None:
        self._breaker, self._timer, self._began, self._op_s = breaker, timer, began, op_s
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time() + op_s + breaker.busy_grace_s
        self.local = False
        self._handle = self._arm(self._loop.time() + op_s)

    def _arm(self, due: float) -> asyncio.TimerHandle:
        return self._loop.call_at(due, self._judge, due)

    def _judge(self, due: float) -> None:
        now = self._loop.time()
        self.local = self._breaker.local(self._began, now - due)
        if self.local and now < self._last:
            self._handle = self._arm(min(now + self._op_s, self._last))
        else:
            self._timer.reschedule(now)  # expire now: the op is cancelled and the timeout raised

    def stop(self) -> None:
        self._handle.cancel()


class CircuitBreaker:
    def __init__(
        self, ping: Callable[[], Awaitable[object]], *, op_timeout_s: float = 0.5, failures: int = 2,
        heartbeat_s: float | None = 0.5, probe_backoff_s: tuple[float, float] = (0.1, 1.0),
        gate: ConnectionGate | None = None, loop_late_s: float = 0.1, busy_grace_s: float = 2.0,
    ) -> None:
        self._ping = ping
        self._gate = gate  # None: calls are not bounded in number (a breaker on its own, in tests)
        self.op_timeout_s = op_timeout_s
        self.failures = failures
        self.heartbeat_s = heartbeat_s  # None: no heartbeat (the embedded store cannot stall)
        self.probe_backoff_s = probe_backoff_s
        self.loop_late_s = loop_late_s  # a timeout that fired later than this was the event loop's
        self.busy_grace_s = busy_grace_s  # more time a call gets whose timeout was this process's doing
        self.state: BreakerState = "closed"
        self.reason = ""  # why it last opened (for the log and tests; never sent to clients)
        self.opened_at: float | None = None  # monotonic time it last opened
        self.trips = 0
        self.latency_ms: float | None = None  # of the last answered heartbeat or probe
        self.on_close: list[Callable[[], None]] = []
        self._consecutive = 0
        # When the latest call or ping Redis answered was sent (monotonic): a call that times out while
        # Redis answered one sent after it was late here, not at Redis. Not when the answer came: at a
        # stall's onset the answer to a call sent before it would blame a call stalled at Redis on this
        # replica (a canary's segment refused as "busy" while Redis stalled).
        self._answered_sent = float("-inf")
        self._closed = asyncio.Event()
        self._closed.set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def is_closed(self) -> bool:
        return self.state == "closed"

    async def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until Redis answers again (True), or ``timeout`` seconds (False)."""
        self._ensure_watch()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closed.wait(), timeout)
        return self.is_closed

    async def call(self, op: Awaitable[T], timeout: float | None = None) -> T:
        """Run one Redis operation within ``timeout`` (default ``op_timeout_s``); ``StateUnavailable`` at
        once while open; ``StoreBusy`` when no connection freed within the gate's wait. Errors other than
        unavailability (a script's error) pass through unchanged."""
        self._ensure_watch()
        if not self.is_closed:
            _discard(op)
            raise StateUnavailable(UNAVAILABLE_MESSAGE)
        began, limit = time.monotonic(), None
        try:
            async with self._turn():
                if not self.is_closed:  # it opened while this call waited its turn
                    raise StateUnavailable(UNAVAILABLE_MESSAGE)
                began = time.monotonic()
                async with asyncio.timeout(None) as timer:
                    limit = _Limit(self, timer, began, timeout if timeout is not None else self.op_timeout_s)
                    try:
                        result = await op
                    finally:
                        limit.stop()
        except (StoreBusy, StateUnavailable):
            _discard(op)
            raise
        except MaxConnectionsError as e:  # the pool ran out: local demand, not Redis (never counted)
            raise StoreBusy("every connection to the session store is in use; retry shortly") from e
        except UNAVAILABLE as e:
            if isinstance(e, _TIMEOUTS) and ((limit is not None and limit.local) or self._answered_sent > began):
                raise StoreBusy("the session store's answer came too late on a busy replica; retry shortly") from e
            self.failure(e)
            raise StateUnavailable(UNAVAILABLE_MESSAGE) from e
        self._consecutive = 0
        self._answered_sent = max(self._answered_sent, began)
        return result

    def local(self, began: float, late_s: float) -> bool:
        """Whether a call's timeout was this process's doing, not Redis's: Redis answered a call sent
        after `began`, or the timeout fired `late_s` after it was due, more than `loop_late_s`."""
        return late_s > self.loop_late_s or self._answered_sent > began

    def _turn(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._gate.turn() if self._gate is not None else contextlib.nullcontext()

    def failure(self, e: BaseException) -> None:
        """Count one failed operation: a timeout opens the breaker, so do ``failures`` errors in a row.
        An exhausted pool is not a failure of Redis and is not counted."""
        if isinstance(e, MaxConnectionsError):
            return
        self._consecutive += 1
        if isinstance(e, _TIMEOUTS) or self._consecutive >= self.failures:
            self.trip(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)

    def trip(self, reason: str) -> None:
        if not self.is_closed:
            return
        self.state, self.reason, self.opened_at = "open", reason, time.monotonic()
        self.trips += 1
        self._closed.clear()
        self._changed.set()
        metrics.BREAKER_OPEN.inc()
        metrics.BREAKER_TRIPS.inc()
        log.warning("session store: Redis not answering (%s); circuit open, state writes queued", reason)

    def _close(self) -> None:
        down = time.monotonic() - (self.opened_at or time.monotonic())
        self.state, self._consecutive = "closed", 0
        self._closed.set()
        self._changed.set()
        metrics.BREAKER_OPEN.dec()
        log.info("session store: Redis answers again after %.1f s; circuit closed", down)
        for hook in list(self.on_close):
            try:
                hook()
            except Exception:  # one hook's bug must not keep the others (the replay) from running
                log.exception("session store: a recovery hook failed")

    # -- the watcher: heartbeat while closed, probes with back-off while open --------------------------

    def _ensure_watch(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(), name="voxgate-store-breaker")

    async def _sleep(self, seconds: float | None) -> None:
        """Sleep, but wake early when the state changes (a trip starts the probe schedule at once)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    async def _ping_once(self) -> bool:
        t0, began = time.perf_counter(), time.monotonic()
        try:
            async with asyncio.timeout(self.op_timeout_s) as limit:
                await self._ping()
        except MaxConnectionsError:
            return True  # every connection busy here says nothing of Redis (calls find out for themselves)
        except UNAVAILABLE as e:
            late_s = asyncio.get_running_loop().time() - (limit.when() or float("inf"))
            if isinstance(e, _TIMEOUTS) and self.local(began, late_s):
                return True  # the ping was late here, not at Redis
            self.reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            return False
        self._answered_sent = max(self._answered_sent, began)
        self.latency_ms = (time.perf_counter() - t0) * 1000
        return True

    async def _watch(self) -> None:
        delay = self.probe_backoff_s[0]
        while True:
            try:
                if self.is_closed:
                    delay = self.probe_backoff_s[0]
                    await self._sleep(self.heartbeat_s)
                    if self.is_closed and self.heartbeat_s is not None and not await self._ping_once():
                        self.trip(self.reason)
                    continue
                await asyncio.sleep(delay)
                self.state = "half_open"  # calls still fail fast: only this probe reaches Redis
                if await self._ping_once():
                    self._close()
                else:
                    self.state = "open"
                    delay = min(delay * 2, self.probe_backoff_s[1])
            except asyncio.CancelledError:
                raise
            except Exception:  # a surprise from the client library: keep watching, never die silently
                log.exception("session store: breaker watcher failed; continuing")
                await asyncio.sleep(self.probe_backoff_s[1])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if not self.is_closed:
            metrics.BREAKER_OPEN.dec()
            self.state = "closed"
            self._closed.set()
