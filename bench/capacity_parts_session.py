"""Session 25's parts for bench/capacity_parts.py: a session's per-piece, per-segment, per-chunk and
per-utterance work, old way against new (each `*_parts()` returns the two `Timed`s).

- `admission`: one utterance's admission at `STREAMS` streams in flight (one tenant, as the capacity
  benchmark's sessions): `try_admit` and the ticket's release. Old: every look re-read every stream's cost
  (`recost`) and asked every listener's timeline, and the load was summed at each of the four asks of a
  start; new: costs re-read only when the engine's pricing moves, timelines only of listeners with a
  stream waiting, the load summed once per change;
- `chain`: one audio event from the engine-process stream's bridge through the stream layers to the
  pump's loop. Old: `QueuedStream.events` passing every event on; new: the open stream's own events;
- `piece`: a text piece's pieces, each alone (`decode`, `feed`, `admit`) — timed with no old/new, for
  where the µs go (bench/results/capacity_s25.md).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

Timed = Callable[[int], None]
STREAMS = 256


def admission_parts() -> tuple[Timed, Timed]:
    import logging

    from engine.fair_queue import FairQueue
    from gateway.admission import Admission
    from gateway.playback import Playback
    from gateway.settings import Settings

    class OldQueue(FairQueue):
        @property
        def load(self) -> float:
            return sum(w.cost for k in self._keys.values() for w in k.admitted)

        def look(self, capacity: float, *, follows: bool = False, timeline_of: Any = None) -> list[Any]:
            self._capacity = capacity
            if timeline_of is not None:
                for lst in self._listeners.values():
                    heard = timeline_of(lst.token)
                    for w in lst.waiting:
                        self.relisten(w, heard)
            gone = self._expire_waits(capacity)
            for before in (True, False):
                for lst in list(self._listeners.values()) if follows else ():
                    if not lst.held or not before:
                        self._follow(lst, capacity, follows)
                if before:
                    self._start(capacity, self._clock())
            return gone + self._expire_slo(capacity)

    class OldAdmission(Admission):
        def _look(self) -> Any:
            self._priced = object()  # never what the engine prices by: every look re-reads every cost
            return super()._look()

    from engine.synthetic import SyntheticEngine, SyntheticOptions

    logging.getLogger("voxgate.admission").setLevel(logging.ERROR)  # the held tickets die unreleased at exit
    engine = SyntheticEngine(SyntheticOptions(capacity=4096))
    settings = Settings(model="synthetic", max_active_streams=4096, max_waiting_per_tenant=4096,
                        max_waiting_per_model=4096)  # fmt: skip
    loop = asyncio.new_event_loop()

    def run(admission: Admission) -> Timed:
        async def setup() -> list[Any]:
            held = []
            for _ in range(STREAMS - 1):
                listener = Playback(count_underruns=False)
                listener.add(3600.0)
                held.append(admission.try_admit("default", 1.0, listener=listener, language="en", voice="synthetic"))
            return held

        held = loop.run_until_complete(setup())  # kept: a ticket dropped is released (and logged)
        listener = Playback(count_underruns=False)

        async def many(n: int) -> None:
            assert admission.admitted == len(held)
            for _ in range(n):
                ticket = admission.try_admit("default", 1.0, listener=listener, language="en", voice="synthetic")
                assert ticket is not None
                ticket.release()

        return lambda n: loop.run_until_complete(many(n))

    old = OldAdmission(engine, settings)
    old._queue = OldQueue(old._queue.config, old._queue._clock)
    return run(old), run(Admission(engine, settings))


def chain_parts() -> tuple[Timed, Timed]:
    from engine.process.stream import ProcessStream
    from engine.types import AudioChunk, StreamEnd
    from gateway.admission import Admission
    from gateway.queued_stream import QueuedStream
    from gateway.served_engine import ServedEngine
    from gateway.settings import Settings

    class Engine:  # the engine-process client's streams, their commands dropped
        sample_rate = 24000

        def __init__(self) -> None:
            self.opened: list[ProcessStream] = []
            self._sids = itertools.count(1)

        def capacity(self) -> None:
            return None

        def open_stream(self, voice: str | None, language: str, **options: object) -> ProcessStream:
            self.opened.append(ProcessStream(next(self._sids), None, send=lambda msg: None, forget=lambda sid: None))
            return self.opened[-1]

    loop = asyncio.new_event_loop()
    engine = Engine()
    served = ServedEngine("m", engine)  # type: ignore[arg-type]
    admission = Admission(served, Settings(model="m"))  # type: ignore[arg-type]
    ev = AudioChunk(np.zeros(4800, np.int16), 24000, 0, 0)

    async def nothing(e: object, indexes: list[int]) -> None:
        pass

    def run(events_of: Callable[[QueuedStream], AsyncIterator[Any]]) -> Timed:
        async def many(n: int) -> None:
            stream = QueuedStream(admission, "t", 1.0, lambda: served.open_stream(None, "en"), on_lost=nothing)
            inner = engine.opened[-1]
            got = 0
            events = events_of(stream)
            for _ in range(n):
                inner.put(ev)
                ev_ = await anext(events)  # type: ignore[arg-type]
                got += ev_ is ev
            inner.end("done")
            assert isinstance(await anext(events), StreamEnd)  # type: ignore[arg-type]
            assert got == n
            stream.release()

        return lambda n: loop.run_until_complete(many(n))

    return run(lambda s: s._events()), run(lambda s: s.events())


def piece_kinds() -> dict[str, Timed]:
    """A text piece's steps alone (no old/new): the JSON decode, the segmenter's feed, the backlog's admit."""
    from gateway.backlog import Backlog
    from gateway.protocol import decode
    from gateway.settings import Limits
    from gateway.utterance import Utterance
    from segmentation import StreamSegmenter

    raw = json.dumps({"type": "input.text", "text": "shipped "})
    reply = ("Sure, I can help with that. Your order shipped yesterday and should arrive on Thursday. "
             "Is there anything else you would like to know about it? ")  # fmt: skip
    import re

    pieces = re.findall(r"[^\s]+\s*|\s+", reply)

    def decode_n(n: int) -> None:
        for _ in range(n):
            decode(raw)

    def feed_n(n: int) -> None:
        seg = StreamSegmenter("en", "auto")
        for piece in itertools.islice(itertools.cycle(pieces), n):
            seg.feed(piece)

    backlog = Backlog(Limits())
    utt = Utterance(0, StreamSegmenter("en", "auto"))

    def admit_n(n: int) -> None:
        for _ in range(n):
            backlog.admit(utt, "shipped ")

    return {"decode": decode_n, "feed": feed_n, "admit": admit_n}
