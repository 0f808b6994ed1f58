"""The real LiveKit Agents speaking through voxgate: `voxgate_client.livekit.TTS` streams, as LiveKit's
agent pipeline drives them (push_text token by token, end_input, read SynthesizedAudio; aclose() at an
interruption)."""

from __future__ import annotations

import asyncio

import pytest
from clients.frameworks.livekit_rig import LONG, SHORT, speak, words

from voxgate_client import AudioCancelled
from voxgate_client.livekit import TTS

pytestmark = pytest.mark.clients


async def test_a_stream_speaks_with_timed_words(voxgate_server: str) -> None:
    tts = TTS(url=f"ws://{voxgate_server}", voice="joe", language="en")
    try:
        spoken = await speak(tts, SHORT)
    finally:
        await tts.aclose()
    seconds, timed = spoken.seconds, spoken.timed
    assert seconds > 1.5
    assert words("".join(timed)) == words(SHORT)
    starts = [t.start_time for t in timed]
    assert starts == sorted(starts) and starts[0] >= 0 and starts[-1] < seconds
    assert all(t.end_time >= t.start_time for t in timed)


@pytest.mark.parametrize("contexts", [True, False], ids=["contexts", "utterances"])
async def test_closing_a_stream_cancels_on_the_same_socket_and_leaves_no_stale_audio(
    voxgate_server: str, contexts: bool
) -> None:
    tts = TTS(url=f"ws://{voxgate_server}", voice="joe", language="en", contexts=contexts)
    cancelled: list[AudioCancelled] = []
    tts.on("voxgate_cancelled", cancelled.append)  # type: ignore[arg-type]
    try:
        cut = await speak(tts, LONG, stop_after_s=1.0)  # the agent is interrupted a second in
        cut_at, timed_cut = cut.seconds, cut.timed
        socket = tts._vx_session.websocket  # type: ignore[union-attr]
        async with asyncio.timeout(10):
            while not cancelled:
                await asyncio.sleep(0.02)
        spoken = await speak(tts, SHORT)  # the next turn on the same socket: only its own audio
        seconds, timed = spoken.seconds, spoken.timed
        assert tts._vx_session is not None and tts._vx_session.websocket is socket
    finally:
        await tts.aclose()
    assert cancelled[0].cancelled
    assert words("".join(timed)) == words(SHORT)
    assert 1.5 < seconds < 6  # SHORT alone (about 3 s): nothing of LONG came after its cancel
    # What LiveKit's transcript keeps of the cut turn (the words timed before the playback position): a
    # non-empty prefix of LONG, far from all of it. Timings come ahead of their audio, so more words arrived.
    assert words(LONG)[: len(words("".join(timed_cut)))] == words("".join(timed_cut))
    kept = words("".join(t for t in timed_cut if t.start_time < cut_at))
    assert 0 < len(kept) < len(words(LONG)) // 2 and words(LONG)[: len(kept)] == kept
