"""The engine contract's typed request: `StreamRequest` checked once against declared bounds, engines
declaring what they can do, and `check(request)` answering as `open_stream` would without opening."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import websockets
from support.servers import serve

from engine import Engine, EngineError, StreamRequest
from engine.options import stream_request
from engine.types import ReferenceClip


@pytest.mark.parametrize(
    ("voice", "language", "options", "code"),
    [
        (None, "en", {"speed": float("nan")}, "invalid_option"),
        (None, "en", {"speed": True}, "invalid_option"),
        (None, "en", {"speed": 10**400}, "invalid_option"),
        (None, "en", {"sample_rate": 16000.0}, "invalid_option"),  # strict: a float is no rate
        (None, "en", {"sample_rate": "16000"}, "invalid_option"),
        (None, "en", {"seed": 2**63}, "invalid_option"),
        (None, "en", {"output": "x" * 10_000}, "invalid_option"),
        (None, "en", {"ref_text": "only a transcript"}, "invalid_option"),
        (None, "en", {"ref_audio": b""}, "invalid_option"),
        (None, "en", {"p" * 10_000: 1}, "invalid_option"),
        (7, "en", {}, "unknown_voice"),
        (None, ["en"], {}, "unsupported_language"),
        ("v" * 10_000, "en", {}, "unknown_voice"),
    ],
)
def test_a_bad_option_is_refused_with_its_code_and_a_bounded_message(voice: Any, language: Any,
                                                                       options: dict[str, Any], code: str) -> None:
    with pytest.raises(EngineError) as err:
        stream_request(voice, language, options)
    assert err.value.code == code and len(str(err.value)) < 300, str(err.value)


def test_options_round_trip_through_the_request() -> None:
    options = {"sample_rate": 16000, "speed": 1.5, "seed": 7, "instructions": "calm", "output": "codec_tokens",
               "ref_audio": b"RIFF", "ref_text": "hello"}  # fmt: skip
    request = stream_request("v", None, options)
    assert request == StreamRequest(voice="v", language="auto", sample_rate=16000, speed=1.5, seed=7,
                                    instructions="calm", output="codec_tokens",
                                    reference=ReferenceClip(b"RIFF", "hello"))  # fmt: skip
    assert request.options() == options
    assert stream_request(None, "en", {}).options() == {}


def test_the_cpu_voices_declare_what_they_cannot_do(piper_engine: Engine) -> None:
    assert isinstance(piper_engine, Engine)
    assert piper_engine.supports_cloning is False and piper_engine.codec_info() is None
    for options, code in [({"output": "codec_tokens"}, "codec_tokens_unsupported"),
                          ({"ref_audio": b"RIFF"}, "voice_cloning_unsupported")]:  # fmt: skip
        with pytest.raises(EngineError) as err:
            piper_engine.check(stream_request(None, "en", options))
        assert err.value.code == code
        with pytest.raises(EngineError) as err:
            piper_engine.open_stream(None, "en", **options)
        assert err.value.code == code


@pytest.mark.parametrize(("voice", "language", "code"), [("nobody", "en", "unknown_voice"),
                                                         (None, "klingon", "unsupported_language")])  # fmt: skip
def test_check_refuses_what_open_stream_refuses(piper_engine: Engine, voice: str | None, language: str,
                                                code: str) -> None:
    with pytest.raises(EngineError) as err:
        piper_engine.check(stream_request(voice, language, {}))
    assert err.value.code == code
    with pytest.raises(EngineError) as opened:
        piper_engine.open_stream(voice, language)
    assert opened.value.code == code


class CountingEngine:
    """The served engine, counting the streams the gateway opens."""

    def __init__(self, engine: Engine) -> None:
        self._engine, self.opened = engine, 0
        self.sample_rate = engine.sample_rate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def open_stream(self, voice: str | None, language: str, **options: object) -> Any:
        self.opened += 1
        return self._engine.open_stream(voice, language, **options)


async def test_session_config_opens_no_stream(piper_engine: Engine) -> None:
    engine = CountingEngine(piper_engine)
    for url in serve(engine):  # type: ignore[arg-type]
        async with websockets.connect(f"ws://{url}/v1/audio/speech/stream") as ws:
            for language in ("en", "auto", "en"):
                await ws.send(json.dumps({"type": "session.config", "language": language, "sample_rate": 16000}))
                assert json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "session.ready"
            await ws.send(json.dumps({"type": "session.config", "voice": "nobody"}))
            err = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert err["type"] == "error" and err["code"] == "unknown_voice", err
        assert engine.opened == 0
