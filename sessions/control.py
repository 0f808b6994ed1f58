"""Per-session control channels over ONE pub/sub connection per store (not one per session).

A single reader task owns the pub/sub connection and routes messages to local subscriptions. When the
connection drops it opens a new one and re-subscribes every live channel, with backoff, so
subscriptions survive a Redis restart. It does the same when the store learns that the primary is now
another node than the one its connection talks to (`follow`, from the Sentinel heartbeat): an old primary
cut off by a partition still answers and keeps the subscriptions, but nothing published on the new
primary reaches it. Pub/sub is at-most-once: a message published while the
connection is down is lost; the ownership lease is the second, durable signal for takeovers.

Nothing here waits on a Redis that stopped answering: ``subscribe`` fails at once while the store's
circuit breaker is open (and an unconfirmed subscription opens it), and every command sent on the
pub/sub connection is bounded by the confirmation timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

from redis.asyncio.client import PubSub

from .breaker import UNAVAILABLE, UNAVAILABLE_MESSAGE, CircuitBreaker
from .errors import StateUnavailable
from .records import ControlMessage

log = logging.getLogger("voxgate.sessions")

__all__ = ["UNAVAILABLE", "ControlBus", "ControlSubscription"]


class ControlSubscription:
    """Messages for one session, as seen by one connection. ``async for msg in sub`` or ``await sub.get()``.

    With a ``token`` (the connection's lease token), takeover messages aimed at another connection of the
    same session are dropped, so a new owner never reads its own takeover notice.
    """

    def __init__(self, bus: ControlBus, channel: bytes, session_id: str, token: str | None) -> None:
        self._bus = bus
        self.channel = channel
        self.session_id = session_id
        self.token = token
        # Control traffic is a few messages per utterance; a full queue means nobody reads, so drop.
        self._queue: asyncio.Queue[ControlMessage | None] = asyncio.Queue(maxsize=64)
        self.closed = False

    def _deliver(self, msg: ControlMessage) -> None:
        if msg.kind == "takeover" and self.token is not None and msg.target != self.token:
            return
        try:
            self._queue.put_nowait(msg)
        except asyncio.QueueFull:
            log.warning("control queue full for session %s; dropping %s", self.session_id, msg.kind)

    async def get(self, timeout: float | None = None) -> ControlMessage | None:
        """The next message, or None after ``timeout`` seconds or once closed."""
        if self.closed and self._queue.empty():
            return None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    def __aiter__(self) -> ControlSubscription:
        return self

    async def __anext__(self) -> ControlMessage:
        msg = await self.get()
        if msg is None:
            raise StopAsyncIteration
        return msg

    def _wake_closed(self) -> None:
        self.closed = True
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)  # wakes a reader blocked in get()

    async def close(self) -> None:
        if not self.closed:
            await self._bus._remove(self)

    async def __aenter__(self) -> ControlSubscription:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class ControlBus:
    def __init__(
        self, pubsub: Callable[[], PubSub], *, confirm_timeout_s: float = 0.5,
        backoff_s: tuple[float, float] = (0.05, 0.5), breaker: CircuitBreaker | None = None,
    ) -> None:
        # A fresh pub/sub connection per (re)connect: on a cluster the next one is another node's.
        self._new_pubsub = pubsub
        self._breaker = breaker
        self._confirm_timeout_s = confirm_timeout_s
        self._backoff_s = backoff_s
        self._subs: dict[bytes, set[ControlSubscription]] = {}
        self._waiting: dict[bytes, list[asyncio.Future[None]]] = {}
        self._pubsub: PubSub | None = None
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self.reconnects = 0  # times the pub/sub connection was re-established after a loss
        self.repoints = 0  # times it was moved to the node that became the primary
        self.node: tuple[str, int] | None = None  # the address its connection talks to (None: not TCP)
        self._stale: tuple[str, int] | None = None  # the primary it should move to, when it is elsewhere
        self.on_reconnect: Callable[[], None] | None = None  # Redis is back: e.g. renew leases now

    @property
    def connected(self) -> bool:
        return self._pubsub is not None

    def follow(self, primary: tuple[str, int]) -> None:
        """The primary is at ``primary`` now: a connection to another node re-subscribes (the reader moves
        it at its next turn, within a second), as it does after a loss."""
        if self._pubsub is not None and self.node is not None and self.node != primary:
            self._stale = primary

    async def subscribe(self, channel: str, session_id: str, token: str | None) -> ControlSubscription:
        """Returns once Redis has confirmed the subscription, so a publish after this is delivered."""
        if self._breaker is not None and not self._breaker.is_closed:
            raise StateUnavailable(UNAVAILABLE_MESSAGE)
        ch = channel.encode()
        sub = ControlSubscription(self, ch, session_id, token)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="voxgate-control-bus")
        already = ch in self._subs
        self._subs.setdefault(ch, set()).add(sub)
        if already:
            return sub
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(ch, []).append(fut)
        self._wakeup.set()
        ps = self._pubsub
        if ps is not None:
            # A failure here is the reader's to repair: it re-subscribes every channel on reconnect.
            await self._send(ps.subscribe(ch))
        try:
            await asyncio.wait_for(asyncio.shield(fut), self._confirm_timeout_s)
        except TimeoutError as e:
            await self._remove(sub)
            if self._breaker is not None:
                self._breaker.failure(e)
            raise StateUnavailable(UNAVAILABLE_MESSAGE) from e
        finally:
            if fut in self._waiting.get(ch, []):
                self._waiting[ch].remove(fut)
        return sub

    async def _remove(self, sub: ControlSubscription) -> None:
        sub._wake_closed()
        subs = self._subs.get(sub.channel)
        if subs is None:
            return
        subs.discard(sub)
        if subs:
            return
        del self._subs[sub.channel]
        ps = self._pubsub
        if ps is not None:
            await self._send(ps.unsubscribe(sub.channel))

    async def _send(self, command: Awaitable[object]) -> None:
        """A (un)subscribe on the pub/sub connection: bounded, and failures left to the reader, which
        re-subscribes every live channel when it reconnects."""
        with contextlib.suppress(*UNAVAILABLE):
            async with asyncio.timeout(self._confirm_timeout_s):
                await command

    def _dispatch(self, msg: dict[str, object]) -> None:
        ch = msg.get("channel")
        if not isinstance(ch, bytes):
            return
        if msg["type"] == "subscribe":
            for fut in self._waiting.pop(ch, []):
                if not fut.done():
                    fut.set_result(None)
        elif msg["type"] == "message":
            try:
                cm = ControlMessage.from_json(msg["data"])  # type: ignore[arg-type]
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring malformed control message on %r", ch)
                return
            for sub in list(self._subs.get(ch, ())):
                sub._deliver(cm)

    async def _connect(self) -> None:
        ps = self._new_pubsub()
        wanted = list(self._subs)
        try:
            await ps.subscribe(*wanted)
        except BaseException:
            with contextlib.suppress(Exception):
                await ps.aclose()
            raise
        self._pubsub = ps
        conn = ps.connection
        host, port = getattr(conn, "host", None), getattr(conn, "port", None)
        self.node = (str(host), int(port)) if host is not None and port is not None else None
        # Channels added while SUBSCRIBE was in flight saw no pub/sub to send on.
        missing = [ch for ch in self._subs if ch not in wanted]
        if missing:
            await ps.subscribe(*missing)

    async def _drop(self) -> None:
        ps, self._pubsub, self.node = self._pubsub, None, None
        if ps is not None:
            with contextlib.suppress(Exception):
                await ps.aclose()

    async def _run(self) -> None:
        delay = self._backoff_s[0]
        lost = False
        while True:
            try:
                if self._stale is not None and self._pubsub is not None:
                    log.warning("control channels: their connection is to %s:%d, the primary is %s:%d now; "
                                "re-subscribing there", *(self.node or ("?", 0)), *self._stale)  # fmt: skip
                    self._stale = None
                    self.repoints += 1
                    await self._drop()
                    lost = True  # re-subscribed as after a loss (leases renewed at once on the new primary)
                    continue
                if self._pubsub is None:
                    if not self._subs:
                        self._wakeup.clear()
                        await self._wakeup.wait()
                        continue
                    await self._connect()
                    if lost:
                        self.reconnects += 1
                        log.info("control channels re-subscribed after a Redis connection loss")
                        lost = False
                        if self.on_reconnect is not None:
                            self.on_reconnect()
                    delay = self._backoff_s[0]
                assert self._pubsub is not None
                msg = await self._pubsub.get_message(timeout=1.0)
                if msg is not None:
                    self._dispatch(msg)
            except Exception as e:
                # Anything else (a protocol surprise) is handled the same way: a fresh connection, so
                # one bad read never silently ends every subscription of this replica.
                if not isinstance(e, UNAVAILABLE):
                    log.exception("control channel reader failed; reconnecting")
                else:
                    if self._breaker is not None:  # a lost pub/sub connection is news of Redis for everyone
                        self._breaker.failure(e)
                    if not lost:
                        log.warning("control channel connection lost (%s); reconnecting", e)
                lost = True
                await self._drop()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_s[1])

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for subs in list(self._subs.values()):
            for sub in subs:
                sub._wake_closed()
        self._subs.clear()
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._send(self._pubsub.unsubscribe())
        await self._drop()
