"""`Verdicts`: the child engine's answers to `check(request)`, asked over the wire and remembered.

A verdict is `(code, message)`, `("", "")` when the request may open. The declarations a child judges
by are static for one child, so a verdict is cached (at most `CHECK_CACHE`, least recently used out)
until the next child is warm (`clear`). An ask not yet answered waits at most `CHECK_TIMEOUT_S`; when
the child goes away every waiting ask is released with the `engine_unavailable` verdict (`release`).
The listener hints of a request schedule but never decide a verdict, so they are not part of its key.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from engine.process import wire
from engine.types import StreamRequest

UNAVAILABLE = "engine_unavailable"  # a new stream while the engine is not warm
CHECK_TIMEOUT_S = 2.0  # a check is a dictionary look-up in the child: this long means it is stuck
CHECK_CACHE = 512  # check results kept (a session.config repeats its request at every open)

Verdict = tuple[str, str]


@dataclass
class _Pending:
    key: bytes  # the request's, in the check cache
    done: threading.Event = field(default_factory=threading.Event)
    result: Verdict = (UNAVAILABLE, "the engine process went away")


class Verdicts:
    """The check cache and the asks in flight; `send` queues a command for the child."""

    def __init__(self, spec: str, send: Callable[[wire.Command], None]) -> None:
        self._spec, self._send = spec, send
        self._lock = threading.Lock()
        self._rids = itertools.count(1)
        self._asked: dict[int, _Pending] = {}
        self._cache: OrderedDict[bytes, Verdict] = OrderedDict()

    def judge(self, request: StreamRequest, *, wait: bool) -> Verdict | None:
        """The verdict on `request`: cached, or asked of the child and (`wait`) waited for; None when only
        asked (not waiting: the answer fills the cache)."""
        key, verdict = self._cached(request)
        if verdict is None:
            verdict = self._ask(key, request, wait=wait)
        return verdict

    def answered(self, msg: wire.Checked) -> None:
        """The child's answer to an ask: remembered, and its waiter released."""
        with self._lock:
            pending = self._asked.pop(msg.rid, None)
        if pending is not None:
            pending.result = (msg.code, msg.message)
            self._remember(pending.key, pending.result)
            pending.done.set()

    def clear(self) -> None:
        """A new child is warm: what the last one said no longer holds."""
        with self._lock:
            self._cache.clear()

    def release(self) -> None:
        """The child went away: every ask still waiting gets the `engine_unavailable` verdict."""
        with self._lock:
            asked, self._asked = list(self._asked.values()), {}
        for pending in asked:
            pending.done.set()

    def _cached(self, request: StreamRequest) -> tuple[bytes, Verdict | None]:
        judged = msgspec.structs.replace(request, listener_buffer_s=None, listener=None)
        key = hashlib.blake2b(wire.command_encoder.encode(judged), digest_size=16).digest()
        with self._lock:
            result = self._cache.get(key)
            if result is not None:
                self._cache.move_to_end(key)
        return key, result

    def _remember(self, key: bytes, result: Verdict) -> None:
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > CHECK_CACHE:
                self._cache.popitem(last=False)

    def _ask(self, key: bytes, request: StreamRequest, *, wait: bool) -> Verdict | None:
        pending, rid = _Pending(key), next(self._rids)
        with self._lock:
            self._asked[rid] = pending
        self._send(wire.Check(rid, request))
        if not wait:
            return None
        if not pending.done.wait(CHECK_TIMEOUT_S):
            with self._lock:
                self._asked.pop(rid, None)
            return UNAVAILABLE, f"the engine {self._spec!r} did not answer within {CHECK_TIMEOUT_S:g} s"
        return pending.result
