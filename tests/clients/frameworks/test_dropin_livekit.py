"""The real `livekit-plugins-elevenlabs` and `livekit-plugins-cartesia`, unmodified, pointed at voxgate by
their `base_url` (docs/elevenlabs.md, docs/cartesia.md): streams speak with timed words, on their defaults
(ElevenLabs' mp3_22050_32), over the plugin's pooled socket; their HTTP (chunked) paths speak too; an
interruption (the stream closed, as LiveKit's agent does) stops the audio, LiveKit keeps the words that
played, and the next turns speak at once."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from clients.frameworks.conftest import Server
from clients.frameworks.livekit_rig import LONG, SHORT, interrupted_session, speak, words
from livekit.plugins import cartesia, elevenlabs

pytestmark = pytest.mark.clients
PATHS = {"elevenlabs": "/v1/text-to-speech/joe/multi-stream-input", "cartesia": "/tts/websocket"}


def plugin(provider: str, server: str, session: aiohttp.ClientSession) -> object:
    if provider == "elevenlabs":
        return elevenlabs.TTS(api_key="any", base_url=f"http://{server}/v1", voice_id="joe", http_session=session)
    return cartesia.TTS(api_key="any", base_url=f"http://{server}", voice="joe", http_session=session)


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_a_stream_speaks_with_timed_words_turn_after_turn_on_one_socket(
    voxgate: Server, http_session: aiohttp.ClientSession, provider: str
) -> None:
    tts = plugin(provider, voxgate.addr, http_session)
    sockets = voxgate.accepted(PATHS[provider])
    try:
        for _ in range(3):  # three turns, on the plugin's pooled socket
            spoken = await speak(tts, SHORT)
            assert spoken.seconds > 1.5
            assert words("".join(spoken.timed)) == words(SHORT), spoken.timed
            starts = [t.start_time for t in spoken.timed]
            assert starts == sorted(starts) and starts[-1] < spoken.seconds
    finally:
        await tts.aclose()  # type: ignore[attr-defined]
    assert voxgate.accepted(PATHS[provider]) - sockets == 1


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_the_http_path_speaks(voxgate_server: str, http_session: aiohttp.ClientSession, provider: str) -> None:
    tts = plugin(provider, voxgate_server, http_session)
    try:
        seconds = 0.0
        async with asyncio.timeout(60):
            async for ev in tts.synthesize(SHORT):  # type: ignore[attr-defined]
                seconds += ev.frame.duration
        assert seconds > 1.5
    finally:
        await tts.aclose()  # type: ignore[attr-defined]


# The LLM still writing (12 tokens/s) when the stream is closed a second into its audio.
@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_a_stream_closed_mid_reply_stops_its_audio_and_keeps_the_words_heard(
    voxgate: Server, http_session: aiohttp.ClientSession, provider: str
) -> None:
    tts = plugin(provider, voxgate.addr, http_session)
    sockets = voxgate.accepted(PATHS[provider])
    try:
        cut = await speak(tts, LONG, stop_after_s=1.0, tokens_per_s=12)
        audio_went_on_s = await voxgate.audio_settles()
        turns = [await speak(tts, SHORT) for _ in range(2)]
    finally:
        await tts.aclose()  # type: ignore[attr-defined]
    kept = words("".join(t for t in cut.timed if t.start_time < cut.seconds))
    assert 0 < len(kept) < len(words(LONG)) // 2 and words(LONG)[: len(kept)] == kept
    # Neither plugin cuts what it already sent: LiveKit's ElevenLabs closes the context (close_context, which
    # voxgate, as ElevenLabs, plays out: Pipecat closes every turn so and must hear all of it), its Cartesia
    # says nothing and drops the socket from its pool (closed at its next turn). The server's audio goes on
    # for what was sent, a sentence at a time (a few seconds made at several times real time), then stops;
    # the plugins drop it.
    assert audio_went_on_s < 4.0, audio_went_on_s
    for turn in turns:
        assert words("".join(turn.timed)) == words(SHORT) and 1.5 < turn.seconds < 6  # nothing stale
        assert turn.first_audio_s is not None and turn.first_audio_s < 2.5
    # LiveKit's ElevenLabs closes the context on its shared socket (voxgate cuts what was still open); its
    # Cartesia sends nothing and drops the socket from its pool (voxgate ends the session with the socket),
    # so its next turns open one more.
    assert voxgate.accepted(PATHS[provider]) - sockets == (1 if provider == "elevenlabs" else 2)


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_an_agent_session_interrupted_keeps_what_played_and_speaks_on(
    voxgate: Server, http_session: aiohttp.ClientSession, provider: str
) -> None:
    tts = plugin(provider, voxgate.addr, http_session)
    sockets = voxgate.accepted(PATHS[provider])
    try:
        out = await interrupted_session(tts, then=[SHORT, SHORT])
    finally:
        await tts.aclose()  # type: ignore[attr-defined]
    assert out.played_after - out.played_at_interrupt < 0.25  # at most the frame that was playing
    assert out.interrupted
    assert 0 < len(words(out.said)) < len(words(LONG)) // 2 and words(LONG)[: len(words(out.said))] == words(out.said)
    # The next turns speak their own words. Their first audio can wait behind the interrupted reply: say()
    # sent all of it, and LiveKit's ElevenLabs closes nothing at an interruption once its input is all sent
    # (it drops the context's audio), so voxgate, whose contexts play in the order they began, synthesises the
    # rest of LONG first (0.3–2.6 s measured on 2 loaded cores; ElevenLabs would interleave the contexts).
    # LiveKit gives a stream 10 s.
    for first, text in out.next_turns:
        assert words(text) == words(SHORT) and first < 5.0, out.next_turns
    # One socket; for Cartesia two where the interruption came before its audio had all arrived (above).
    opened = voxgate.accepted(PATHS[provider]) - sockets
    assert opened == 1 or (provider == "cartesia" and opened == 2), opened
