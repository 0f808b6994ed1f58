"""LiveKit's own AgentSession speaking through `voxgate_client.livekit.TTS` into a real-time audio output:
an interruption mid-utterance leaves LiveKit's chat history holding what was played (it cuts the
transcript at the playback position with the TTS's aligned words), and the next turn has no stale audio."""

from __future__ import annotations

import pytest
from clients.frameworks.livekit_rig import LONG, SHORT, interrupted_session, words

from voxgate_client.livekit import TTS

pytestmark = pytest.mark.clients


async def test_an_agent_session_interrupted_keeps_what_was_played_in_its_history(voxgate_server: str) -> None:
    tts = TTS(url=f"ws://{voxgate_server}", voice="joe", language="en")
    try:
        out = await interrupted_session(tts, then=[SHORT])
    finally:
        await tts.aclose()
    assert out.played_after - out.played_at_interrupt < 0.25  # at most the 200 ms frame that was playing
    assert out.interrupted
    assert 0 < len(words(out.said)) < len(words(LONG)) // 2  # about 1.5 s of speech, not the whole reply
    assert words(LONG)[: len(words(out.said))] == words(out.said)
    assert words(out.next_turns[0][1]) == words(SHORT)  # the next turn: its own words, nothing stale
