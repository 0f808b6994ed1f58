"""Prometheus metrics of the session store (on the process's default registry, so the gateway's
``/metrics`` shows them). Gauges are summed over every store of the process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

BREAKER_OPEN = Gauge("voxgate_state_breaker_open", "session stores whose Redis circuit is open (Redis not answering)")
BREAKER_TRIPS = Counter("voxgate_state_breaker_trips_total", "times a session store's Redis circuit opened")
WRITES_PENDING = Gauge("voxgate_state_writes_pending", "state writes queued for Redis (write-behind)")
WRITES_DROPPED = Counter(
    "voxgate_state_writes_dropped_total", "queued state writes dropped: buffer full, or refused on replay", ["why"]
)
STREAMS_LOCAL = Counter(
    "voxgate_state_streams_local_total", "stream slots granted from this replica's own count while Redis was away"
)
WRITES_UNREPLICATED = Counter(
    "voxgate_state_writes_unreplicated_total",
    "acknowledged writes (voices, the spoken log) no replica confirmed within replica_ack_timeout_s",
)
POOL_WAITS = Counter(
    "voxgate_state_pool_waits_total", "store calls that waited for a free connection (every one was in use)"
)
POOL_REFUSED = Counter(
    "voxgate_state_pool_refused_total", "store calls refused (queue_full) after waiting pool_wait_s for a connection"
)
