"""POST /v1/audio/speech through the official `openai` client, and the API's error shapes."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator

import openai
import pytest
import soundfile


@pytest.fixture(scope="module")
def oai(gateway: str) -> Iterator[openai.OpenAI]:
    # Closed here, not by the garbage collector: an httpx client finalised on a thread that Litestar's
    # logging setup was starting logged under the lock that setup held, and the test run hung.
    with openai.OpenAI(base_url=f"http://{gateway}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_openai_client_streams_wav(gateway: str, oai: openai.OpenAI) -> None:
    with oai.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="Hello from the OpenAI client.", response_format="wav"
    ) as response:
        assert response.headers["x-audio-sample-rate"] == "24000"
        assert response.headers["x-audio-channels"] == "1"
        chunks = list(response.iter_bytes())
    data = b"".join(chunks)
    with wave.open(io.BytesIO(data)) as w:
        assert w.getframerate() == 24000
    assert (len(data) - 44) / 2 / 24000 > 0.8  # real speech, well over half a second


@pytest.mark.parametrize("fmt", ["mp3", "flac", "opus"])
def test_openai_client_compressed_formats(gateway: str, oai: openai.OpenAI, fmt: str) -> None:
    audio = oai.audio.speech.create(
        model="tts-1", voice="nova", input="Compressed speech.", response_format=fmt
    )
    samples, rate = soundfile.read(io.BytesIO(audio.content))
    assert len(samples) / rate > 0.4


def test_pcm_at_a_requested_rate(gateway: str, oai: openai.OpenAI) -> None:
    audio = oai.audio.speech.create(
        model="tts-1", voice="joe", input="Eight kilohertz.", response_format="pcm",
        extra_body={"sample_rate": 8000},
    )  # fmt: skip
    assert 0.5 < len(audio.content) / 2 / 8000 < 4


def test_sse_stream_format(gateway: str) -> None:
    body = json.dumps({"input": "Server sent events.", "response_format": "pcm", "stream_format": "sse"}).encode()
    req = urllib.request.Request(f"http://{gateway}/v1/audio/speech", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert events[0]["type"] == "speech.audio.delta" and len(pcm) > 24000


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": ""}, "input", "invalid_value"),
        ({"input": "x" * 5000}, "input", "string_above_max_length"),
        ({"input": "hi", "speed": 9}, "speed", "invalid_value"),
        ({"input": "hi", "response_format": "aac"}, "response_format", "invalid_value"),
        ({"input": "hi", "response_format": "ogg"}, "response_format", "invalid_value"),
        ({"input": "hi", "voice": "nobody"}, "voice", "unknown_voice"),
        ({"voice": "alloy"}, "input", "invalid_value"),
    ],
)
def test_errors_have_the_openai_shape(gateway: str, oai: openai.OpenAI, body: dict, param: str, code: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.post("/audio/speech", body=body, cast_to=bytes)
    err = e.value.body
    assert isinstance(err, dict) and err["param"] == param and err["code"] == code, err
    assert err["type"] == "invalid_request_error" and err["message"]


def test_voices_are_listed_with_languages_and_aliases(gateway: str) -> None:
    with urllib.request.urlopen(f"http://{gateway}/v1/audio/voices") as r:
        body = json.load(r)
    assert {"name": "joe", "languages": ["en"], "kind": "preset"}.items() <= body["voices"][0].items()
    assert body["aliases"]["alloy"] == "default"


def test_malformed_json_body(gateway: str) -> None:
    req = urllib.request.Request(f"http://{gateway}/v1/audio/speech", b"{nope", {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400 and json.load(e.value)["error"]["code"] == "invalid_json"


def test_without_an_engine_http_routes_say_503_in_openai_shape() -> None:
    from litestar.testing import TestClient

    from gateway.app import create_app
    from gateway.settings import Settings

    # A loopback name: open mode answers no other Host (gateway/browser.py), and the client's default is
    # testserver.local.
    app = create_app(Settings(model="/no/such/checkpoint"))  # the load fails
    with TestClient(app, base_url="http://localhost") as client:
        for method, path in (("GET", "/v1/audio/voices"), ("POST", "/v1/audio/speech")):
            r = client.request(method, path, json={"input": "hi"})
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == "engine_not_ready"
            assert r.headers["x-request-id"].startswith("req_")
        assert client.get("/health").status_code == 503
        with client.websocket_connect("/v1/audio/speech/stream") as ws:  # told why in an event, then closed
            assert ws.receive_json()["code"] == "engine_not_ready"
