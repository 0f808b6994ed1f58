"""Leases that live while their holder lives: a session's ownership lease and a tenant's stream slot.

Both renew in a background task at a third of their TTL. Renewal failing because Redis is unreachable
is not a loss: the holder keeps working from its local state and renews again when Redis is back.
Renewal answering "someone else holds it" (or "expired") is a loss: ``lost`` is set.

Releasing never waits on a Redis that is not answering: the release is queued write-behind (and the
TTL bounds the lease or slot even if the queued release were lost). A stream slot's release is always
queued: it sits between an utterance's audio and its ``session.done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol

from . import keys
from .errors import RETRYABLE

log = logging.getLogger("voxgate.sessions")


class LeaseKeeper(Protocol):
    """What a lease or slot needs of the store that granted it (``SessionStore`` is one): this module
    depends on no store, so the store can import it without a circle."""

    @property
    def available(self) -> bool:
        """Redis answers now (the circuit is closed): a release can be tried at once."""
        ...

    async def renew_lease(self, lease: OwnershipLease) -> int: ...

    async def release_lease(self, lease: OwnershipLease) -> bool: ...

    async def renew_stream(self, slot: StreamSlot) -> bool: ...

    async def release_stream(self, slot: StreamSlot) -> bool: ...

    def let_go(self, slot: StreamSlot) -> None:
        """This replica stops counting the slot (its own count, used while Redis is away)."""
        ...

    def later(self, key: str, what: str, run: Callable[[], Awaitable[object]], size: int = 0) -> object:
        """Queue an idempotent write (write-behind)."""
        ...


class _KeptAlive:
    ttl_ms: int

    def __init__(self) -> None:
        self.lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        self.released = False

    def renew_now(self) -> None:
        """Renew at once instead of at the next period (the store calls it when Redis is back)."""
        self._poke.set()

    async def renew(self) -> bool:
        raise NotImplementedError

    async def _release(self) -> bool:
        raise NotImplementedError

    def start_keepalive(self, interval_s: float | None = None) -> None:
        """Renew every ``interval_s`` (default TTL/3) until released or lost."""
        if self._task is None:
            every = interval_s if interval_s is not None else self.ttl_ms / 3000
            self._task = asyncio.create_task(self._keepalive(every), name=f"voxgate-{type(self).__name__}")

    async def _keepalive(self, every: float) -> None:
        wait = every
        while not self.released:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), wait)
            self._poke.clear()
            try:
                if not await self.renew():
                    self.lost.set()
                    return
                wait = every
            except RETRYABLE as e:
                # Retry sooner than the period: once Redis is back, the lease (and a record Redis lost)
                # should be restored within a fraction of a second, not a whole period later.
                log.debug("%s renewal deferred: %s", type(self).__name__, e)
                wait = min(every, 0.25)
            except Exception:
                log.exception("%s renewal failed; retrying", type(self).__name__)
                wait = min(every, 0.25)

    async def release(self) -> bool:
        raise NotImplementedError

    async def _stop(self) -> bool:
        """Stop renewing; False when already released."""
        if self.released:
            return False
        self.released = True
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        return True

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.release()


class OwnershipLease(_KeptAlive):
    """One live connection's claim on a session. ``took_over_from`` is the previous holder's token when
    this acquisition took the session over (that holder was sent a takeover message)."""

    def __init__(
        self, store: LeaseKeeper, tenant: str, session_id: str, token: str, ttl_ms: int,
        took_over_from: str | None,
    ) -> None:
        super().__init__()
        self._store = store
        self.tenant = tenant
        self.session_id = session_id
        self.token = token
        self.ttl_ms = ttl_ms
        self.took_over_from = took_over_from
        # Called when a renewal finds the session record gone although the lease is ours (Redis lost its
        # data): the holder writes its local copy back, e.g. ``lambda: store.restore_session(record)``.
        self.on_record_missing: Callable[[], Awaitable[object]] | None = None

    async def renew(self) -> bool:
        state = await self._store.renew_lease(self)
        if state == 2 and self.on_record_missing is not None:
            await self.on_record_missing()
        return state != 0

    async def _release(self) -> bool:
        return await self._store.release_lease(self)

    async def release(self) -> bool:
        """Stop renewing and give the lease up. False when it was no longer ours, or when Redis is not
        answering (then the release is queued, and the lease expires by itself meanwhile)."""
        if not await self._stop():
            return False
        key = keys.lease(self.tenant, self.session_id)
        try:
            if self._store.available:
                return await self._release()
        except RETRYABLE:
            pass
        self._store.later(key, "lease release", self._release)
        return False

    async def __aenter__(self) -> OwnershipLease:
        self.start_keepalive()
        return self


class StreamSlot(_KeptAlive):
    """One of a tenant's concurrent streams. Counted in Redis until released or until its TTL lapses
    without renewal (a crashed replica's slots free themselves)."""

    def __init__(
        self, store: LeaseKeeper, tenant: str, slot_id: str, ttl_ms: int, active: int, *, local: bool = False
    ) -> None:
        super().__init__()
        self._store = store
        self.tenant = tenant
        self.slot_id = slot_id
        self.ttl_ms = ttl_ms
        self.active_at_acquire = active
        self.local = local  # granted from this replica's own count while Redis was away; not in Redis yet

    async def renew(self) -> bool:
        return await self._store.renew_stream(self)

    async def _release(self) -> bool:
        return await self._store.release_stream(self)

    async def release(self) -> bool:
        """Stop renewing and give the slot up, at once: this replica stops counting it now, Redis when the
        queued release is written (a read of the tenant's slots on this replica waits for that). False
        when already released."""
        if not await self._stop():
            return False
        self._store.let_go(self)
        # Queued even for a local slot: its entry into Redis may have been under way.
        self._store.later(keys.streams(self.tenant), "stream slot release", self._release)
        return True

    async def __aenter__(self) -> StreamSlot:
        self.start_keepalive()
        return self
