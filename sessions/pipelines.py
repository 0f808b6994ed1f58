"""Several Lua script calls in one round trip to Redis: the store's batched lease and slot renewals and its
write-behind's batched utterance writes (sessions/store.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from . import metrics
from .errors import SessionNotFound
from .writebehind import Call

log = logging.getLogger("voxgate.sessions")

Guarded = Callable[[Awaitable[Any], float | None], Awaitable[Any]]  # the breaker's call(op, timeout)


async def run_scripts(client: Any, guarded: Guarded, calls: Sequence[Call], *, timeout: float | None = None,
                      wait_replica_ms: int | None = None) -> list[object]:  # fmt: skip
    """`calls` in order in one pipeline: each one's answer, or the error its script raised. With
    `wait_replica_ms`, a WAIT for one replica follows them on the same connection (so it covers every one)
    and its answer comes last. EVALSHA itself, not the scripts' own pipeline calls: those ask SCRIPT EXISTS
    first, a second round trip every time. A Redis that lost its scripts (restarted empty) is given them,
    then the batch once more: callers batch only idempotent writes."""
    results: list[object] = []
    for _ in range(2):
        pipe = client.pipeline(transaction=False)
        for script, ks, args in calls:
            pipe.evalsha(script.sha, len(ks), *ks, *args)
        if wait_replica_ms is not None:
            pipe.execute_command("WAIT", 1, wait_replica_ms)
        results = list(await guarded(pipe.execute(raise_on_error=False), timeout))
        if not any(isinstance(r, NoScriptError) for r in results):
            break
        for script in {id(c[0]): c[0] for c in calls}.values():
            await guarded(client.script_load(script.script), None)
    return results


async def acked_writes(client: Any, guarded: Guarded, calls: Sequence[Call], *, op_timeout_s: float,
                       replica_ack_s: float | None) -> list[object]:  # fmt: skip
    """Queued script writes (the write-behind's), in order, in one pipeline, acknowledged as the store's
    one-by-one writes are: with `replica_ack_s` (the primary has a replica), one WAIT after them all.
    Each one's answer, or its error (`SessionNotFound` where the script says the session is gone)."""
    wait_ms = None if replica_ack_s is None else int(replica_ack_s * 1000)
    results = await run_scripts(client, guarded, calls, timeout=op_timeout_s + (replica_ack_s or 0.0),
                                wait_replica_ms=wait_ms)  # fmt: skip
    if replica_ack_s is not None:
        acks = results.pop()
        if not isinstance(acks, int) or acks == 0:
            metrics.WRITES_UNREPLICATED.inc(len(calls))
            log.warning("session store: no replica acknowledged %d writes from %s within %.2f s", len(calls),
                        calls[0][1][0], replica_ack_s)  # fmt: skip
    return [SessionNotFound(f"session of {c[1][0]} not found") if isinstance(r, int) and r < 0 else r
            for c, r in zip(calls, results, strict=True)]  # fmt: skip


async def outcome(op: Awaitable[object]) -> object:
    """`op`'s result, or the exception it raised (a batch answers one outcome each)."""
    try:
        return await op
    except Exception as e:
        return e
