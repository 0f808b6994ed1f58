"""The real `livekit-plugins-elevenlabs` and `livekit-plugins-cartesia`, unmodified, pointed at voxgate by
their `base_url` (docs/elevenlabs.md, docs/cartesia.md): streams speak with timed words, on their defaults
(ElevenLabs' mp3_22050_32), and their HTTP (chunked) paths speak too."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
from livekit.plugins import cartesia, elevenlabs

pytestmark = pytest.mark.clients
SHORT = "Hello there. This is voxgate, speaking through LiveKit."


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


def plugin(provider: str, server: str, session: aiohttp.ClientSession) -> object:
    if provider == "elevenlabs":
        return elevenlabs.TTS(api_key="any", base_url=f"http://{server}/v1", voice_id="joe", http_session=session)
    return cartesia.TTS(api_key="any", base_url=f"http://{server}", voice="joe", http_session=session)


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_a_stream_speaks_with_timed_words(voxgate_server: str, provider: str) -> None:
    async with aiohttp.ClientSession() as session:
        tts = plugin(provider, voxgate_server, session)
        try:
            for _ in range(2):  # two turns, on the plugin's pooled socket
                stream = tts.stream()  # type: ignore[attr-defined]
                for token in re.findall(r"\s*\S+", SHORT):
                    stream.push_text(token)
                stream.end_input()
                seconds, timed = 0.0, []
                async with asyncio.timeout(60):
                    async for ev in stream:
                        seconds += ev.frame.duration
                        timed.extend(ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, []))
                await stream.aclose()
                assert seconds > 1.5
                assert words("".join(timed)) == words(SHORT), timed
                starts = [t.start_time for t in timed]
                assert starts == sorted(starts) and starts[-1] < seconds
        finally:
            await tts.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("provider", ["elevenlabs", "cartesia"])
async def test_the_http_path_speaks(voxgate_server: str, provider: str) -> None:
    async with aiohttp.ClientSession() as session:
        tts = plugin(provider, voxgate_server, session)
        try:
            seconds = 0.0
            async with asyncio.timeout(60):
                async for ev in tts.synthesize(SHORT):  # type: ignore[attr-defined]
                    seconds += ev.frame.duration
            assert seconds > 1.5
        finally:
            await tts.aclose()  # type: ignore[attr-defined]
