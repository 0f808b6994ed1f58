"""Clients written for OpenAI's speech API work unchanged: every voice name the installed `openai`
package types (Pipecat's OpenAITTSService accepts the same 13), custom voice references, and the
`x-request-id` header OpenAI's SDKs (and LiveKit's plugin) read."""

from __future__ import annotations

import json
import typing
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai.types.audio import speech_create_params

from gateway.aliases import OPENAI_VOICES


def openai_voice_names() -> list[str]:
    """The names in the `voice` Literal of the installed package's `speech.create` parameters."""
    names: list[str] = []
    for arm in typing.get_args(speech_create_params.Voice):
        if typing.get_origin(arm) is typing.Literal:
            names += typing.get_args(arm)
    return names


@pytest.fixture(scope="module")
def oai(gateway: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://{gateway}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_every_voice_name_of_the_openai_package_is_known() -> None:
    names = openai_voice_names()
    assert len(names) >= 13 and {"marin", "cedar"} <= set(names), names
    assert set(names) <= set(OPENAI_VOICES), set(names) - set(OPENAI_VOICES)


@pytest.mark.parametrize("voice", openai_voice_names())
def test_the_openai_client_speaks_with_every_voice_name(oai: openai.OpenAI, voice: str) -> None:
    audio = oai.audio.speech.create(model="gpt-4o-mini-tts", voice=voice, input="Hi.", response_format="pcm")
    assert len(audio.content) / 2 / 24000 > 0.1, voice


def test_a_voice_reference_object_names_a_registered_voice(gateway: str, oai: openai.OpenAI) -> None:
    body = json.dumps({"voice_id": "ref-voice", "base_voice": "joe", "speed": 1.2}).encode()
    req = urllib.request.Request(f"http://{gateway}/v1/audio/voices", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert r.status == 201
    audio = oai.audio.speech.create(model="tts-1", voice={"id": "ref-voice"}, input="Hi.", response_format="pcm")
    assert len(audio.content) > 0
    with pytest.raises(openai.BadRequestError) as err:
        oai.audio.speech.create(model="tts-1", voice={"id": "nobody"}, input="Hi.", response_format="pcm")
    assert err.value.code == "unknown_voice"


def test_every_response_carries_a_request_id(oai: openai.OpenAI) -> None:
    raw = oai.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Hi.", response_format="pcm")
    assert raw.request_id is not None and raw.request_id.startswith("req_"), raw.headers
    other = oai.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Hi.", response_format="pcm")
    assert other.request_id != raw.request_id
    with pytest.raises(openai.BadRequestError) as err:  # errors too: the id is what a bug report quotes
        oai.audio.speech.create(model="tts-1", voice="alloy", input=" ", response_format="pcm")
    assert err.value.request_id is not None


def test_the_clients_request_id_is_echoed_and_a_hostile_one_replaced(oai: openai.OpenAI) -> None:
    raw = oai.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Hi.", response_format="pcm",
                                                    extra_headers={"x-request-id": "agent-42.turn-7"})  # fmt: skip
    assert raw.request_id == "agent-42.turn-7"
    raw = oai.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Hi.", response_format="pcm",
                                                    extra_headers={"x-request-id": "a b" + "x" * 500})  # fmt: skip
    assert raw.request_id is not None and raw.request_id.startswith("req_")
