"""Write-behind: state writes a connection must not wait for, queued and written to Redis in order.

``put`` returns at once. One flusher task writes the queue head to tail through the circuit breaker;
while the breaker is open it waits, and replays from where it stopped once Redis answers again. The
queue is bounded by entries and by bytes: when full, the oldest entry is dropped with a log line and
``voxgate_state_writes_dropped_total{why="full"}``. Every queued write must be idempotent (Redis may
already have applied one that timed out on the client side), and each names the key it writes so a
read of that key on this replica can first wait for it (read-your-writes, bounded).

A write may also come as a script call (``put(..., call=(script, keys, args))``): where the store gives a
``run_batch``, such calls at the head of the queue go together, in order, in one pipeline (at most
``batch_max``) — one round trip for the utterance records falling due together instead of one each. A
batch that fails as a whole counts one attempt against its head, as that write alone would have.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import metrics
from .breaker import CircuitBreaker
from .errors import RETRYABLE, SessionStoreError

log = logging.getLogger("voxgate.sessions")

Call = tuple[Any, list[str], list[Any]]  # a script and its keys and args
# The calls' outcomes in order: each one's answer, or the error it came to (a SessionStoreError: refused).
RunBatch = Callable[[Sequence[Call]], Awaitable[Sequence[object]]]


@dataclass(eq=False)
class _Write:
    key: str
    what: str
    run: Callable[[], Awaitable[object]]
    size: int
    done: asyncio.Future[bool] = field(repr=False)
    call: Call | None = None  # the same write as a script call, which may go in a batch
    attempts: int = 0


class WriteBehind:
    def __init__(
        self, breaker: CircuitBreaker, *, max_entries: int = 4096, max_bytes: int = 16 * 1024 * 1024,
        max_attempts: int = 5, run_batch: RunBatch | None = None, batch_max: int = 64,
    ) -> None:
        self._breaker = breaker
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # A write that fails this many times while Redis otherwise answers is dropped, so one bad entry
        # cannot hold every write behind it for ever.
        self.max_attempts = max_attempts
        self._items: deque[_Write] = deque()
        self._by_key: dict[str, set[_Write]] = {}
        self._bytes = 0
        self._run_batch = run_batch
        self.batch_max = batch_max  # script calls per pipeline: bounds one round trip's size
        self._inflight: set[_Write] = set()  # under way: the head, or a batch at the head
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.written = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, key: str, what: str, run: Callable[[], Awaitable[object]], size: int = 0, *,
            call: Call | None = None) -> asyncio.Future[bool]:  # fmt: skip
        """Queue ``run`` (an idempotent write of ``key``; ``call``: the same write as a script call, for a
        batch). The future says whether it was written (False: dropped or refused); nobody has to wait."""
        loop = asyncio.get_running_loop()
        w = _Write(key, what, run, size, loop.create_future(), call)
        self._items.append(w)
        self._by_key.setdefault(key, set()).add(w)
        self._bytes += size
        metrics.WRITES_PENDING.inc()
        while len(self._items) > self.max_entries or (self._bytes > self.max_bytes and len(self._items) > 1):
            oldest = next((x for x in self._items if x not in self._inflight), w)
            if oldest is w:
                break  # only the in-flight writes and this one: keep them
            log.warning(
                "session store: write-behind buffer full (%d writes, %d bytes); dropped %s of %s",
                len(self._items), self._bytes, oldest.what, oldest.key,
            )
            self._finish(oldest, False, "full")
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush(), name="voxgate-store-write-behind")
        self._ready.set()
        return w.done

    def _finish(self, w: _Write, written: bool, why: str | None = None) -> None:
        if w.done.done():
            return  # finished already (closed while its batch was under way)
        with contextlib.suppress(ValueError):
            self._items.remove(w)  # the head almost always: O(1)
        keyed = self._by_key.get(w.key)
        if keyed is not None:
            keyed.discard(w)
            if not keyed:
                del self._by_key[w.key]
        self._bytes -= w.size
        metrics.WRITES_PENDING.dec()
        if written:
            self.written += 1
        else:
            self.dropped += 1
            metrics.WRITES_DROPPED.labels(why or "error").inc()
        if not w.done.done():
            w.done.set_result(written)

    async def settled(self, key: str, timeout: float) -> bool:
        """Wait (at most ``timeout``) until this replica's queued writes of ``key`` are done."""
        pending = [w.done for w in self._by_key.get(key, ())]
        if not pending:
            return True
        _, not_done = await asyncio.wait(pending, timeout=timeout)
        return not not_done

    async def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until everything queued so far is written or dropped."""
        if not self._items:
            return True
        last = self._items[-1].done
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(last), timeout)
        return last.done()

    async def _flush(self) -> None:
        while True:
            if not self._items:
                self._ready.clear()
                await self._ready.wait()
                continue
            if not self._breaker.is_closed:
                await self._breaker.wait_closed()
                continue
            if self._batchable():
                await self._flush_batch()
                continue
            w = self._items[0]
            self._inflight.add(w)
            try:
                await w.run()
            except RETRYABLE:
                # Redis stopped answering (the breaker counted it), or every connection was busy: keep it at
                # the head, replay in order.
                w.attempts += 1
                if w.attempts >= self.max_attempts:
                    log.warning("session store: %s of %s failed %d times; dropped", w.what, w.key, w.attempts)
                    self._finish(w, False, "failed")
            except SessionStoreError as e:  # e.g. the record is gone; its owner's lease renewal restores it
                log.info("session store: queued %s of %s refused (%s); dropped", w.what, w.key, e.code)
                self._finish(w, False, "refused")
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in one write must not stop every write after it
                log.exception("session store: queued %s of %s failed; dropped", w.what, w.key)
                self._finish(w, False, "error")
            else:
                self._finish(w, True)
            finally:
                self._inflight.clear()

    def _batchable(self) -> bool:
        """The head and the write after it are script calls, and the store runs batches."""
        items = self._items
        return self._run_batch is not None and len(items) > 1 and items[0].call is not None \
            and items[1].call is not None  # fmt: skip

    async def _flush_batch(self) -> None:
        """The script calls at the head, in order, in one pipeline."""
        assert self._run_batch is not None
        batch = list(itertools.islice(itertools.takewhile(lambda x: x.call is not None, self._items), self.batch_max))
        self._inflight.update(batch)
        try:
            outcomes = await self._run_batch([w.call for w in batch if w.call is not None])
        except RETRYABLE:
            head = batch[0]  # the batch stays at the head, in order, to replay; one attempt, the head's
            head.attempts += 1
            if head.attempts >= self.max_attempts:
                log.warning("session store: %s of %s failed %d times; dropped", head.what, head.key, head.attempts)
                self._finish(head, False, "failed")
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in one batch must not stop every write after it
            log.exception("session store: a batch of %d queued writes failed; dropped", len(batch))
            for w in batch:
                self._finish(w, False, "error")
            return
        finally:
            self._inflight.clear()
        for w, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, SessionStoreError):
                log.info("session store: queued %s of %s refused (%s); dropped", w.what, w.key, outcome.code)
                self._finish(w, False, "refused")
            elif isinstance(outcome, BaseException):
                log.error("session store: queued %s of %s failed; dropped", w.what, w.key, exc_info=outcome)
                self._finish(w, False, "error")
            else:
                self._finish(w, True)

    async def close(self, drain_s: float = 0.0) -> None:
        """Write what is queued for at most ``drain_s`` (Redis may come back within it), then stop; what is
        left is dropped (and logged)."""
        if drain_s > 0 and self._items:
            deadline = time.monotonic() + drain_s
            if await self._breaker.wait_closed(drain_s):
                await self.flush(max(0.0, deadline - time.monotonic()))
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=1.0)  # bounded: what is queued is failed below either way
            self._task = None
        if self._items:
            log.warning("session store: closing with %d state writes unwritten", len(self._items))
        for w in list(self._items):
            self._finish(w, False, "closed")
