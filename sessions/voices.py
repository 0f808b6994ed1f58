"""`VoiceShelf`: a tenant's registered voices in Redis, under the tenant's quotas.

A voice is one hash with no TTL (voices outlive restarts), indexed per tenant with its size beside it.
Every write that counts against a quota is one Lua script that counts and writes together, so
concurrent registrations on any replicas cannot pass a quota together; acknowledged writes (a put, a
delete) wait for a Redis replica where the primary has one (`SessionStore._acked`). The store reaches
Redis through its circuit breaker: the shelf is given the store's `call` and `acked`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from msgspec.structs import replace

from . import keys, scripts
from .errors import VoiceExists, VoiceLimitExceeded, VoiceQuotaExceeded
from .records import Voice, VoiceInfo, now_ms
from .store_settings import StoreSettings

Call = Callable[[Awaitable[Any]], Awaitable[Any]]
Acked = Callable[[Any, list[str], list[Any]], Awaitable[Any]]


class VoiceShelf:
    def __init__(self, client: aioredis.Redis, register: Callable[[str], Any], settings: StoreSettings,
                 call: Call, acked: Acked) -> None:
        self._client, self._settings, self._call, self._acked = client, settings, call, acked
        self._put_script = register(scripts.PUT_VOICE)
        self._delete_script = register(scripts.DELETE_VOICE)
        self._usage_script = register(scripts.VOICE_USAGE)

    async def put(self, tenant: str, voice: Voice, *, replace_existing: bool = False) -> Voice:
        """Store a voice (no TTL: voices outlive restarts). VoiceExists unless ``replace_existing``;
        VoiceLimitExceeded past ``max_voices_per_tenant`` or ``max_voice_bytes`` (this voice);
        VoiceQuotaExceeded past ``max_voice_bytes_per_tenant`` (all of the tenant's voices, counted and
        checked in the same script that writes, so concurrent registrations cannot pass it together)."""
        keys.check_id("voice", voice.voice_id)
        if not voice.created_ms:
            voice = replace(voice, created_ms=now_ms())
        fields = voice.to_fields()
        size = sum(len(k) + len(v.encode() if isinstance(v, str) else v) for k, v in fields.items())
        if size > self._settings.max_voice_bytes:
            raise VoiceLimitExceeded(f"voice data is {size} bytes; the limit is {self._settings.max_voice_bytes}")
        quota = self._settings.max_voice_bytes_per_tenant
        code, held = await self._acked(
            self._put_script,
            keys=[keys.voice(tenant, voice.voice_id), keys.voice_index(tenant), keys.voice_sizes(tenant)],
            args=[voice.voice_id, self._settings.max_voices_per_tenant, int(replace_existing), size, quota,
                  *(x for kv in fields.items() for x in kv)],
        )  # fmt: skip
        if code == -1:
            raise VoiceExists(f"voice {voice.voice_id} exists")
        if code == -2:
            raise VoiceLimitExceeded(f"tenant holds {self._settings.max_voices_per_tenant} voices already")
        if code == -3:
            raise VoiceQuotaExceeded(f"voice data is {size} bytes; the tenant's voices hold {held} of {quota} bytes "
                                     "(delete a voice to free its bytes)")  # fmt: skip
        return voice

    async def usage(self, tenant: str) -> tuple[int, int]:
        """(voices, bytes) the tenant's registered voices hold, as the quotas count them."""
        n, size = await self._call(self._usage_script(keys=[keys.voice_index(tenant), keys.voice_sizes(tenant)]))
        return int(n), int(size)

    async def get(self, tenant: str, voice_id: str) -> Voice | None:
        fields = await self._call(self._client.hgetall(keys.voice(tenant, voice_id)))
        return Voice.from_fields(fields) if fields else None

    async def infos(self, tenant: str) -> list[VoiceInfo]:
        """The tenant's voices, oldest first, without their audio or embeddings."""
        ids = sorted(await self._call(self._client.smembers(keys.voice_index(tenant))))
        pipe = self._client.pipeline(transaction=False)
        light = ["voice_id", "kind", "name", "ref_text", "metadata", "created_ms"]
        for vid in ids:
            k = keys.voice(tenant, vid.decode())
            pipe.hmget(k, light)
            pipe.hstrlen(k, "ref_audio")
            pipe.hstrlen(k, "embedding")
        res = await self._call(pipe.execute())
        out = []
        for i in range(len(ids)):
            vals, audio_len, emb_len = res[3 * i: 3 * i + 3]
            if vals[0] is None:  # deleted between SMEMBERS and HMGET
                continue
            f = dict(zip([n.encode() for n in light], vals, strict=True))
            v = Voice.from_fields(f)
            out.append(replace(v.info(), ref_audio_bytes=int(audio_len), embedding_dim=int(emb_len) // 4))
        return sorted(out, key=lambda v: (v.created_ms, v.voice_id))

    async def delete(self, tenant: str, voice_id: str) -> bool:
        """Delete a voice and free its bytes of the tenant's quota; False when there was none."""
        deleted = await self._acked(
            self._delete_script,
            keys=[keys.voice(tenant, voice_id), keys.voice_index(tenant), keys.voice_sizes(tenant)], args=[voice_id]
        )
        return int(deleted) > 0
