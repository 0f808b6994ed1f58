"""A gateway session in one process, for timing its paths whole: a real `Connection` (the reader's
dispatch, the text intake, the segmenter, admission, the playout, the pump, the sink, the writer) on the
synthetic engine's declarations, whose streams are the engine-process client's own (`ProcessStream`,
its commands encoded and queued as the client queues them, never sent), beside `others` streams of
other listeners admitted and holding the engine (at 256 sessions, some tens to a few hundred speak at
once). What the capacity benchmark's server does per reply, less the socket (uvicorn's receive and
send: the `send` part times the latter) and the engine client's I/O thread.

Parts (CPU per operation, this process; `python bench/capacity_rig.py --part reply`):
- `reply`: one whole reply, as bench/capacity.py's sessions speak one (a REPLIES text in word pieces,
  input.done, its audio in 0.2 s chunks, its end), per audio-second of it;
- `delta`: one `input.text` piece that ends no segment, from its JSON text (`Connection._dispatch`);
- `chunk`: one 0.2 s audio chunk from the engine stream's bridge to the writer's send.

The session's store writes (the utterance's begin and record, written behind) are left out here: the
`record` part of bench/capacity_parts.py times them against a real Redis.

Runs on any tree of this repository that has the same public names (bench/capacity_paths.py copies it
into an old tree to time the old and the new side by side).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from engine.options import stream_request  # noqa: E402
from engine.process import wire  # noqa: E402
from engine.process.stream import ProcessStream  # noqa: E402
from engine.synthetic import SyntheticEngine, SyntheticOptions  # noqa: E402
from engine.types import AudioChunk  # noqa: E402

RATE = 24000
CHUNK = 4800  # 0.2 s: the synthetic engine's chunk
CHARS_PER_S = 15.0  # English as the synthetic engine speaks it, about: a reply's audio length
REPLIES = [
    "Sure, I can help with that. Your order shipped yesterday and should arrive on Thursday. "
    "Is there anything else you would like to know about it?",
    "Of course. The store opens at nine in the morning and closes at eight in the evening, "
    "except on Sundays, when it closes at six.",
]


def pieces(text: str) -> list[str]:
    """Word pieces, as an LLM streams them (bench/capacity.py's)."""
    import re

    return re.findall(r"[^\s]+\s*|\s+", text)


class RigEngine(SyntheticEngine):
    """The synthetic engine's declarations; its streams are `ProcessStream`s whose commands are encoded and
    queued (bounded) as the engine-process client's `_send` does, and never sent."""

    def __init__(self) -> None:
        super().__init__(SyntheticOptions(first_audio_s=60.0))  # its clock thread never has work
        self.opened: deque[ProcessStream] = deque(maxlen=16)
        self._sids = itertools.count(1)
        self._lock = threading.Lock()
        self._commands: deque[list[bytes]] = deque(maxlen=4096)

    def open_stream(self, voice: str | None, language: str, **options: object) -> Any:
        request = stream_request(voice, language, options)
        self.check(request)
        stream = ProcessStream(next(self._sids), 262144, send=self._send, forget=lambda sid: None)
        self._send(wire.Open(stream.sid, request))
        self.opened.append(stream)
        return stream

    def _send(self, msg: wire.Command) -> None:
        frames = [wire.command_encoder.encode(msg)]
        with self._lock:
            self._commands.append(frames)  # type: ignore[arg-type]


class Rig:
    """One configured session on a `RigEngine`, `others` streams of other listeners admitted beside it."""

    def __init__(self, others: int = 64) -> None:
        self.others = others
        self.sent = 0

    async def start(self) -> None:
        from gateway.admission import Admission
        from gateway.connection import Connection
        from gateway.playback import Playback
        from gateway.served_engine import ServedEngine
        from gateway.session_state import SessionBinding
        from gateway.settings import Settings
        from sessions import SessionStore, Tenant

        class Unwritten(SessionBinding):  # the store writes are timed apart (capacity_parts `record`)
            def begin(self, utterance: int) -> None:
                pass

            async def record(self, utterance: int, spoken: str, *, cancelled: bool) -> None:
                pass

        settings = Settings(model="synthetic", max_active_streams=4096, max_waiting_per_tenant=4096,
                            max_waiting_per_model=4096)  # fmt: skip
        self.engine = RigEngine()
        served = ServedEngine("synthetic", self.engine)
        self.admission = Admission(served, settings)
        self.store = SessionStore.from_url(None)
        await self.store.start()
        tenant = Tenant("default")
        self._never = asyncio.Event()

        async def receive() -> dict:
            await self._never.wait()
            return {"type": "websocket.disconnect"}

        async def send(data: bytes | str) -> None:
            self.sent += 1

        self.conn = Connection(served, settings.limits, Unwritten(self.store, tenant), receive, send,
                               model="synthetic", admission=self.admission)  # fmt: skip
        self.task = asyncio.create_task(self.conn.run())
        await self.conn._dispatch(json.dumps({"type": "session.config", "voice": "synthetic", "language": "en",
                                              "format": "pcm", "sample_rate": RATE}))  # fmt: skip
        self.held = []
        for _ in range(self.others):
            listener = Playback(count_underruns=False)
            listener.add(3600.0)  # it hears speech: a timeline
            ticket = self.admission.try_admit(tenant.name, tenant.weight, listener=listener, language="en",
                                              voice="synthetic")  # fmt: skip
            assert ticket is not None
            self.held.append((listener, ticket))
        rng = np.random.default_rng(0)
        self.pcm = (np.sin(np.arange(CHUNK) * 0.07) * 8000 + rng.normal(0, 500, CHUNK)).astype(np.int16)

    async def stop(self) -> None:
        for _, ticket in self.held:
            ticket.release()
        self.conn.stop()
        await asyncio.wait({self.task}, timeout=5)
        await self.admission.close()
        await self.store.close()
        self.engine.close()

    async def settle(self, stream: ProcessStream | None = None) -> None:
        """Until the pump has taken what `stream` queued and the writer has sent what the outbox holds."""
        await asyncio.sleep(0)
        while (stream is not None and stream._bridge.queued) or len(self.conn.outbox):
            await asyncio.sleep(0)

    async def text(self, text: str) -> None:
        for piece in pieces(text):
            await self.conn._dispatch(json.dumps({"type": "input.text", "text": piece}))

    async def audio(self, stream: ProcessStream, segments: int, chunks: int) -> None:
        """`chunks` chunks over `segments` engine segments, one at a time, each taken by the pump and sent
        before the next (as at the engine's pace), then the stream's end."""
        for i in range(chunks):
            ev = AudioChunk(self.pcm, RATE, i * CHUNK, min(segments - 1, i * segments // chunks))
            while stream.put(ev) is None:  # the credit window: the pump has not taken the last ones yet
                await asyncio.sleep(0)
            await self.settle(stream)
        stream.end("done")
        while self.conn.playing:
            await asyncio.sleep(0)
        await self.settle()
        self.conn.listener.stop()  # heard out before the next turn (its audio would count as ahead)

    async def reply(self, text: str) -> float:
        """One reply; returns its audio seconds."""
        await self.text(text)
        await self.conn._dispatch('{"type": "input.done"}')
        stream = self.engine.opened[-1]
        chunks = math.ceil(len(text) / CHARS_PER_S / (CHUNK / RATE))
        await self.audio(stream, max(1, len(stream._lengths)), chunks)
        return chunks * CHUNK / RATE


def cpu_of(loop: asyncio.AbstractEventLoop, work: Any) -> tuple[float, Any]:
    t0 = time.process_time()
    out = loop.run_until_complete(work)
    return time.process_time() - t0, out


class Split:
    """CPU seconds by kind of operation, each operation timed alone (`time.process_time` around it)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.ops: dict[str, int] = {}

    def add(self, kind: str, seconds: float) -> None:
        self.cpu[kind] = self.cpu.get(kind, 0.0) + seconds
        self.ops[kind] = self.ops.get(kind, 0) + 1

    def us(self) -> dict[str, float]:
        return {k: round(self.cpu[k] / self.ops[k] * 1e6, 3) for k in self.cpu}


async def split_reply(rig: Rig, text: str, split: Split) -> float:
    """One reply as `Rig.reply`, each piece, chunk and end timed alone: a piece that committed no segment
    (`piece`) apart from one that did (`piece+segment`, its segments' commits and, the first, the stream's
    opening and admission); returns its audio seconds."""
    clock = time.process_time
    intake = rig.conn.contexts.default
    for piece in pieces(text):
        raw = json.dumps({"type": "input.text", "text": piece})
        before = len(intake.current.segments) if intake.current is not None else 0
        t0 = clock()
        await rig.conn._dispatch(raw)
        t = clock() - t0
        assert intake.current is not None
        split.add("piece" if len(intake.current.segments) == before else "piece+segment", t)
    t0 = clock()
    await rig.conn._dispatch('{"type": "input.done"}')
    split.add("input.done", clock() - t0)
    stream = rig.engine.opened[-1]
    segments = max(1, len(stream._lengths))
    chunks = math.ceil(len(text) / CHARS_PER_S / (CHUNK / RATE))
    for i in range(chunks):
        ev = AudioChunk(rig.pcm, RATE, i * CHUNK, min(segments - 1, i * segments // chunks))
        t0 = clock()
        while stream.put(ev) is None:
            await asyncio.sleep(0)
        await rig.settle(stream)
        split.add("chunk", clock() - t0)
    t0 = clock()
    stream.end("done")
    while rig.conn.playing:
        await asyncio.sleep(0)
    await rig.settle()
    split.add("end", clock() - t0)
    rig.conn.listener.stop()
    return chunks * CHUNK / RATE


def measure(part: str, n: int, others: int) -> dict[str, Any]:
    """CPU µs per operation of `part` (per audio-second for `reply`, with its split)."""
    loop = asyncio.new_event_loop()
    rig = Rig(others)
    loop.run_until_complete(rig.start())
    try:
        if part == "reply":
            async def replies(k: int) -> float:
                return sum([await rig.reply(REPLIES[i % len(REPLIES)]) for i in range(k)])

            loop.run_until_complete(replies(2))  # warm
            cpu, audio_s = cpu_of(loop, replies(n))
            split = Split()

            async def split_replies(k: int) -> float:
                return sum([await split_reply(rig, REPLIES[i % len(REPLIES)], split) for i in range(k)])

            loop.run_until_complete(split_replies(n))
            return {"us": round(cpu / audio_s * 1e6, 3), "audio_s": audio_s, "ops": n, "split_us": split.us(),
                    "split_ops": split.ops}  # fmt: skip
        if part == "delta":
            words = [json.dumps({"type": "input.text", "text": "word "}) for _ in range(n)]

            async def deltas() -> None:
                await rig.conn._dispatch(json.dumps({"type": "input.text", "text": "Hello"}))
                for raw in words:  # no mark: no segment ends (a forced cut every max_chars aside)
                    await rig.conn._dispatch(raw)

            cpu, _ = cpu_of(loop, deltas())
            return {"us": round(cpu / n * 1e6, 3), "ops": n}
        if part == "chunk":
            async def chunks() -> float:
                await rig.text("Hello there, this is a test of the chunks. ")
                await rig.conn._dispatch('{"type": "input.done"}')
                stream = rig.engine.opened[-1]
                t0 = time.process_time()
                await rig.audio(stream, 1, n)
                return time.process_time() - t0

            cpu = loop.run_until_complete(chunks())
            return {"us": round(cpu / n * 1e6, 3), "ops": n}
        raise ValueError(f"unknown part {part!r}")
    finally:
        loop.run_until_complete(rig.stop())
        loop.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", default="reply", choices=("reply", "delta", "chunk"))
    p.add_argument("--n", type=int, default=0, help="operations (default: the part's)")
    p.add_argument("--others", type=int, default=64, help="streams of other listeners admitted beside it")
    args = p.parse_args()
    n = args.n or {"reply": 20, "delta": 2000, "chunk": 2000}[args.part]
    print(json.dumps(measure(args.part, n, args.others)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
