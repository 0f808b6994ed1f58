"""The store's connections: a bounded number, taken in turn.

A store opens at most ``max_connections`` connections to Redis (its pool is sized for that). A call
waits its turn for one, at most ``wait_s``, rather than failing when every one is in use: a burst of
callers (a reconnect storm after a deploy or a balancer's failover) is local demand, not a Redis outage.
A call that got no turn in time is refused with ``StoreBusy`` (a capacity refusal), and the circuit
breaker never counts it: only Redis's own time, once a connection is held, is bounded by its op timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from . import metrics
from .errors import StoreBusy


class ConnectionGate:
    def __init__(self, slots: int, wait_s: float) -> None:
        if slots < 1:
            raise ValueError("a store needs at least one connection for its calls")
        self.slots = slots
        self.wait_s = wait_s
        self._free = asyncio.Semaphore(slots)

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Hold one connection's turn for the body; ``StoreBusy`` after ``wait_s`` without one."""
        if self._free.locked():
            metrics.POOL_WAITS.inc()
            try:
                async with asyncio.timeout(self.wait_s):
                    await self._free.acquire()
            except TimeoutError:
                metrics.POOL_REFUSED.inc()
                raise StoreBusy(f"every one of this replica's {self.slots} connections to the session store stayed "
                                f"in use for {self.wait_s:g} s; retry shortly") from None  # fmt: skip
        else:
            await self._free.acquire()  # free: returns at once
        try:
            yield
        finally:
            self._free.release()
