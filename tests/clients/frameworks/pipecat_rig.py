"""A Pipecat pipeline around `VoxgateTTSService` for the clients tier: its output is a real-time speaker
(Pipecat's own BaseOutputTransport, writing each 40 ms chunk in 40 ms) and its assistant aggregator is
Pipecat's own, so what it records as spoken is what Pipecat itself would put in the LLM context."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    StartFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.task import PipelineParams
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMAssistantAggregator
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import TransportParams
from pipecat.workers.runner import WorkerRunner

from voxgate_client import AudioCancelled
from voxgate_client.pipecat import VoxgateTTSService

RATE = 24000
SHORT = "Hello there. This is voxgate, speaking through Pipecat."
LONG = ("This is a long answer that keeps going for quite a while, so that the listener has plenty of time to "
        "interrupt it. It goes on with a second sentence, and then a third one, each of them long enough to "
        "take a few seconds to say out loud, which is what a barge-in needs.")  # fmt: skip


class Speaker(BaseOutputTransport):
    """A sound card: Pipecat's output transport, playing each chunk in real time."""

    def __init__(self) -> None:
        super().__init__(TransportParams(audio_out_enabled=True, audio_out_sample_rate=RATE))
        self.played = bytearray()
        self.last_write = 0.0

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        await asyncio.sleep(len(frame.audio) / 2 / RATE)
        self.played += frame.audio
        self.last_write = time.monotonic()
        return True

    @property
    def played_s(self) -> float:
        return len(self.played) / 2 / RATE


class Tap(FrameProcessor):
    """Records what passes downstream (after the speaker: words arrive when their audio plays)."""

    def __init__(self) -> None:
        super().__init__()
        self.words: list[str] = []
        self.tts_audio = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM and isinstance(frame, TTSTextFrame):
            self.words.append(frame.text)
        await self.push_frame(frame, direction)


class User(FrameProcessor):
    """The pipeline's head: where a user barging in interrupts, as Pipecat's user aggregator does."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


class Rig:
    def __init__(self, server: str, **options: object) -> None:
        self.tts = VoxgateTTSService(url=f"ws://{server}", voice="joe", language="en", sample_rate=RATE,
                                     **options)  # type: ignore[arg-type]  # fmt: skip
        self.user, self.speaker, self.tap, self.context = User(), Speaker(), Tap(), LLMContext()
        self.cancelled: list[AudioCancelled] = []
        self.tts_audio = 0

        @self.tts.event_handler("on_voxgate_cancelled")
        async def on_cancelled(_tts: VoxgateTTSService, _context_id: str, answer: AudioCancelled) -> None:
            self.cancelled.append(answer)

        self._worker_for([self.user, self.tts, self.speaker, self.tap, LLMAssistantAggregator(self.context)])

    @classmethod
    def around(cls, processors: list[FrameProcessor]) -> Rig:
        """A runner for a pipeline of other processors."""
        rig = cls.__new__(cls)
        rig._worker_for(processors)
        return rig

    def _worker_for(self, processors: list[FrameProcessor]) -> None:
        self.worker = PipelineWorker(Pipeline(processors), params=PipelineParams(audio_out_sample_rate=RATE),
                                     cancel_on_idle_timeout=False)  # fmt: skip
        self.started = asyncio.Event()

        @self.worker.event_handler("on_pipeline_started")
        async def on_started(_worker: PipelineWorker, _frame: Frame) -> None:
            self.started.set()

    async def run(self, script: Callable[[Rig], Awaitable[None]]) -> None:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        running = asyncio.create_task(runner.run())
        try:
            await asyncio.wait_for(self.started.wait(), 20)
            await script(self)
            await self.worker.queue_frame(EndFrame())
            await asyncio.wait_for(asyncio.shield(running), 30)
        finally:
            if not running.done():  # a failed script: stop the pipeline (its tasks and threads) too
                await self.worker.cancel(reason="the test failed")
                await asyncio.wait({running}, timeout=10)
                running.cancel()

    async def reply(self, text: str, tokens_per_s: float | None = None) -> None:
        """An LLM reply, streamed token by token (at `tokens_per_s`: an LLM still writing)."""
        await self.worker.queue_frame(LLMFullResponseStartFrame())
        for token in re.findall(r"\s*\S+", text):
            await self.worker.queue_frame(LLMTextFrame(text=token))
            if tokens_per_s:
                await asyncio.sleep(1 / tokens_per_s)
        await self.worker.queue_frame(LLMFullResponseEndFrame())

    def assistant_text(self) -> str:
        return " ".join(str(m.get("content", "")) for m in self.context.get_messages() if m.get("role") == "assistant")


async def until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", text.lower()).split()
