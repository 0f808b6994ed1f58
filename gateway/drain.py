"""Graceful drain: how a replica leaves a deployment without cutting a listener off mid-sentence.

On SIGTERM (gateway/server.py) the replica stops taking sessions (``/health`` answers 503 ``draining``
so a balancer sends new ones elsewhere; a new WebSocket is told ``draining`` and closed with
``CLOSE_RECONNECT``). Each open connection is closed with ``CLOSE_RECONNECT`` ("reconnect and resume
elsewhere") as soon as it has no utterance open or playing, so an utterance under way finishes first;
whatever is still speaking when ``drain_grace_s`` runs out is closed then. Closing a connection
releases its session's lease and its stream slots (the session record stays resumable), so the client
resumes on another replica with ``session_id`` and goes on with the next utterance index.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from gateway.errors import ApiError
from gateway.protocol import CLOSE_RECONNECT

log = logging.getLogger("voxgate")

DRAIN_REASON = "server draining: reconnect and resume the session elsewhere"
# A request refused while draining is told to come back after this (a balancer retries another replica
# at once: nginx's proxy_next_upstream http_503).
DRAIN_RETRY_AFTER_S = 1.0


def refuse_while_draining(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """A guard for every HTTP route that starts work (speech, batch, voice registration): while the
    replica drains it answers 503 `draining` with `Retry-After`, so no new stream starts that the drain
    would have to wait for or cut."""
    drain: Drain | None = connection.app.state.get("drain")
    if drain is not None and drain.draining:
        raise ApiError("the server is draining: send the request again (to another replica)", code="draining",
                       status=503, retry_after_s=DRAIN_RETRY_AFTER_S)  # fmt: skip


class Drainable(Protocol):
    """What the drain reads of a connection (gateway/connection.py's ``Connection`` is one)."""

    @property
    def current(self) -> object | None: ...  # the utterance receiving text

    @property
    def playing(self) -> object: ...  # finished input, audio still to send (a sized collection)

    def stop(self, code: int | None = None, reason: str = "") -> None: ...


class Drain:
    def __init__(self, grace_s: float = 30.0, poll_s: float = 0.02) -> None:
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.draining = False
        self._open: set[Drainable] = set()

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, conn: Drainable) -> None:
        self._open.add(conn)

    def closed(self, conn: Drainable) -> None:
        self._open.discard(conn)

    @staticmethod
    def _idle(conn: Drainable) -> bool:
        return conn.current is None and not conn.playing  # type: ignore[arg-type]

    async def run(self) -> float:
        """Drain: returns the seconds it took, once every connection is closed (or a second past the
        grace period, for connections slow to go)."""
        t0 = time.monotonic()
        self.draining = True
        log.info("draining: %d connections; new sessions refused; grace %.0f s", len(self._open), self.grace_s)
        deadline = t0 + self.grace_s
        told: set[Drainable] = set()
        while self._open:
            past = time.monotonic() >= deadline
            for conn in list(self._open - told):
                if past or self._idle(conn):
                    if not self._idle(conn):
                        log.warning("draining: grace period over; closing a connection mid-utterance")
                    conn.stop(CLOSE_RECONNECT, DRAIN_REASON)
                    told.add(conn)
            if past and time.monotonic() >= deadline + 1.0:
                break  # each was told to stop; its close is under way (bounded in Connection.run)
            await asyncio.sleep(self.poll_s)
        took = time.monotonic() - t0
        log.info("drained in %.2f s (%d connections left)", took, len(self._open))
        return took
