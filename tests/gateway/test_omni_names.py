"""Clients of vLLM-Omni's protocol (and the other services voxgate stands in for) work on names alone:
every common form of an API key (issue 39), the Qwen3-TTS model ids and speaker names they default to,
and a refusal, never a silent substitute, for a capability the served model lacks. A real gateway (Piper)
with keys configured, real websockets and HTTP clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from support.servers import serve

from engine import Engine
from gateway.connection import Limits
from sessions import hash_api_key

KEY = "sk-omni-test"
# What each kind of client sends (vLLM-Omni's harnesses: Api-Key; ElevenLabs': xi-api-key; …).
HEADER_FORMS = [
    {"Authorization": f"Bearer {KEY}"},
    {"Authorization": f"Api-Key {KEY}"},
    {"Authorization": f"api-key {KEY}"},
    {"Authorization": f"Token {KEY}"},
    {"xi-api-key": KEY},
    {"X-API-Key": KEY},
]
SPEECH = {"input": "Hello there.", "response_format": "pcm"}


@pytest.fixture(scope="module")
def keyed(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=5.0), api_keys=f"acme={hash_api_key(KEY)}")


async def ws_events(url: str, config: dict[str, Any], text: str = "Hello there.", headers: dict[str, str] | None = None,
                    ) -> list[dict[str, Any]]:  # fmt: skip
    """The JSON events of one utterance (to session.done, or to the first error), binary frames counted
    as {"type": "binary"}."""
    async with websockets.connect(url, additional_headers=headers or {}, max_size=None, open_timeout=10) as ws:
        with contextlib.suppress(websockets.ConnectionClosed):  # a refused session is closed at once
            await ws.send(json.dumps({"type": "session.config", **config}))
            await ws.send(json.dumps({"type": "input.text", "text": text}))
            await ws.send(json.dumps({"type": "input.done"}))
        events: list[dict[str, Any]] = []
        while True:
            try:
                message = await asyncio.wait_for(ws.recv(), 30)
            except websockets.ConnectionClosed:
                return events
            if isinstance(message, bytes):
                events.append({"type": "binary"})
                continue
            events.append(json.loads(message))
            if events[-1]["type"] in ("session.done", "error"):
                return events


@pytest.mark.parametrize("headers", HEADER_FORMS, ids=lambda h: next(iter(h.items()))[1].split()[0])
def test_every_key_header_form_is_a_key_over_http(keyed: str, headers: dict[str, str]) -> None:
    r = httpx.post(f"http://{keyed}/v1/audio/speech", json=SPEECH, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert len(r.content) > 1000


def test_a_wrong_key_in_any_form_is_refused(keyed: str) -> None:
    for headers in ({"Authorization": "Api-Key nope"}, {"xi-api-key": "nope"}, {"Authorization": "Basic " + KEY}):
        r = httpx.post(f"http://{keyed}/v1/audio/speech", json=SPEECH, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text
    # A key in the URL is for WebSockets only (browsers cannot set their headers): HTTP URLs end up in logs.
    r = httpx.post(f"http://{keyed}/v1/audio/speech?api_key={KEY}", json=SPEECH, timeout=30)
    assert r.status_code == 401


@pytest.mark.parametrize("headers", HEADER_FORMS, ids=lambda h: next(iter(h.items()))[1].split()[0])
async def test_every_key_header_form_opens_a_websocket_session(keyed: str, headers: dict[str, str]) -> None:
    events = await ws_events(f"ws://{keyed}/v1/audio/speech/stream", {"voice": "default"}, headers=headers)
    assert events[0]["type"] == "session.ready", events
    assert events[-1]["type"] == "session.done" and {"type": "binary"} in events


@pytest.mark.parametrize("param", ["api_key", "api-key"])
async def test_a_query_key_opens_a_websocket_session(keyed: str, param: str) -> None:
    events = await ws_events(f"ws://{keyed}/v1/audio/speech/stream?{param}={KEY}", {})
    assert events[-1]["type"] == "session.done", events


async def test_a_missing_websocket_key_is_refused_with_the_forms_named(keyed: str) -> None:
    events = await ws_events(f"ws://{keyed}/v1/audio/speech/stream", {}, headers={"Authorization": "Api-Key nope"})
    assert events[0]["type"] == "error" and events[0]["code"] == "unauthorized"
    assert "Api-Key" in events[0]["message"] and "xi-api-key" in events[0]["message"]


# ---- names: the Qwen3-TTS model ids and speakers vLLM-Omni's clients default to, OpenAI's voices ----

OMNI = {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "speaker": "Vivian", "task_type": "CustomVoice",
        "language": "Auto", "response_format": "pcm", "stream_audio": True}  # fmt: skip
API_KEY = {"Authorization": f"Api-Key {KEY}"}


@pytest.mark.parametrize("speaker", ["Vivian", "Ryan", "uncle_fu", "Ono_Anna", "alloy"])
async def test_a_vllm_omni_client_speaks_with_its_default_model_id_and_speaker_names(keyed: str, speaker: str) -> None:
    events = await ws_events(f"ws://{keyed}/v1/audio/speech/stream", OMNI | {"speaker": speaker}, headers=API_KEY)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, events
    assert kinds[0] == "session.ready" and kinds[-1] == "session.done" and "binary" in kinds


@pytest.mark.parametrize("model", ["Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "Qwen3-TTS-12Hz-1.7B-Base", "tts-1"])
def test_model_ids_and_speakers_of_other_services_speak_over_http(keyed: str, model: str) -> None:
    body = SPEECH | {"model": model, "voice": "Ryan"}
    r = httpx.post(f"http://{keyed}/v1/audio/speech", json=body, headers=API_KEY, timeout=30)
    assert r.status_code == 200, r.text


def test_the_voice_list_names_the_aliases_in_force(keyed: str) -> None:
    r = httpx.get(f"http://{keyed}/v1/audio/voices", headers=API_KEY, timeout=10)
    aliases = r.json()["aliases"]
    assert aliases["vivian"] == "default" and aliases["alloy"] == "default", aliases


@pytest.fixture(scope="module")
def configured(cpu_engine: Engine) -> Iterator[str]:
    """Shipped aliases off, one table entry each: only the tables and the served names are known."""
    yield from serve(cpu_engine, Limits(config_timeout=5.0), shipped_aliases=False,
                     voice_aliases={"Narrator": "joe"}, model_aliases={"house-tts": "piper"})  # fmt: skip


async def test_without_shipped_aliases_only_the_tables_and_served_names_resolve(configured: str) -> None:
    url = f"ws://{configured}/v1/audio/speech/stream"
    events = await ws_events(url, {"model": "house-tts", "voice": "narrator"})  # the table, in any case
    assert events[0]["type"] == "session.ready" and events[-1]["type"] == "session.done", events
    events = await ws_events(url, {"voice": "Vivian"})
    assert events[-1]["type"] == "error" and events[-1]["code"] == "unknown_voice", events
    events = await ws_events(url, {"model": OMNI["model"]})
    assert events[-1]["type"] == "error" and events[-1]["code"] == "unknown_model", events
    r = httpx.post(f"http://{configured}/v1/audio/speech", json=SPEECH | {"voice": "alloy"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_voice", r.text


# ---- capabilities the served model lacks: refused by code, never served as something else ----

CLONE_ASKS = [
    {"task_type": "Base", "x_vector_only_mode": True, "ref_audio": "data:audio/wav;base64,UklGRg=="},
    {"task_type": "Base"},
    {"ref_audio": "https://example.com/me.wav", "ref_text": "hello"},
]


@pytest.mark.parametrize("ask", CLONE_ASKS, ids=["base-xvector", "base", "ref-audio"])
async def test_cloning_on_a_model_that_cannot_clone_is_refused(keyed: str, ask: dict[str, Any]) -> None:
    events = await ws_events(f"ws://{keyed}/v1/audio/speech/stream", OMNI | ask, headers=API_KEY)
    assert events[0]["type"] == "error" and events[0]["code"] == "voice_cloning_unsupported", events
    assert "binary" not in [e["type"] for e in events]
    r = httpx.post(f"http://{keyed}/v1/audio/speech", json=SPEECH | ask, headers=API_KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "voice_cloning_unsupported", r.text


async def test_voice_design_on_a_model_that_designs_no_voices_is_refused(keyed: str) -> None:
    ask = {"task_type": "VoiceDesign", "instructions": "A calm, low voice."}
    events = await ws_events(f"ws://{keyed}/v1/audio/speech/stream", OMNI | ask, headers=API_KEY)
    assert events[0]["type"] == "error" and events[0]["code"] == "voice_design_unsupported", events
    r = httpx.post(f"http://{keyed}/v1/audio/speech", json=SPEECH | ask, headers=API_KEY, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "voice_design_unsupported", r.text
    # Instructions alone are a style hint, which the CPU voices ignore (as OpenAI's clients expect of tts-1).
    r = httpx.post(f"http://{keyed}/v1/audio/speech", json=SPEECH | {"instructions": "calm"}, headers=API_KEY,
                   timeout=30)  # fmt: skip
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def qwen_variants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Tiny Qwen3 Base and VoiceDesign checkpoints, served under their Hub names."""
    from engine import load_engine
    from engine.qwen3 import make_tiny_checkpoint

    base, design = "Qwen3-TTS-12Hz-0.6B-Base", "Qwen3-TTS-12Hz-1.7B-VoiceDesign"
    engines = {}
    for name, kind in ((base, "base"), (design, "voice_design")):
        path = make_tiny_checkpoint(tmp_path_factory.mktemp(kind), seed=0, model_type=kind)
        engines[name] = load_engine(str(path), max_streams=2, frames_per_token=2.0, min_frames=6)
    try:
        yield from serve(None, Limits(config_timeout=5.0), model=f"{base},{design}", engines=engines,
                         engine_processes=False)  # fmt: skip
    finally:
        for engine in engines.values():
            engine.close()


async def test_a_model_that_can_clone_wants_the_clone_registered_not_inline(qwen_variants: str) -> None:
    ask = {"model": "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "task_type": "Base", "ref_audio": "data:,", "ref_text": "hi"}
    events = await ws_events(f"ws://{qwen_variants}/v1/audio/speech/stream", ask)
    assert events[0]["type"] == "error" and events[0]["code"] == "inline_reference_unsupported", events


async def test_voice_design_on_a_voice_design_model_speaks(qwen_variants: str) -> None:
    ask = {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", "task_type": "VoiceDesign", "language": "English",
           "instructions": "A calm, low voice.", "response_format": "pcm", "stream_audio": True}  # fmt: skip
    events = await ws_events(f"ws://{qwen_variants}/v1/audio/speech/stream", ask)
    kinds = [e["type"] for e in events]
    assert "error" not in kinds and "binary" in kinds and kinds[-1] == "session.done", events
    # The same model refuses to clone: it says so rather than speak a designed voice instead.
    events = await ws_events(f"ws://{qwen_variants}/v1/audio/speech/stream", ask | {"task_type": "Base"})
    assert events[0]["code"] == "voice_cloning_unsupported", events
