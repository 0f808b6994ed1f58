"""LiveKit's own AgentSession speaking through `voxgate_client.livekit.TTS` into a real-time audio output:
an interruption mid-utterance leaves LiveKit's chat history holding what was played (it cuts the
transcript at the playback position with the TTS's aligned words), and the next turn has no stale audio."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from livekit import rtc
from livekit.agents import Agent, AgentSession
from livekit.agents.voice.io import AudioOutput, AudioOutputCapabilities, TextOutput
from livekit.agents.voice.transcription.synchronizer import TranscriptSynchronizer

from voxgate_client.livekit import TTS

pytestmark = pytest.mark.clients

RATE = 24000
LONG = ("This is a long answer that keeps going for quite a while, so that the listener has plenty of time to "
        "interrupt it. It goes on with a second sentence, and then a third one, each of them long enough to "
        "take a few seconds to say out loud.")  # fmt: skip


class Speaker(AudioOutput):
    """A sound card: plays captured frames in real time and reports each segment's playback position."""

    def __init__(self) -> None:
        super().__init__(label="speaker", capabilities=AudioOutputCapabilities(pause=False), sample_rate=RATE)
        self.frames: asyncio.Queue[rtc.AudioFrame | None] = asyncio.Queue()
        self.position = 0.0  # of the segment playing
        self.played_s = 0.0  # in all
        self.player: asyncio.Task[None] | None = None

    async def capture_frame(self, frame: rtc.AudioFrame) -> None:
        await super().capture_frame(frame)
        if self.player is None:
            self.player = asyncio.create_task(self._play())
        self.frames.put_nowait(frame)

    def flush(self) -> None:
        super().flush()
        self.frames.put_nowait(None)  # the segment ends here

    def clear_buffer(self) -> None:
        while not self.frames.empty():
            self.frames.get_nowait()
        self.on_playback_finished(playback_position=self.position, interrupted=True)
        self.position = 0.0

    async def _play(self) -> None:
        while True:
            frame = await self.frames.get()
            if frame is None:
                self.on_playback_finished(playback_position=self.position, interrupted=False)
                self.position = 0.0
                continue
            if self.position == 0.0:
                self.on_playback_started(created_at=time.time())
            await asyncio.sleep(frame.duration)
            self.position += frame.duration
            self.played_s += frame.duration


class Captions(TextOutput):
    """Where LiveKit writes the agent's transcript as it is spoken."""

    def __init__(self) -> None:
        super().__init__(label="captions", next_in_chain=None)
        self.text = ""

    async def capture_text(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()


async def test_an_agent_session_interrupted_keeps_what_was_played_in_its_history(voxgate_server: str) -> None:
    tts = TTS(url=f"ws://{voxgate_server}", voice="joe", language="en")
    session = AgentSession(tts=tts, use_tts_aligned_transcript=True)
    speaker = Speaker()
    # As LiveKit's RoomIO does: the transcript is released in step with the audio played (timed by the TTS's
    # aligned words), and an interruption cuts it at the playback position.
    captions = Captions()
    sync = TranscriptSynchronizer(next_in_chain_audio=speaker, next_in_chain_text=captions)
    session.output.audio, session.output.transcription = sync.audio_output, sync.text_output
    await session.start(agent=Agent(instructions="Say what you are told."))
    try:
        handle = session.say(LONG)
        deadline = time.monotonic() + 30
        while speaker.played_s < 1.5:
            assert time.monotonic() < deadline, "no audio played"
            await asyncio.sleep(0.02)
        handle.interrupt()
        await asyncio.wait_for(handle.wait_for_playout(), 10)
        played_at = speaker.played_s
        await asyncio.sleep(0.5)
        assert speaker.played_s - played_at < 0.25  # at most the 200 ms frame that was playing
        messages: list = []
        while not messages and time.monotonic() < deadline:  # the history is written once the turn ends
            await asyncio.sleep(0.05)
            messages = [item for item in session.history.items if getattr(item, "role", None) == "assistant"]
        said = " ".join(m.text_content or "" for m in messages)
        assert messages and messages[-1].interrupted
        assert 0 < len(words(said)) < len(words(LONG)) // 2  # about 1.5 s of speech, not the whole reply
        assert words(LONG)[: len(words(said))] == words(said)
    finally:
        await session.aclose()
        await tts.aclose()
