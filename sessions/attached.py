"""One WebSocket connection's hold on a session: its record (the local copy it keeps speaking from),
its ownership lease and its control subscription, opened and closed together.

Opening waits on Redis (it must: a resume reads the stored session) and fails fast while Redis is not
answering. After that nothing waits on Redis: the spoken log, config re-sends and the release are
applied to the local copy at once and written behind (``SessionStore.later``), in order; a record that
Redis lost meanwhile is written back from the local copy by the lease renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Protocol

from msgspec.structs import replace

from . import keys
from .control import ControlSubscription
from .errors import RETRYABLE
from .leases import OwnershipLease
from .records import ControlMessage, SessionRecord, SpokenEntry
from .writebehind import Call


class SessionWriter(Protocol):
    """What an attached session needs of its store (``SessionStore`` is one; ``SessionStore.attach``
    opens it): this module depends on no store, so the store can import it without a circle."""

    @property
    def spoken_log_max(self) -> int: ...

    def later(self, key: str, what: str, run: Callable[[], Awaitable[object]], size: int = 0, *,
              call: Call | None = None) -> object: ...  # fmt: skip

    async def settled(self, key: str) -> None:
        """Read-your-writes on this replica: queued writes of ``key`` land first (bounded)."""
        ...

    async def update_session(
        self, tenant: str, session_id: str, *, config: dict[str, Any] | None = None, voice: str | None = None,
    ) -> None: ...

    async def begin_utterance(self, tenant: str, session_id: str, utterance_index: int) -> int: ...

    async def record_utterance(
        self, tenant: str, session_id: str, utterance_index: int, spoken_text: str, *,
        cancelled: bool = False, at_ms: int | None = None,
    ) -> int: ...

    def begin_utterance_call(self, tenant: str, session_id: str, utterance_index: int) -> Call:
        """`begin_utterance`'s write as a script call, for `later` to batch."""
        ...

    def record_utterance_call(self, tenant: str, session_id: str, utterance_index: int, spoken_text: str, *,
                              cancelled: bool = False, at_ms: int | None = None) -> Call:  # fmt: skip
        """`record_utterance`'s write as a script call, for `later` to batch."""
        ...

    async def restore_session(self, record: SessionRecord, lease: OwnershipLease | None = None) -> bool: ...


class AttachedSession:
    def __init__(
        self, store: SessionWriter, record: SessionRecord, lease: OwnershipLease, control: ControlSubscription,
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

    @property
    def _key(self) -> str:
        return keys.session(self.tenant, self.session_id)

    def update(self, *, config: dict[str, Any] | None = None, voice: str | None = None) -> None:
        """A re-sent ``session.config``: applied to the local copy at once, written behind."""
        self.record = replace(
            self.record, config=config if config is not None else self.record.config,
            voice=voice if voice is not None else self.record.voice,
        )
        store, tenant, sid = self.store, self.tenant, self.session_id
        size = len(repr(config)) if config is not None else 0
        store.later(self._key, "config update",
                    lambda: store.update_session(tenant, sid, config=config, voice=voice), size)  # fmt: skip

    def begin_utterance(self, utterance_index: int) -> None:
        """The utterance starts speaking: a started entry in the log and ``next_utterance`` past it, in
        the local copy at once and written behind, so a replica killed mid-utterance leaves it named."""
        r = self.record
        if any(e.utterance_index == utterance_index for e in r.spoken):
            return
        entry = SpokenEntry(utterance_index, "", False, time.time_ns() // 1_000_000, finished=False)
        self.record = replace(r, next_utterance=max(r.next_utterance, utterance_index + 1),
                              spoken=[*r.spoken, entry][-self.store.spoken_log_max:])  # fmt: skip
        store, tenant, sid = self.store, self.tenant, self.session_id
        store.later(self._key, "utterance start", lambda: store.begin_utterance(tenant, sid, utterance_index),
                    call=store.begin_utterance_call(tenant, sid, utterance_index))  # fmt: skip

    def record_utterance(self, utterance_index: int, spoken_text: str, *, cancelled: bool = False) -> None:
        """A finished (or cancelled) utterance: in the local copy at once (in place of its started entry),
        written behind. Recording one utterance twice counts once."""
        r = self.record
        at = next((i for i, e in enumerate(r.spoken) if e.utterance_index == utterance_index), None)
        if at is not None and r.spoken[at].finished:
            return
        t = time.time_ns() // 1_000_000
        entry = SpokenEntry(utterance_index, spoken_text, cancelled, t)
        log = [*r.spoken, entry] if at is None else [*r.spoken[:at], entry, *r.spoken[at + 1:]]
        self.record = replace(
            r, next_utterance=max(r.next_utterance, utterance_index + 1),
            completed=r.completed + (not cancelled), cancelled=r.cancelled + cancelled,
            spoken=log[-self.store.spoken_log_max:],
        )
        store, tenant, sid = self.store, self.tenant, self.session_id
        store.later(self._key, "utterance record", lambda: store.record_utterance(
            tenant, sid, utterance_index, spoken_text, cancelled=cancelled, at_ms=t,
        ), len(spoken_text.encode()), call=store.record_utterance_call(
            tenant, sid, utterance_index, spoken_text, cancelled=cancelled, at_ms=t,
        ))  # fmt: skip

    async def close(self) -> None:
        """Release the lease and the subscription; the record stays resumable until its TTL. Waits at
        most an op timeout for this session's queued writes, so the release does not overtake them."""
        await self.control.close()
        await self.store.settled(self._key)
        with contextlib.suppress(*RETRYABLE):
            await self.lease.release()

    async def __aenter__(self) -> AttachedSession:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
