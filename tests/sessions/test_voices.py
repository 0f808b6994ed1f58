"""Voice registry: per tenant, shared by replicas, bytes and embeddings exact, bounded."""

from __future__ import annotations

import pytest

from sessions import SessionStore, Voice, VoiceExists, VoiceLimitExceeded, VoiceQuotaExceeded

from .conftest import MakeStore

AUDIO = bytes(range(256)) * 64  # every byte value: no text decoding anywhere on the way


async def test_cloned_voice_round_trips_on_another_replica(make_store: MakeStore) -> None:
    a, b = await make_store("a"), await make_store("b")
    emb = (0.25, -1.5, 0.125, 7.0)  # float32-exact: embeddings are stored as float32
    stored = await a.put_voice("acme", Voice(
        "anna", kind="clone", name="Anna", ref_audio=AUDIO, speaker_embedding=emb,
        ref_text="Hello there. 你好。", metadata={"format": "wav", "language": "en"},
    ))
    assert stored.created_ms > 0
    got = await b.get_voice("acme", "anna")
    assert got == stored
    assert got is not None and got.ref_audio == AUDIO and got.speaker_embedding == emb


async def test_preset_without_audio(store: SessionStore) -> None:
    v = Voice("calm", kind="preset", metadata={"base": "vivian", "instructions": "calm, slow"})
    await store.put_voice("acme", v)
    got = await store.get_voice("acme", "calm")
    assert got is not None
    assert (got.kind, got.ref_audio, got.speaker_embedding, got.ref_text) == ("preset", None, None, None)
    assert got.metadata["base"] == "vivian"


async def test_listing_omits_blobs_but_reports_their_size(store: SessionStore) -> None:
    await store.put_voice("acme", Voice("a", ref_audio=AUDIO, created_ms=1))
    await store.put_voice("acme", Voice("b", speaker_embedding=(1.0, 2.0), created_ms=2))
    infos = await store.list_voices("acme")
    assert [(i.voice_id, i.ref_audio_bytes, i.embedding_dim) for i in infos] == [
        ("a", len(AUDIO), 0), ("b", 0, 2),
    ]


async def test_voices_are_invisible_to_other_tenants(store: SessionStore) -> None:
    await store.put_voice("acme", Voice("anna", ref_audio=b"x"))
    assert await store.get_voice("other", "anna") is None
    assert await store.list_voices("other") == []
    assert not await store.delete_voice("other", "anna")
    assert await store.get_voice("acme", "anna") is not None


async def test_existing_voice_is_kept_unless_replacing(store: SessionStore) -> None:
    await store.put_voice("acme", Voice("anna", ref_audio=b"old"))
    with pytest.raises(VoiceExists):
        await store.put_voice("acme", Voice("anna", ref_audio=b"new"))
    await store.put_voice("acme", Voice("anna", speaker_embedding=(1.0,)), replace_existing=True)
    got = await store.get_voice("acme", "anna")
    assert got is not None and (got.ref_audio, got.speaker_embedding) == (None, (1.0,))


async def test_voice_count_and_size_are_bounded(store: SessionStore) -> None:
    for i in range(3):  # max_voices_per_tenant=3 in the test settings
        await store.put_voice("acme", Voice(f"v{i}"))
    with pytest.raises(VoiceLimitExceeded):
        await store.put_voice("acme", Voice("v3"))
    await store.put_voice("acme", Voice("v0", ref_audio=b"y"), replace_existing=True)  # replacing is fine
    await store.put_voice("other", Voice("v3"))  # the limit is per tenant
    with pytest.raises(VoiceLimitExceeded):
        await store.put_voice("other", Voice("big", ref_audio=b"\0" * ((1 << 20) + 1)))


async def test_deleted_voice_is_gone_and_frees_its_place(store: SessionStore) -> None:
    for i in range(3):
        await store.put_voice("acme", Voice(f"v{i}"))
    assert await store.delete_voice("acme", "v1")
    assert not await store.delete_voice("acme", "v1")
    assert await store.get_voice("acme", "v1") is None
    await store.put_voice("acme", Voice("v3"))
    assert [v.voice_id for v in await store.list_voices("acme")] == ["v0", "v2", "v3"]


async def test_a_tenants_voices_are_bounded_by_bytes_and_a_delete_frees_them(make_store: MakeStore) -> None:
    store = await make_store("a", max_voices_per_tenant=100, max_voice_bytes_per_tenant=10_000)
    clip = b"\1" * 3000  # each voice holds a little more: its other fields count too
    for i in range(3):
        await store.put_voice("acme", Voice(f"v{i}", ref_audio=clip))
    voices, held = await store.voice_usage("acme")
    assert voices == 3 and 9000 < held <= 10_000
    with pytest.raises(VoiceQuotaExceeded) as err:
        await store.put_voice("acme", Voice("v3", ref_audio=clip))
    assert err.value.code == "voice_quota_exceeded" and "bytes" in str(err.value)
    assert isinstance(err.value, VoiceLimitExceeded)  # callers that catch the older error still do
    assert await store.get_voice("acme", "v3") is None
    await store.put_voice("other", Voice("v3", ref_audio=clip))  # the quota is per tenant
    # Replacing a voice counts its new size only, not the old one besides.
    await store.put_voice("acme", Voice("v0", ref_audio=clip), replace_existing=True)
    assert await store.delete_voice("acme", "v1")
    assert (await store.voice_usage("acme"))[1] < held - 3000
    await store.put_voice("acme", Voice("v3", ref_audio=clip))
    assert (await store.voice_usage("acme"))[0] == 3


async def test_concurrent_registrations_cannot_pass_the_byte_quota_together(make_store: MakeStore) -> None:
    import asyncio

    limits = {"max_voices_per_tenant": 100, "max_voice_bytes_per_tenant": 10_000}  # bytes bind first
    a, b = await make_store("a", **limits), await make_store("b", **limits)
    results = await asyncio.gather(
        *(s.put_voice("acme", Voice(f"v{i}", ref_audio=b"\2" * 3000)) for i, s in enumerate([a, b] * 5)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, Voice) for r in results) == 3
    assert all(isinstance(r, VoiceQuotaExceeded) for r in results if not isinstance(r, Voice))
    assert (await a.voice_usage("acme"))[1] <= 10_000
