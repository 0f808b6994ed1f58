"""The tenant voice registry: presets work with any engine, clones only where the engine can clone."""

from __future__ import annotations

import base64
import json
from typing import Any

import openai
import pytest
from support.servers import serve
from support.wsclient import call, utterance

from engine import Engine
from sessions import hash_api_key

KEYS = f"acme={hash_api_key('acme-key')},beta={hash_api_key('beta-key')}"


@pytest.fixture(scope="module")
def keyed_gateway(cpu_engine: Engine) -> Any:
    yield from serve(cpu_engine, api_keys=KEYS)


def seconds_of(addr: str, key: str, voice: str) -> float:
    with openai.OpenAI(base_url=f"http://{addr}/v1", api_key=key, max_retries=0) as client:  # closed now, not by GC
        audio = client.audio.speech.create(
            model="tts-1", voice=voice, input="Hello there, how are you?", response_format="pcm"
        )
    return len(audio.content) / 2 / 24000


def test_a_preset_is_an_engine_voice_with_defaults(keyed_gateway: str) -> None:
    status, body = call(keyed_gateway, "POST", "/v1/audio/voices", "acme-key",
                        {"voice_id": "slow-joe", "base_voice": "joe", "speed": 0.5, "description": "calm"})  # fmt: skip
    assert status == 201 and body["kind"] == "preset", body
    assert (
        call(keyed_gateway, "POST", "/v1/audio/voices", "acme-key", {"voice_id": "slow-joe", "base_voice": "joe"})[0]
        == 409
    )
    _, listing = call(keyed_gateway, "GET", "/v1/audio/voices", "acme-key")
    assert {"name": "slow-joe", "kind": "preset", "base_voice": "joe"}.items() <= listing["voices"][-1].items()
    assert listing["cloning"] is False
    # The preset's speed reaches the engine: half speed is clearly longer (Piper samples its
    # durations, so the ratio varies around 2 from run to run).
    ratio = seconds_of(keyed_gateway, "acme-key", "slow-joe") / seconds_of(keyed_gateway, "acme-key", "joe")
    assert 1.25 < ratio < 3.0, ratio
    # Another tenant sees nothing of it.
    _, other = call(keyed_gateway, "GET", "/v1/audio/voices", "beta-key")
    assert all(v["name"] != "slow-joe" for v in other["voices"])
    assert call(keyed_gateway, "DELETE", "/v1/audio/voices/slow-joe", "beta-key")[0] == 404
    assert call(keyed_gateway, "DELETE", "/v1/audio/voices/slow-joe", "acme-key") == (
        200,
        {"id": "slow-joe", "object": "voice", "deleted": True},
    )
    assert call(keyed_gateway, "DELETE", "/v1/audio/voices/slow-joe", "acme-key")[0] == 404


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"voice_id": "c", "ref_audio": base64.b64encode(b"RIFF").decode(), "ref_text": "hi"}, 400,
         "voice_cloning_unsupported"),
        ({"voice_id": "p", "base_voice": "nobody"}, 400, "unknown_voice"),
        ({"voice_id": "p"}, 400, "invalid_value"),
        ({"voice_id": "bad id!", "base_voice": "joe"}, 400, "invalid_id"),
        ({"voice_id": "p", "base_voice": "joe", "colour": "blue"}, 400, "invalid_value"),
    ],
)  # fmt: skip
def test_bad_voice_registrations(keyed_gateway: str, body: dict[str, Any], status: int, code: str) -> None:
    got, err = call(keyed_gateway, "POST", "/v1/audio/voices", "acme-key", body)
    assert got == status and err["error"]["code"] == code, err


def test_the_registry_needs_a_key(keyed_gateway: str) -> None:
    assert call(keyed_gateway, "GET", "/v1/audio/voices", None)[0] == 401
    assert call(keyed_gateway, "POST", "/v1/audio/voices", "nope", {"voice_id": "x", "base_voice": "joe"})[0] == 401


async def test_a_websocket_session_can_use_a_registered_voice(keyed_gateway: str) -> None:
    import websockets

    assert (
        call(keyed_gateway, "POST", "/v1/audio/voices", "acme-key", {"voice_id": "agent", "base_voice": "joe"})[0]
        == 201
    )
    url = f"ws://{keyed_gateway}/v1/audio/speech/stream?api_key=acme-key"  # browsers' way to send a key
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.config", "voice": "agent"}))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "session.ready" and ready["voice"] == "agent"
        events, audio = await utterance(ws, "Registered voices work here too.")
        assert events[-1]["type"] == "session.done" and sum(map(len, audio)) > 24000, events[-1]


@pytest.mark.parametrize("voice_id", ["joe", "JOE", "default", "auto", "alloy", "Nova"])
def test_a_voice_named_like_an_engine_voice_or_alias_is_refused(keyed_gateway: str, voice_id: str) -> None:
    """Engine voices, default/auto and OpenAI's names are resolved before the registry: a voice registered
    under one of them would never apply, so it is refused."""
    status, err = call(keyed_gateway, "POST", "/v1/audio/voices", "acme-key",
                       {"voice_id": voice_id, "base_voice": "joe", "speed": 0.5})  # fmt: skip
    assert status == 400 and err["error"]["code"] == "voice_id_reserved", err
    assert err["error"]["param"] == "voice_id"


@pytest.mark.parametrize(("field", "value"), [
    ("voice_id", "v" * 129), ("description", "d" * 501), ("instructions", "i" * 501), ("ref_text", "t" * 2001),
    ("base_voice", "b" * 129),
])  # fmt: skip
def test_every_text_field_of_a_registration_is_bounded(keyed_gateway: str, field: str, value: str) -> None:
    body = {"voice_id": "bounded", "base_voice": "joe"} | {field: value}
    status, err = call(keyed_gateway, "POST", "/v1/audio/voices", "acme-key", body)
    # OpenAI's code for an over-long string, as on the speech routes
    assert status == 400 and err["error"]["code"] == "string_above_max_length" and err["error"]["param"] == field, err
    assert value not in err["error"]["message"]  # not echoed back


def test_the_listing_shows_what_the_tenants_voices_hold(keyed_gateway: str) -> None:
    preset = {"voice_id": "counted", "base_voice": "joe"}
    assert call(keyed_gateway, "POST", "/v1/audio/voices", "beta-key", preset)[0] == 201
    _, listing = call(keyed_gateway, "GET", "/v1/audio/voices", "beta-key")
    usage = listing["usage"]
    assert usage["voices"] == 1 and 0 < usage["bytes"] < 1000, usage
    assert (usage["max_voices"], usage["max_bytes"]) == (1000, 64 * 1024 * 1024)
    assert call(keyed_gateway, "DELETE", "/v1/audio/voices/counted", "beta-key")[0] == 200
    assert call(keyed_gateway, "GET", "/v1/audio/voices", "beta-key")[1]["usage"]["bytes"] == 0
