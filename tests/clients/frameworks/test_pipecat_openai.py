"""Issue 15's check with the real Pipecat: its own `OpenAITTSService`, pointed at voxgate's OpenAI HTTP
API (`base_url`), speaks with every voice name it accepts (it refuses any other before asking), marin and
cedar included."""

from __future__ import annotations

import asyncio
import time

import pytest
from clients.frameworks.pipecat_rig import Rig  # the same pipeline runner
from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame, TTSUpdateSettingsFrame
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.tts import VALID_VOICES, OpenAITTSService

pytestmark = pytest.mark.clients


class Collect(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.audio: dict[str, int] = {}  # context → bytes
        self.errors: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and frame.context_id:
            self.audio[frame.context_id] = self.audio.get(frame.context_id, 0) + len(frame.audio)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
        await self.push_frame(frame, direction)


async def test_openai_tts_service_speaks_with_every_voice_it_accepts(voxgate_server: str) -> None:
    assert {"marin", "cedar"} <= VALID_VOICES.keys()
    tts = OpenAITTSService(api_key="not-needed", base_url=f"http://{voxgate_server}/v1", sample_rate=24000,
                           settings=OpenAITTSService.Settings(voice="alloy"))  # fmt: skip
    errors, sink = Collect(), Collect()
    rig = Rig.around([errors, tts, sink])

    async def script(_rig: Rig) -> None:
        for voice in sorted(VALID_VOICES):
            await rig.worker.queue_frame(TTSUpdateSettingsFrame(delta=OpenAITTSService.Settings(voice=voice)))
            await rig.worker.queue_frame(TTSSpeakFrame(text=f"This is {voice}."))
        deadline = time.monotonic() + 60
        while len(sink.audio) < len(VALID_VOICES) and not errors.errors:
            assert time.monotonic() < deadline, f"{len(sink.audio)} of {len(VALID_VOICES)} voices spoke"
            await asyncio.sleep(0.05)

    await rig.run(script)
    assert not errors.errors, errors.errors
    assert len(sink.audio) == len(VALID_VOICES)
    assert min(sink.audio.values()) > 0.3 * 2 * 24000  # every one said its sentence, not an empty answer
