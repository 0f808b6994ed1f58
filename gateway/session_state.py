"""A WebSocket connection's hold on its session in the shared store (sessions/).

Keeps the Connection free of Redis details: attaching (create or resume, lease, control channel),
config writes, the spoken-text log, per-tenant stream slots, and the cancel/takeover events that
other replicas send. Failures of the store become protocol errors with the store's codes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from engine import Engine
from gateway.protocol import ProtocolError, SessionConfig
from gateway.voices import resolve_voice
from sessions import (
    AttachedSession,
    ControlMessage,
    SessionStore,
    SessionStoreError,
    StateUnavailable,
    StreamSlot,
    Tenant,
)

log = logging.getLogger("voxgate.sessions")

# What is stored of a config: everything but the message type and the id itself.
_NOT_STORED = ("type", "session_id")


def config_fields(cfg: SessionConfig) -> dict[str, Any]:
    fields = msgspec.to_builtins(cfg)
    return {k: v for k, v in fields.items() if k not in _NOT_STORED}


class SessionBinding:
    def __init__(self, store: SessionStore, tenant: Tenant) -> None:
        self.store = store
        self.tenant = tenant
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
            raise ProtocolError(e.code, str(e)) from None
        if not self.attached.resumed:
            return cfg
        merged = self.attached.record.config | {k: v for k, v in explicit.items() if k not in _NOT_STORED}
        try:
            return msgspec.convert(merged | {"session_id": cfg.session_id}, SessionConfig)
        except msgspec.ValidationError as e:
            raise ProtocolError("invalid_config", f"the stored session config is invalid: {e}") from None

    async def update(self, cfg: SessionConfig) -> None:
        """A config re-sent between utterances: Redis has it before the client hears `session.ready`."""
        assert self.attached is not None
        try:
            await self.attached.update(config=config_fields(cfg), voice=cfg.voice_name)
        except SessionStoreError as e:
            raise ProtocolError(e.code, str(e)) from None

    async def record(self, utterance: int, spoken: str, *, cancelled: bool) -> None:
        """Log what was spoken. With Redis down the session keeps speaking from its local copy."""
        if self.attached is None:
            return
        try:
            await self.attached.record_utterance(utterance, spoken, cancelled=cancelled)
        except SessionStoreError as e:  # down, or the record expired/was lost: the lease renewal restores it
            log.warning("session %s: utterance %d kept locally (%s)", self.session_id, utterance, e.code)

    async def acquire_slot(self) -> StreamSlot | None:
        """A per-tenant stream slot, when the tenant has a limit."""
        if self.tenant.max_streams is None:
            return None
        try:
            slot = await self.store.acquire_stream(self.tenant.name, self.tenant.max_streams)
        except SessionStoreError as e:
            raise ProtocolError(e.code, str(e)) from None
        slot.start_keepalive()
        return slot

    async def resolve_voice(self, engine: Engine, name: str | None) -> tuple[str | None, dict[str, Any]]:
        """An engine voice, or a registered preset/clone from the tenant's registry."""
        try:
            return await resolve_voice(self.store, self.tenant, engine, name)
        except StateUnavailable as e:
            raise ProtocolError(e.code, str(e)) from None

    async def events(self) -> AsyncIterator[ControlMessage]:
        assert self.attached is not None
        async for msg in self.attached.events():
            yield msg

    async def close(self) -> None:
        if self.attached is not None:
            with contextlib.suppress(Exception):
                await self.attached.close()
