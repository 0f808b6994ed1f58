"""SessionStore: session records, voices (sessions/voices.py), control channels, ownership leases and stream
limits in Redis.

One ``SessionStore`` per process: it holds the one connection pool (and the one pub/sub connection of its
``ControlBus``). Every Redis call passes through the store's ``CircuitBreaker`` (sessions/breaker.py): it
gets at most ``op_timeout_s``, and while Redis is not answering it fails at once with ``StateUnavailable``.
The async methods await Redis before returning. What a connection must not wait for (its spoken log,
config re-sends, releasing leases and slots) goes through ``later`` into the bounded, ordered
write-behind queue (sessions/writebehind.py), replayed when Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Literal, TypeVar

import fakeredis
import redis.asyncio as aioredis
from msgspec.structs import replace

from . import keys, metrics, scripts
from .attached import AttachedSession
from .backends import Backend, BackendKind, connect, embedded_server, redact
from .breaker import UNAVAILABLE, UNAVAILABLE_MESSAGE, CircuitBreaker
from .control import ControlBus, ControlSubscription
from .errors import SessionBusy, SessionExists, SessionNotFound, StateUnavailable, StoreBusy, StreamLimitExceeded
from .gate import ConnectionGate
from .leases import OwnershipLease, Renewals, StreamSlot
from .pipelines import acked_writes, outcome, run_scripts
from .records import ControlMessage, SessionRecord, SpokenEntry, Voice, VoiceInfo, now_ms
from .store_settings import StoreHealth, StoreSettings, TakeoverPolicy
from .voices import VoiceShelf
from .writebehind import Call, WriteBehind

log = logging.getLogger("voxgate.sessions")
T = TypeVar("T")

#: The embedded store's bound on one call (see `SessionStore.from_url`).
EMBEDDED_OP_TIMEOUT_S = 5.0
#: Pool connections not given to calls: the control bus's pub/sub connection and the heartbeat's.
RESERVED_CONNECTIONS = 2
#: The bound on each step of `SessionStore.close` past the write-behind's drain.
CLOSE_STEP_S = 2.0


async def _within(step: Awaitable[None], what: str) -> None:
    """Await one step of a close for at most CLOSE_STEP_S: a close is the last thing a replica (or a test's
    teardown) does, and one that waits forever holds the shutdown with it (a pool's close can hang after
    its connects timed out under load)."""
    try:
        async with asyncio.timeout(CLOSE_STEP_S):
            await step
    except TimeoutError:
        log.warning("session store: closing the %s took over %.0f s; left to the garbage collector", what,
                    CLOSE_STEP_S)


class SessionStore:
    def __init__(
        self, client: aioredis.Redis, *, backend: Backend | None, url: str,
        settings: StoreSettings | None = None, replica_id: str | None = None,
    ) -> None:
        self.client = client
        self._backend = backend  # None: the embedded store
        self.backend: BackendKind | Literal["embedded"] = backend.kind if backend is not None else "embedded"
        self.url = url
        self.settings = settings or StoreSettings()
        self.replica_id = replica_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        s = self.settings
        # Calls take turns for the pool's connections, less those held apart: the control bus's pub/sub
        # connection and the heartbeat's, which must never wait behind a burst of calls.
        self.gate = ConnectionGate(max(1, s.max_connections - RESERVED_CONNECTIONS), s.pool_wait_s)
        self.breaker = CircuitBreaker(
            self._raw_ping, op_timeout_s=s.op_timeout_s, failures=s.breaker_failures,
            heartbeat_s=s.heartbeat_s if backend is not None else None,  # fakeredis cannot stall
            gate=self.gate, busy_grace_s=s.busy_grace_s,
        )
        self.write_behind = WriteBehind(self.breaker, max_entries=s.write_behind_max,
                                        max_bytes=s.write_behind_max_bytes, run_batch=self._write_batch)  # fmt: skip
        pubsub = backend.pubsub if backend is not None else client.pubsub
        self.control = ControlBus(pubsub, confirm_timeout_s=s.op_timeout_s, breaker=self.breaker)
        # Leases and slots held through this store: renewed at once when Redis is back (the breaker
        # closes, or the control bus reconnects), so a record lost in a restart is restored in
        # milliseconds rather than a renewal period later.
        self._kept_alive: weakref.WeakSet[OwnershipLease | StreamSlot] = weakref.WeakSet()
        self._renewals = Renewals(self._renew_batch, early=s.renew_early)
        self.control.on_reconnect = self._renew_all_now
        self.breaker.on_close.append(self._renew_all_now)
        # Stream slots this replica holds per tenant: the limit it enforces alone while Redis is away.
        self._held_streams: dict[str, int] = {}
        self._following: asyncio.Task[None] | None = None  # the heartbeat's question to the sentinels
        reg = backend.register_script if backend is not None else client.register_script
        self._create = reg(scripts.CREATE_SESSION)
        self._restore = reg(scripts.RESTORE_SESSION)
        self._update = reg(scripts.UPDATE_SESSION)
        self._record_utt = reg(scripts.RECORD_UTTERANCE)
        self._begin_utt = reg(scripts.BEGIN_UTTERANCE)
        self._publish = reg(scripts.PUBLISH_IF_SESSION)
        self._acquire_lease = reg(scripts.ACQUIRE_LEASE)
        self._renew_lease_s = reg(scripts.RENEW_LEASE)
        self._release_lease_s = reg(scripts.RELEASE_LEASE)
        self._acquire_stream_s = reg(scripts.ACQUIRE_STREAM)
        self._renew_stream_s = reg(scripts.RENEW_STREAM)
        self._count_streams = reg(scripts.COUNT_STREAMS)
        self.voices = VoiceShelf(client, reg, self.settings, self._call, self._acked)

    # ---- lifecycle ------------------------------------------------------------------------------------

    @classmethod
    def from_url(
        cls, url: str | None, *, settings: StoreSettings | None = None, replica_id: str | None = None
    ) -> SessionStore:
        """``redis://…`` / ``rediss://…`` / ``unix://…`` → that Redis; ``redis+sentinel://h:p,…/<master>``
        → the primary those sentinels name; ``redis+cluster://h:p,…`` → that cluster (sessions/backends.py);
        None or "" → the embedded store (fakeredis, one shared server per process: single process only).
        ValueError for a URL it cannot use."""
        s = settings or StoreSettings()
        if not url:
            # In-process, the store cannot be away: a slow call means the event loop was busy (64 sessions
            # opening at once on 2 cores), and opening the circuit then would refuse sessions for nothing.
            s = dataclasses.replace(s, op_timeout_s=max(s.op_timeout_s, EMBEDDED_OP_TIMEOUT_S))
            client = fakeredis.FakeAsyncRedis(server=embedded_server(), max_connections=s.max_connections)
            return cls(client, backend=None, url="embedded://", settings=s, replica_id=replica_id)
        backend = connect(url, connect_timeout_s=s.connect_timeout_s, op_timeout_s=s.op_timeout_s,
                          max_connections=s.max_connections)
        return cls(backend.client, backend=backend, url=url, settings=s, replica_id=replica_id)

    async def start(self) -> None:
        """Check Redis is reachable; raise StateUnavailable with the (redacted) URL if not."""
        if self.backend == "embedded":
            log.warning(
                "session store: embedded (fakeredis, single process) — state is not shared with other "
                "processes and is lost on exit; pass --redis-url for multi-replica deployments"
            )
        try:
            async with asyncio.timeout(self.settings.connect_timeout_s + self.settings.op_timeout_s):
                await self._raw_ping()
        except UNAVAILABLE as e:
            raise StateUnavailable(f"cannot reach Redis at {redact(self.url)}: {e}") from e
        await self.breaker.call(self._raw_ping())  # starts the heartbeat
        if self._backend is not None:
            log.info("session store: %s Redis at %s (replica %s)", self.backend, redact(self.url), self.replica_id)

    async def close(self) -> None:
        """Write what is queued (for at most a second, while Redis answers), then let go of everything."""
        await self._renewals.close()
        await self.write_behind.close(drain_s=1.0)  # bounded by itself: what is left unwritten is failed
        await _within(self.breaker.close(), "heartbeat")
        if self._following is not None:
            self._following.cancel()
        await _within(self.control.close(), "control bus")
        await _within(self._backend.aclose() if self._backend is not None else self.client.aclose(), "connections")

    async def __aenter__(self) -> SessionStore:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _raw_ping(self) -> object:
        """The heartbeat: ROLE where it tells how many replicas the primary has (acknowledged writes wait
        for one), PING otherwise. Beside it, where the sentinels name the primary, the control bus is
        re-pointed when its connection is to another node (`_follow_primary`)."""
        if self._backend is None:
            return await self.client.ping()
        if self._backend.kind == "sentinel" and (self._following is None or self._following.done()):
            self._following = asyncio.get_running_loop().create_task(self._follow_primary())
        role = await self._backend.role()
        if role is None:
            return await self._backend.ping()
        self._backend.learn_role(role)  # type: ignore[arg-type]
        return role

    async def _follow_primary(self) -> None:
        """Ask who the primary is (off the heartbeat's own time: sentinels that do not answer must not
        look like Redis not answering); a control bus connected elsewhere re-subscribes on it."""
        assert self._backend is not None
        try:
            async with asyncio.timeout(self.settings.op_timeout_s):
                primary = await self._backend.primary()
        except Exception as e:  # the sentinels are away: the data connections find out for themselves
            log.debug("session store: no answer on the primary's address (%s)", type(e).__name__)
            return
        if primary is not None:
            self.control.follow(primary)

    def health(self) -> StoreHealth:
        """For /health, at once and without touching Redis: the breaker's view (its heartbeat keeps it
        current). ``degraded`` while the circuit is open."""
        pending = len(self.write_behind)
        if not self.breaker.is_closed:
            return StoreHealth("degraded", self.backend, None, UNAVAILABLE_MESSAGE, pending)
        return StoreHealth("ok", self.backend, self.breaker.latency_ms, None, pending)

    async def ping(self) -> StoreHealth:
        """A PING now (bounded by the breaker): ``ok`` when Redis answers, ``degraded`` when it does not."""
        t0 = time.perf_counter()
        try:
            await self._call(self._raw_ping())
        except StateUnavailable:
            return StoreHealth("degraded", self.backend, None, UNAVAILABLE_MESSAGE, len(self.write_behind))
        return StoreHealth("ok", self.backend, (time.perf_counter() - t0) * 1000, None, len(self.write_behind))

    @property
    def available(self) -> bool:
        """Redis answers (the circuit is closed)."""
        return self.breaker.is_closed

    @property
    def spoken_log_max(self) -> int:
        return self.settings.spoken_log_max

    def _renew_all_now(self) -> None:
        for held in list(self._kept_alive):
            held.renew_now()

    async def _call(self, op: Awaitable[T]) -> T:
        return await self.breaker.call(op)

    async def _guarded(self, op: Awaitable[T], timeout: float | None) -> T:
        return await self.breaker.call(op, timeout=timeout)

    async def _acked(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """A write the gateway acknowledges (a voice, the spoken log): where the primary has a replica it
        waits (at most ``replica_ack_timeout_s``) for one to hold the write, so a failover of that primary
        keeps it. A replica that did not answer in time is logged and counted, not an error: the write
        is in the primary, and refusing it would not take it back."""
        if self._backend is None:
            return await self._call(script(keys=keys, args=args))
        s = self.settings
        result, acks = await self.breaker.call(
            self._backend.acked(script, keys, args, int(s.replica_ack_timeout_s * 1000)),
            timeout=s.op_timeout_s + s.replica_ack_timeout_s,
        )
        if acks == 0:
            metrics.WRITES_UNREPLICATED.inc()
            log.warning("session store: no replica acknowledged a write of %s within %.2f s", keys[0],
                        s.replica_ack_timeout_s)  # fmt: skip
        return result

    def later(self, key: str, what: str, run: Callable[[], Awaitable[object]], size: int = 0, *,
              call: Call | None = None) -> asyncio.Future[bool]:  # fmt: skip
        """Queue an idempotent write of ``key`` (write-behind); returns at once. ``call``: the same write
        as an acknowledged script call answering ``next_utterance`` (below 0: the session is gone), which
        may go in one pipeline with those queued next to it (`_write_batch`)."""
        batchable = self._backend is None or self._backend.kind != "cluster"
        return self.write_behind.put(key, what, run, size, call=call if batchable else None)

    async def _write_batch(self, calls: Sequence[Call]) -> Sequence[object]:
        """Queued script writes (`later`'s ``call``), in order, in one pipeline, acknowledged as `_acked`
        does it one by one: where the primary has a replica, one WAIT after them all (on the same
        connection, so it covers every one). Each one's answer, or its error (`SessionNotFound` where the
        session is gone). Not for a cluster: its keys live on several nodes (`later` queues no call)."""
        s, backend = self.settings, self._backend
        wait = backend is not None and backend.has_replica(calls[0][1][0])
        return await acked_writes(self.client, self._guarded, calls, op_timeout_s=s.op_timeout_s,
                                  replica_ack_s=s.replica_ack_timeout_s if wait else None)  # fmt: skip

    async def settled(self, key: str) -> None:
        """Read-your-writes on this replica: let queued writes of ``key`` land first (bounded)."""
        if self.breaker.is_closed:
            await self.write_behind.settled(key, self.settings.op_timeout_s)

    # ---- sessions ---------------------------------------------------------------------------------------

    @property
    def _session_ttl_ms(self) -> int:
        return int(self.settings.session_ttl_s * 1000)

    async def create_session(
        self, tenant: str, config: dict[str, Any], *, voice: str | None = None,
        session_id: str | None = None,
    ) -> SessionRecord:
        sid = session_id or uuid.uuid4().hex
        t = now_ms()
        rec = SessionRecord(tenant, sid, dict(config), voice, created_ms=t, last_seen_ms=t)
        flat = [x for kv in rec.to_fields().items() for x in kv]
        ok = await self._call(self._create(
            keys=[keys.session(tenant, sid), keys.spoken(tenant, sid)], args=[self._session_ttl_ms, *flat]
        ))
        if not ok:
            raise SessionExists(f"session {sid} exists")
        return rec

    async def attach(
        self, tenant: str, *, session_id: str | None = None, config: dict[str, Any] | None = None,
        voice: str | None = None, policy: TakeoverPolicy | None = None,
    ) -> AttachedSession:
        """Create (``session_id`` None) or resume a session and hold it for one connection: record +
        renewed lease + control subscription. ``async with await store.attach(...) as s:``."""
        if session_id is None:
            record, resumed = await self.create_session(tenant, config or {}, voice=voice), False
        else:  # resumed as stored: ``config`` is ignored (``AttachedSession.update`` changes it)
            record, resumed = await self.resume_session(tenant, session_id), True
        lease = await self.acquire_lease(tenant, record.session_id, policy=policy)
        try:
            control = await self.subscribe(tenant, record.session_id, lease=lease)
        except BaseException:  # on failure nothing stays held
            await lease.release()
            raise
        lease.start_keepalive()
        return AttachedSession(self, replace(record, owner_replica=self.replica_id), lease, control, resumed)

    async def load_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        """The record with its spoken log; None when absent (or another tenant's)."""
        await self.settled(keys.session(tenant, session_id))
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(keys.session(tenant, session_id))
        pipe.lrange(keys.spoken(tenant, session_id), 0, -1)
        fields, spoken = await self._call(pipe.execute())
        if not fields:
            return None
        return SessionRecord.from_fields(fields, spoken)

    async def resume_session(self, tenant: str, session_id: str) -> SessionRecord:
        """Refresh the TTL and return the record; SessionNotFound when absent. Acquire the lease after."""
        if not await self.touch_session(tenant, session_id):
            raise SessionNotFound(f"session {session_id} not found")
        rec = await self.load_session(tenant, session_id)
        if rec is None:  # expired between the two calls
            raise SessionNotFound(f"session {session_id} not found")
        return rec

    async def touch_session(self, tenant: str, session_id: str) -> bool:
        await self.settled(keys.session(tenant, session_id))
        return bool(await self._call(self._update(
            keys=[keys.session(tenant, session_id), keys.spoken(tenant, session_id)],
            args=[self._session_ttl_ms, now_ms()],
        )))

    async def update_session(
        self, tenant: str, session_id: str, *, config: dict[str, Any] | None = None,
        voice: str | None = None,
    ) -> None:
        """A re-sent ``session.config``: replace the config and/or voice. SessionNotFound when absent."""
        args: list[Any] = [self._session_ttl_ms, now_ms()]
        if config is not None:
            args += ["config", json.dumps(config, ensure_ascii=False)]
        if voice is not None:
            args += ["voice", voice]
        ok = await self._call(self._update(
            keys=[keys.session(tenant, session_id), keys.spoken(tenant, session_id)], args=args
        ))
        if not ok:
            raise SessionNotFound(f"session {session_id} not found")

    async def begin_utterance(self, tenant: str, session_id: str, utterance_index: int) -> int:
        """Mark an utterance as started (an unfinished log entry) and move ``next_utterance`` past it;
        returns ``next_utterance``. Idempotent."""
        nxt = await self._acked(*self.begin_utterance_call(tenant, session_id, utterance_index))
        if nxt < 0:
            raise SessionNotFound(f"session {session_id} not found")
        return int(nxt)

    def begin_utterance_call(self, tenant: str, session_id: str, utterance_index: int) -> Call:
        """`begin_utterance`'s write as a script call (for `later`)."""
        t = now_ms()
        entry = SpokenEntry(utterance_index, "", False, t, finished=False)
        return (self._begin_utt, [keys.session(tenant, session_id), keys.spoken(tenant, session_id)],
                [self._session_ttl_ms, t, utterance_index, entry.to_json(), self.settings.spoken_log_max,
                 SpokenEntry.prefix(utterance_index)])  # fmt: skip

    async def record_utterance(
        self, tenant: str, session_id: str, utterance_index: int, spoken_text: str, *,
        cancelled: bool = False, at_ms: int | None = None,
    ) -> int:
        """Log a finished (or cancelled) utterance and what of it was spoken, in place of its started
        entry; returns ``next_utterance``. The log keeps the last ``spoken_log_max`` entries. Idempotent:
        an utterance already logged as finished is left as it is."""
        call = self.record_utterance_call(tenant, session_id, utterance_index, spoken_text, cancelled=cancelled,
                                          at_ms=at_ms)  # fmt: skip
        nxt = await self._acked(*call)
        if nxt < 0:
            raise SessionNotFound(f"session {session_id} not found")
        return int(nxt)

    def record_utterance_call(self, tenant: str, session_id: str, utterance_index: int, spoken_text: str, *,
                              cancelled: bool = False, at_ms: int | None = None) -> Call:  # fmt: skip
        """`record_utterance`'s write as a script call (for `later`)."""
        t = at_ms or now_ms()
        entry = SpokenEntry(utterance_index, spoken_text, cancelled, t)
        return (self._record_utt, [keys.session(tenant, session_id), keys.spoken(tenant, session_id)],
                [self._session_ttl_ms, t, utterance_index, entry.to_json(), int(cancelled),
                 self.settings.spoken_log_max, SpokenEntry.prefix(utterance_index)])  # fmt: skip

    async def restore_session(self, record: SessionRecord, lease: OwnershipLease | None = None) -> bool:
        """Write a local copy back where Redis lost it (restart without persistence). No-op (False) when
        the record exists. With ``lease``, the record names that lease's holder as owner."""
        fields = record.to_fields()
        if lease is not None:
            fields |= {"owner_replica": self.replica_id, "owner_token": lease.token}
        flat = [x for kv in fields.items() for x in kv]
        spoken = [e.to_json() for e in record.spoken[-self.settings.spoken_log_max:]]
        t, sid = record.tenant, record.session_id
        return bool(await self._call(self._restore(
            keys=[keys.session(t, sid), keys.spoken(t, sid)],
            args=[self._session_ttl_ms, self.settings.spoken_log_max, len(fields), *flat, *spoken],
        )))

    async def delete_session(self, tenant: str, session_id: str) -> bool:
        n = await self._call(self.client.delete(
            keys.session(tenant, session_id), keys.spoken(tenant, session_id), keys.lease(tenant, session_id)
        ))
        return n > 0

    # ---- ownership lease ----------------------------------------------------------------------------

    async def acquire_lease(
        self, tenant: str, session_id: str, *, policy: TakeoverPolicy | None = None,
        token: str | None = None,
    ) -> OwnershipLease:
        """Claim the session for this connection (``SET NX PX`` in a script). Another live holder is
        refused (SessionBusy) or taken over — then it is sent a ``takeover`` control message. Use as
        ``async with lease:`` to renew in the background and release on exit."""
        policy = policy or self.settings.takeover
        token = token or f"{self.replica_id}/{uuid.uuid4().hex}"
        await self.settled(keys.lease(tenant, session_id))  # a release of ours still queued goes first
        ttl = int(self.settings.lease_ttl_s * 1000)
        code, holder = await self._call(self._acquire_lease(
            keys=[keys.lease(tenant, session_id), keys.session(tenant, session_id)],
            args=[token, ttl, self.replica_id, policy],
        ))
        if code == -1:
            raise SessionNotFound(f"session {session_id} not found")
        if code == 0:
            raise SessionBusy(f"session {session_id} is in use by another connection")
        old = holder.decode() if code == 2 else None
        if old is not None:
            msg = ControlMessage("takeover", session_id, self.replica_id, now_ms(), target=old)
            await self._call(self.client.publish(keys.control(tenant, session_id), msg.to_json()))
        lease = OwnershipLease(self, tenant, session_id, token, ttl, old)
        self._kept_alive.add(lease)
        return lease

    @property
    def renewals(self) -> Renewals:
        return self._renewals

    async def renew_lease(self, lease: OwnershipLease) -> int:
        script, ks, args = self._renewal(lease, now_ms())
        return int(await self._call(script(keys=ks, args=args)))

    async def _renew_batch(self, batch: Sequence[OwnershipLease | StreamSlot]) -> Sequence[object]:
        """The renewals of `batch` (`Renewals`), in one pipeline: each one's answer from Redis, or the
        exception its script raised. A cluster's keys live on several nodes: one call each there."""
        if self._backend is not None and self._backend.kind == "cluster":
            return await asyncio.gather(*(outcome(held.renew()) for held in batch))
        now = now_ms()
        return await run_scripts(self.client, self._guarded, [self._renewal(held, now) for held in batch])

    def _renewal(self, held: OwnershipLease | StreamSlot, now: int) -> Call:
        """The script call that renews `held`, on its own or in a batch."""
        if isinstance(held, OwnershipLease):
            t, sid = held.tenant, held.session_id
            return (self._renew_lease_s, [keys.lease(t, sid), keys.session(t, sid), keys.spoken(t, sid)],
                    [held.token, held.ttl_ms, self._session_ttl_ms, now])  # fmt: skip
        if held.local:  # granted while Redis was away: entered now, above the limit if need be
            return self._acquire_stream_s, [keys.streams(held.tenant)], [held.slot_id, held.ttl_ms, 2**53]
        return self._renew_stream_s, [keys.streams(held.tenant)], [held.slot_id, held.ttl_ms]

    async def release_lease(self, lease: OwnershipLease) -> bool:
        t, sid = lease.tenant, lease.session_id
        return bool(await self._call(self._release_lease_s(
            keys=[keys.lease(t, sid), keys.session(t, sid)], args=[lease.token]
        )))

    async def lease_holder(self, tenant: str, session_id: str) -> str | None:
        raw = await self._call(self.client.get(keys.lease(tenant, session_id)))
        return raw.decode() if raw else None

    # ---- control channel ----------------------------------------------------------------------------

    async def subscribe(
        self, tenant: str, session_id: str, *, lease: OwnershipLease | None = None
    ) -> ControlSubscription:
        """Control messages for the session (``async for msg in sub``; ``await sub.close()``). Returns once
        Redis confirmed the subscription. With ``lease``, only takeovers aimed at that lease arrive."""
        return await self.control.subscribe(
            keys.control(tenant, session_id), session_id, lease.token if lease else None
        )

    async def publish_cancel(self, tenant: str, session_id: str, *, utterance_index: int | None = None,
                             played_ms: float | None = None) -> int:
        """Cancel the session's current utterance wherever its socket lives (`played_ms`: the client's
        playback position in it, for audio.cancelled's heard_text). Returns how many replicas received it
        (Redis subscribers; 0: no socket holds it now); SessionNotFound when absent."""
        msg = ControlMessage("cancel", session_id, self.replica_id, now_ms(), utterance_index=utterance_index,
                             played_ms=played_ms)
        n = await self._call(self._publish(
            keys=[keys.session(tenant, session_id), keys.control(tenant, session_id)], args=[msg.to_json()]
        ))
        if n < 0:
            raise SessionNotFound(f"session {session_id} not found")
        if self._backend is not None:
            with contextlib.suppress(StateUnavailable, StoreBusy):  # the cancel is out: PUBLISH's count stands
                n = await self._call(self._backend.receivers(keys.control(tenant, session_id), int(n)))
        return int(n)

    # ---- stream limits ------------------------------------------------------------------------------

    async def acquire_stream(self, tenant: str, limit: int | None, *, local_fallback: bool = False) -> StreamSlot:
        """Take one of the tenant's ``limit`` concurrent stream slots (None: unlimited, still counted);
        StreamLimitExceeded when all are in use. Use as ``async with slot:`` to renew and release.

        With ``local_fallback``, a Redis that is not answering does not refuse (or delay) the stream:
        the slot is granted from this replica's own count of the tenant's streams (so ``limit`` holds per
        replica, not across them, until Redis is back) and is entered into Redis at its first renewal
        after that. Without it, StateUnavailable."""
        slot_id = f"{self.replica_id}/{uuid.uuid4().hex}"
        if local_fallback and not self.breaker.is_closed:
            return self._local_stream(tenant, limit, slot_id)
        ttl = int(self.settings.stream_ttl_s * 1000)
        await self.settled(keys.streams(tenant))  # our queued releases count before a new acquire
        try:
            ok, active = await self._call(self._acquire_stream_s(
                keys=[keys.streams(tenant)], args=[slot_id, ttl, limit if limit is not None else 2**53]
            ))
        except StateUnavailable:
            if not local_fallback:
                raise
            # The same id: Redis may still run the acquire that timed out here (a stalled server reads
            # it later), and entering the local slot then finds it there rather than counting it twice.
            return self._local_stream(tenant, limit, slot_id)
        if not ok:
            raise StreamLimitExceeded(tenant, limit or 0, int(active))
        return self._held(StreamSlot(self, tenant, slot_id, ttl, int(active)))

    def _local_stream(self, tenant: str, limit: int | None, slot_id: str) -> StreamSlot:
        held = self._held_streams.get(tenant, 0)
        if limit is not None and held >= limit:
            raise StreamLimitExceeded(tenant, limit, held)
        metrics.STREAMS_LOCAL.inc()
        log.info("session store: Redis unavailable; stream slot for %s granted locally (%d held here)", tenant, held)
        return self._held(StreamSlot(self, tenant, slot_id, int(self.settings.stream_ttl_s * 1000), held + 1,
                                     local=True))  # fmt: skip

    def _held(self, slot: StreamSlot) -> StreamSlot:
        self._held_streams[slot.tenant] = self._held_streams.get(slot.tenant, 0) + 1
        self._kept_alive.add(slot)
        return slot

    def let_go(self, slot: StreamSlot) -> None:
        n = self._held_streams.get(slot.tenant, 0) - 1
        if n > 0:
            self._held_streams[slot.tenant] = n
        else:
            self._held_streams.pop(slot.tenant, None)

    async def active_streams(self, tenant: str) -> int:
        await self.settled(keys.streams(tenant))
        return int(await self._call(self._count_streams(keys=[keys.streams(tenant)])))

    async def renew_stream(self, slot: StreamSlot) -> bool:
        """One slot's renewal on its own (`Renewals` batches them: `_renew_batch`)."""
        script, ks, args = self._renewal(slot, now_ms())
        renewed = await self._call(script(keys=ks, args=args))
        if slot.local:  # it was entered now (acquired, above the limit if need be): held from here on
            slot.local = False
            return True
        return bool(renewed)

    async def release_stream(self, slot: StreamSlot) -> bool:
        return bool(await self._call(self.client.zrem(keys.streams(slot.tenant), slot.slot_id)))

    # ---- voices (sessions/voices.py) ---------------------------------------------------------------

    async def put_voice(self, tenant: str, voice: Voice, *, replace_existing: bool = False) -> Voice:
        return await self.voices.put(tenant, voice, replace_existing=replace_existing)

    async def voice_usage(self, tenant: str) -> tuple[int, int]:
        return await self.voices.usage(tenant)

    async def get_voice(self, tenant: str, voice_id: str) -> Voice | None:
        return await self.voices.get(tenant, voice_id)

    async def list_voices(self, tenant: str) -> list[VoiceInfo]:
        return await self.voices.infos(tenant)

    async def delete_voice(self, tenant: str, voice_id: str) -> bool:
        return await self.voices.delete(tenant, voice_id)
