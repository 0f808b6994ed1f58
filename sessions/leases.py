"""Leases that live while their holder lives: a session's ownership lease and a tenant's stream slot.

Both renew at a third of their TTL, all of a store's together (`Renewals`): one task, and the renewals
that fall due close together go to Redis as one pipeline, so hundreds of sessions cost a call a second,
not hundreds of calls and timers. Renewal failing because Redis is unreachable is not a loss: the holder
keeps working from its local state and renews again when Redis is back. Renewal answering "someone else
holds it" (or "expired") is a loss: ``lost`` is set.

Releasing never waits on a Redis that is not answering: the release is queued write-behind (and the
TTL bounds the lease or slot even if the queued release were lost). A stream slot's release is always
queued: it sits between an utterance's audio and its ``session.done``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
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

    @property
    def renewals(self) -> Renewals:
        """Where its leases and slots are kept alive (one per store)."""
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


RETRY_SOON_S = 0.25  # a renewal Redis could not take is tried again this soon, not a period later


class Renewals:
    """A store's leases and slots kept alive by one task. Each renews every `every` seconds (its TTL/3);
    a renewal may come up to `early` of its period sooner, so that those falling due within that window
    go to `renew_batch` (the store: one pipeline) together. Coming early only shortens a period; the TTL
    that bounds a dead holder is unchanged."""

    def __init__(self, renew_batch: Callable[[Sequence[_KeptAlive]], Awaitable[Sequence[object]]],
                 early: float = 0.2) -> None:  # fmt: skip
        self._renew_batch = renew_batch
        self._early = early
        self._due: dict[_KeptAlive, tuple[float, float]] = {}  # held → (next renewal, period), loop clock
        self._in_flight: set[_KeptAlive] = set()
        self._batch_done = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._due)

    def add(self, held: _KeptAlive, every: float) -> None:
        """Renew `held` every `every` seconds from now until `remove`d (or lost)."""
        self._due[held] = (asyncio.get_running_loop().time() + every, every)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="voxgate-renewals")
        self._wake.set()

    def poke(self, held: _KeptAlive) -> None:
        """Renew `held` at once (Redis is back)."""
        if (entry := self._due.get(held)) is not None:
            self._due[held] = (0.0, entry[1])
            self._wake.set()

    async def remove(self, held: _KeptAlive) -> None:
        """No more renewals of `held`; returns once none is under way (a renewal that reached Redis after
        a release would hold the lease again until its TTL)."""
        self._due.pop(held, None)
        if held in self._in_flight and self._task is not asyncio.current_task():
            with contextlib.suppress(TimeoutError):  # the batch's own call is bounded (the op timeout)
                async with asyncio.timeout(5.0):
                    while held in self._in_flight:
                        await self._batch_done.wait()

    async def close(self) -> None:
        self._due.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._due:
            now = loop.time()
            soonest = min(due for due, _ in self._due.values())
            if soonest > now:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # one timer for every lease and slot
                    async with asyncio.timeout(soonest - now):
                        await self._wake.wait()
                continue
            batch = [h for h, (due, every) in self._due.items() if due <= now + self._early * every]
            self._in_flight.update(batch)
            self._batch_done.clear()
            try:
                await self._renew(batch, loop)
            finally:
                self._in_flight.clear()
                self._batch_done.set()

    async def _renew(self, batch: list[_KeptAlive], loop: asyncio.AbstractEventLoop) -> None:
        try:
            results: Sequence[object] = await self._renew_batch(batch)
        except RETRYABLE as e:
            # Retry sooner than the period: once Redis is back, the lease (and a record Redis lost) should
            # be restored within a fraction of a second, not a whole period later.
            log.debug("%d renewals deferred: %s", len(batch), e)
            results = [e] * len(batch)
        except Exception as e:
            log.exception("%d renewals failed; retrying", len(batch))
            results = [e] * len(batch)
        now = loop.time()
        for held, result in zip(batch, results, strict=True):
            if held not in self._due:
                continue  # released meanwhile
            every = self._due[held][1]
            if isinstance(result, BaseException):
                if not isinstance(result, RETRYABLE):
                    log.error("%s renewal failed; retrying: %r", type(held).__name__, result)
                self._due[held] = (now + min(every, RETRY_SOON_S), every)
                continue
            try:
                kept = await held.renewed(result)
            except Exception:
                log.exception("%s renewal's outcome failed; retrying", type(held).__name__)
                self._due[held] = (now + min(every, RETRY_SOON_S), every)
                continue
            if held not in self._due:
                continue
            if kept:
                self._due[held] = (now + every, every)
            else:
                del self._due[held]
                held.lost.set()


class _KeptAlive:
    ttl_ms: int
    _store: LeaseKeeper

    def __init__(self) -> None:
        self.lost = asyncio.Event()
        self._kept = False
        self.released = False

    def renew_now(self) -> None:
        """Renew at once instead of at the next period (the store calls it when Redis is back)."""
        self._store.renewals.poke(self)

    async def renew(self) -> bool:
        """One renewal on its own (not batched): False when it was lost."""
        raise NotImplementedError

    async def renewed(self, result: object) -> bool:
        """A batched renewal's answer from Redis (`Renewals`): False when it was lost."""
        raise NotImplementedError

    async def _release(self) -> bool:
        raise NotImplementedError

    def start_keepalive(self, interval_s: float | None = None) -> None:
        """Renew every ``interval_s`` (default TTL/3) until released or lost."""
        if not self._kept and not self.released:
            self._kept = True
            self._store.renewals.add(self, interval_s if interval_s is not None else self.ttl_ms / 3000)

    async def release(self) -> bool:
        raise NotImplementedError

    async def _stop(self) -> bool:
        """Stop renewing; False when already released."""
        if self.released:
            return False
        self.released = True
        if self._kept:
            await self._store.renewals.remove(self)
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
        return await self.renewed(await self._store.renew_lease(self))

    async def renewed(self, result: object) -> bool:
        state = int(result)  # type: ignore[call-overload]
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

    async def renewed(self, result: object) -> bool:
        if self.local:  # the batch entered it into Redis (the acquire script's answer is not a renewal's)
            self.local = False
            return True
        return bool(result)

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
