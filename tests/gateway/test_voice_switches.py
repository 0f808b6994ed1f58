"""Voice names a client ported from elsewhere sends, on the native WebSocket route, and a voice that cannot
speak a language the session may speak: it is switched for that language, and `session.ready` says so.
A real gateway on the CPU voices (Piper's joe for English, Kokoro for Mandarin), real websockets clients."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from support.servers import serve
from support.wsclient import open_session, utterance

from gateway.connection import Limits
from voxgate_client import events as client_events

HELLO_ZH = "你好，请问有什么可以帮您？"


@pytest.fixture(scope="module")
def both_voices() -> Iterator[str]:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    from engine import load_engine

    engine = load_engine("cpu", warmup=False)
    try:
        yield from serve(engine, Limits(config_timeout=5.0), model="cpu")
    finally:
        engine.close()


async def speak(addr: str, text: str, **config: Any) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
    ws, ready = await open_session(addr, **config)
    try:
        assert ready["type"] == "session.ready", ready
        events, binary = await utterance(ws, text)
    finally:
        await ws.close()
    return ready, events, sum(map(len, binary))


@pytest.mark.parametrize("voice", ["alloy", "coral", "Vivian"])
async def test_openai_and_qwen_voice_names_speak_on_the_native_websocket(both_voices: str, voice: str) -> None:
    """`voice: "alloy"` in a plain session.config (no vLLM-Omni fields) speaks, as it does over HTTP."""
    ready, events, audio = await speak(both_voices, "Hello there.", voice=voice, language="auto")
    assert ready["voice"] == voice and "voice_switches" not in ready, ready  # the language-aware default
    assert events[-1]["type"] == "session.done" and audio > 0, events


async def test_a_voice_without_mandarin_is_switched_for_it_and_ready_says_so(both_voices: str) -> None:
    ready, events, audio = await speak(both_voices, HELLO_ZH, voice="joe", language="auto")
    assert ready["voice"] == "joe" and ready["voice_switches"] == {"zh": "jf_gongitsune"}, ready
    assert events[-1]["type"] == "session.done" and audio > 0, events
    typed = client_events.decode_event(json.dumps(ready).encode())
    assert isinstance(typed, client_events.SessionReady) and typed.voice_switches == {"zh": "jf_gongitsune"}


async def test_a_voice_that_speaks_every_language_asked_is_not_switched(both_voices: str) -> None:
    for config in ({"voice": "joe", "language": "en"}, {"voice": "jf_alpha", "language": "auto"}, {}):
        ready, _, _ = await speak(both_voices, "Hi.", **({"voice": None, "language": "auto"} | config))
        assert "voice_switches" not in ready, (config, ready)


async def test_a_voice_named_with_a_language_it_cannot_speak_is_refused_not_switched(both_voices: str) -> None:
    """Asked by name for a language it lacks, a voice is refused (the client said both; neither is
    guessed); only `auto` switches, and says so."""
    ws, answer = await open_session(both_voices, voice="joe", language="zh")
    await ws.close()
    assert answer["type"] == "error" and answer["code"] == "unsupported_language", answer
