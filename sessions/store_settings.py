"""The session store's settings (`StoreSettings`, each with its unit and reason) and the health it
reports (`StoreHealth`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .backends import BackendKind

TakeoverPolicy = Literal["takeover", "refuse"]


@dataclass(frozen=True)
class StoreSettings:
    session_ttl_s: float = 3600.0  # how long an idle, unowned session stays resumable
    lease_ttl_s: float = 15.0  # a dead owner blocks a 'refuse' resume at most this long
    stream_ttl_s: float = 30.0  # a crashed replica's stream slots count at most this long
    # Share of a renewal period (TTL/3) a lease's or slot's renewal may come early, to join the renewals
    # due within that window in one pipeline: hundreds of sessions cost about one call a second, not
    # hundreds (sessions/leases.py `Renewals`). Early only shortens a period; the TTL is unchanged.
    renew_early: float = 0.2
    spoken_log_max: int = 20  # utterances kept in the spoken-text log
    takeover: TakeoverPolicy = "takeover"
    max_voices_per_tenant: int = 1000
    max_voice_bytes: int = 2 * 1024 * 1024  # one voice, all fields; a compact 30 s clip is ≤ 1.44 MB
    max_voice_bytes_per_tenant: int = 64 * 1024 * 1024  # all of a tenant's voices (inside the gateway if embedded)
    connect_timeout_s: float = 0.5
    op_timeout_s: float = 0.5  # one call slower than this opens the circuit: Redis counts as unavailable
    # A call whose op timeout passed on this replica's account (Redis answered other calls meanwhile, or
    # the event loop ran late: a burst of sessions on busy cores) waits this much longer for its answer,
    # which is on its way, before it is refused with `queue_full`; refusing sooner throws away Redis's work.
    busy_grace_s: float = 2.0
    breaker_failures: int = 2  # connection errors in a row (after redis-py's quick retries) that open it
    heartbeat_s: float = 0.5  # a PING this often while closed: a stalled Redis is noticed without traffic
    write_behind_max: int = 4096  # queued writes kept while Redis is away; the oldest is dropped past it
    write_behind_max_bytes: int = 16 * 1024 * 1024
    # An acknowledged write (a voice, the spoken log) waits this long for one replica to hold it, where
    # the primary has one (WAIT 1): below op_timeout_s, so a lagging replica never opens the circuit.
    replica_ack_timeout_s: float = 0.2
    # Connections this replica opens to Redis at most (each of its pools is sized for it: a reconnect
    # storm of 512 sessions needs no more than this many at once, since a call holds one for ~1 ms).
    # Redis's maxclients (10000) bounds the replicas × this.
    max_connections: int = 256
    # How long a call waits its turn for a connection when every one is in use before it is refused with
    # `queue_full` (StoreBusy): demand past what the pool serves in this time is refused as capacity.
    pool_wait_s: float = 5.0


@dataclass(frozen=True)
class StoreHealth:
    status: Literal["ok", "degraded"]
    backend: BackendKind | Literal["embedded"]
    latency_ms: float | None
    error: str | None = None  # a short stable phrase, safe to show anyone (no address, no exception text)
    pending_writes: int = 0  # write-behind entries not yet in Redis
