"""A WebSocket connection's hold on its session in the shared store (sessions/).

Keeps the Connection free of Redis details: attaching (create or resume, lease, control channel),
config writes, the spoken-text log, per-tenant stream slots, and the cancel/takeover events that
other replicas send. Failures of the store become protocol errors with the store's codes.

Audio and acknowledgements never wait on Redis (docs/sessions.md): `begin`, `record` and `update` return at
once (the local copy is updated, Redis is written behind); `acquire_slot` falls back to this replica's
own count while Redis is not answering. Only `attach` and `resolve_voice` (at `session.config`) read
Redis, and they fail fast with `state_unavailable` while the store's circuit is open. A session start
waits its turn for one of the store's connections (sessions/gate.py) when a burst of them holds every
one; past the store's `pool_wait_s` it is refused as capacity is: `queue_full`, `bound: "session_start"`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from engine import Engine
from gateway.aliases import SHIPPED, Aliases
from gateway.protocol import ProtocolError, SessionConfig, quote
from gateway.voices import resolve_voice
from sessions import (
    AttachedSession,
    ControlMessage,
    SessionStore,
    SessionStoreError,
    StateUnavailable,
    StoreBusy,
    StreamSlot,
    Tenant,
)
from sessions.lexicon import Lexicon, LexiconStore

log = logging.getLogger("voxgate.sessions")

# What is stored of a config: everything but the message type and the id itself.
# (An inline reference is refused at config time; it never goes to the store, megabytes per session.)
_NOT_STORED = ("type", "session_id", "ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding")


def refusal(e: SessionStoreError) -> ProtocolError:
    """The store's refusal as the client hears it; a busy store is a capacity refusal, with admission's
    fields (`bound`, `retry_after_s`) so a client retries it as it retries a full queue."""
    if isinstance(e, StoreBusy):
        return ProtocolError(e.code, str(e), bound="session_start", retry_after_s=e.retry_after_s)
    return ProtocolError(e.code, str(e))


async def acquire_stream_slot(store: SessionStore, tenant: Tenant) -> StreamSlot | None:
    """One of the tenant's `max_streams` concurrent streams, for every engine stream it opens (a WebSocket
    utterance, an HTTP speech request, a batch item); None when the tenant has no limit. At the limit:
    StreamLimitExceeded (`stream_limit`). While Redis is not answering, the limit is held by this
    replica's own count of the tenant's streams (per replica, not across them)."""
    if tenant.max_streams is None:
        return None
    slot = await store.acquire_stream(tenant.name, tenant.max_streams, local_fallback=True)
    slot.start_keepalive()
    return slot


async def release_stream_slot(slot: StreamSlot | None) -> None:
    """Give a stream slot back (idempotent; None: the tenant has no limit)."""
    if slot is not None:
        await slot.release()


def config_fields(cfg: SessionConfig) -> dict[str, Any]:
    fields = msgspec.to_builtins(cfg)
    return {k: v for k, v in fields.items() if k not in _NOT_STORED}


class SessionBinding:
    def __init__(self, store: SessionStore, tenant: Tenant, aliases: Aliases = SHIPPED) -> None:
        self.store = store
        self.tenant = tenant
        self.aliases = aliases  # the voice names a config may use besides the engine's (gateway/aliases.py)
        self.attached: AttachedSession | None = None

    @property
    def session_id(self) -> str:
        assert self.attached is not None
        return self.attached.session_id

    @property
    def resumed(self) -> bool:
        return self.attached is not None and self.attached.resumed

    @property
    def next_utterance(self) -> int:
        assert self.attached is not None
        return self.attached.record.next_utterance

    async def attach(self, cfg: SessionConfig, explicit: dict[str, Any]) -> SessionConfig:
        """Create the session, or resume `cfg.session_id`: then the stored config is the base and the
        fields this message set explicitly override it. Returns the effective config."""
        try:
            self.attached = await self.store.attach(
                self.tenant.name, session_id=cfg.session_id, config=config_fields(cfg), voice=cfg.voice_name
            )
        except SessionStoreError as e:
            raise refusal(e) from None
        if not self.attached.resumed:
            return cfg
        merged = self.attached.record.config | {k: v for k, v in explicit.items() if k not in _NOT_STORED}
        try:
            return msgspec.convert(merged | {"session_id": cfg.session_id}, SessionConfig)
        except msgspec.ValidationError as e:
            raise ProtocolError("invalid_config", f"the stored session config is invalid: {e}") from None

    async def update(self, cfg: SessionConfig) -> None:
        """A config re-sent between utterances: applied at once, written behind (a resume elsewhere sees
        it once Redis has it; this connection speaks from its local copy meanwhile)."""
        assert self.attached is not None
        self.attached.update(config=config_fields(cfg), voice=cfg.voice_name)

    def begin(self, utterance: int) -> None:
        """The utterance's audio is about to go out: log it as started (write-behind), so a replica
        killed mid-utterance leaves it named in the spoken log and a resume elsewhere goes on after it."""
        if self.attached is not None:
            self.attached.begin_utterance(utterance)

    async def record(self, utterance: int, spoken: str, *, cancelled: bool) -> None:
        """Log what was spoken: in the local copy at once, in Redis write-behind (never awaited)."""
        if self.attached is not None:
            self.attached.record_utterance(utterance, spoken, cancelled=cancelled)

    async def acquire_slot(self) -> StreamSlot | None:
        """A per-tenant stream slot, when the tenant has a limit (`acquire_stream_slot`)."""
        try:
            return await acquire_stream_slot(self.store, self.tenant)
        except SessionStoreError as e:
            raise refusal(e) from None

    async def resolve_voice(self, engine: Engine, name: str | None) -> tuple[str | None, dict[str, Any]]:
        """An alias's voice, an engine voice, or a registered preset/clone from the tenant's registry."""
        try:
            return await resolve_voice(self.store, self.tenant, engine, name, self.aliases)
        except (StateUnavailable, StoreBusy) as e:
            raise refusal(e) from None

    async def lexicon(self, lexicon: str | None) -> Lexicon | None:
        """The tenant's lexicon a session names (None: it names none); unknown_lexicon when there is none."""
        if lexicon is None:
            return None
        try:
            found = await LexiconStore(self.store).get(self.tenant.name, lexicon)
        except SessionStoreError as e:
            raise refusal(e) from None
        if found is None:
            raise ProtocolError("unknown_lexicon", f"no lexicon {quote(lexicon)} (PUT /v1/lexicons/{{name}} first)")
        return found

    async def events(self) -> AsyncIterator[ControlMessage]:
        assert self.attached is not None
        async for msg in self.attached.events():
            yield msg

    async def close(self) -> None:
        if self.attached is not None:
            with contextlib.suppress(Exception):
                await self.attached.close()
