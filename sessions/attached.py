"""One WebSocket connection's hold on a session: its record (the local copy it keeps speaking from),
its ownership lease and its control subscription, opened and closed together."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .control import ControlSubscription
from .errors import StateUnavailable
from .leases import OwnershipLease
from .records import ControlMessage, SessionRecord, SpokenEntry

if TYPE_CHECKING:
    from .store import SessionStore, TakeoverPolicy


class AttachedSession:
    def __init__(
        self, store: SessionStore, record: SessionRecord, lease: OwnershipLease, control: ControlSubscription,
        resumed: bool,
    ) -> None:
        self.store = store
        self.record = record
        self.lease = lease
        self.control = control
        self.resumed = resumed
        # If Redis comes back empty, the next renewal writes this connection's copy back.
        lease.on_record_missing = lambda: store.restore_session(self.record, lease)

    @property
    def session_id(self) -> str:
        return self.record.session_id

    @property
    def tenant(self) -> str:
        return self.record.tenant

    @classmethod
    async def open(
        cls, store: SessionStore, tenant: str, *, session_id: str | None, config: dict[str, Any],
        voice: str | None = None, policy: TakeoverPolicy | None = None,
    ) -> AttachedSession:
        """``session_id`` None: a new session with ``config``. Otherwise resume that session as stored
        (``config`` is ignored; call ``update`` to change it). Raises SessionNotFound, SessionBusy,
        StateUnavailable; on failure nothing stays held."""
        if session_id is None:
            record, resumed = await store.create_session(tenant, config, voice=voice), False
        else:
            record, resumed = await store.resume_session(tenant, session_id), True
        lease = await store.acquire_lease(tenant, record.session_id, policy=policy)
        try:
            control = await store.subscribe(tenant, record.session_id, lease=lease)
        except BaseException:
            await lease.release()
            raise
        lease.start_keepalive()
        return cls(store, replace(record, owner_replica=store.replica_id), lease, control, resumed)

    async def events(self) -> AsyncIterator[ControlMessage]:
        """Cancels and takeovers for this connection. A lease lost without a takeover message (missed
        while pub/sub was down) is reported as a takeover too; iteration ends after any takeover."""
        lost = asyncio.ensure_future(self.lease.lost.wait())
        nxt: asyncio.Future[ControlMessage | None] | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(self.control.get())
                await asyncio.wait({lost, nxt}, return_when=asyncio.FIRST_COMPLETED)
                if nxt.done() and nxt.result() is not None:
                    msg = nxt.result()
                    assert msg is not None
                    yield msg
                    if msg.kind == "takeover":
                        return
                    continue
                nxt.cancel()
                if lost.done():
                    yield ControlMessage("takeover", self.session_id, "", 0, target=self.lease.token)
                return  # subscription closed
        finally:
            lost.cancel()
            if nxt is not None:
                nxt.cancel()  # a consumer that stops iterating leaves no pending read behind

    async def update(self, *, config: dict[str, Any] | None = None, voice: str | None = None) -> None:
        """A re-sent ``session.config``: stored first, then applied locally (not acknowledged otherwise)."""
        await self.store.update_session(self.tenant, self.session_id, config=config, voice=voice)
        self.record = replace(
            self.record, config=config if config is not None else self.record.config,
            voice=voice if voice is not None else self.record.voice,
        )

    async def record_utterance(self, utterance_index: int, spoken_text: str, *, cancelled: bool = False) -> None:
        """Updates the local copy, then Redis. StateUnavailable propagates; the local copy is kept and
        written back by ``restore_session`` if Redis comes back empty."""
        r = self.record
        log = [*r.spoken, SpokenEntry(utterance_index, spoken_text, cancelled, time.time_ns() // 1_000_000)]
        self.record = replace(
            r, next_utterance=max(r.next_utterance, utterance_index + 1),
            completed=r.completed + (not cancelled), cancelled=r.cancelled + cancelled,
            spoken=log[-self.store.settings.spoken_log_max:],
        )
        await self.store.record_utterance(
            self.tenant, self.session_id, utterance_index, spoken_text, cancelled=cancelled
        )

    async def close(self) -> None:
        """Release the lease and the subscription; the record stays resumable until its TTL."""
        await self.control.close()
        with contextlib.suppress(StateUnavailable):
            await self.lease.release()

    async def __aenter__(self) -> AttachedSession:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
