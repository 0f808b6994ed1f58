"""Issue 13, finding 2 at the gateway: 32 sockets each hold an open utterance (one sentence said, no
input.done), so on the Qwen engine each parks a request in one of the 32 KV slots. A canary session
speaking throughout must keep hearing audio, and a newcomer must get its first audio within seconds.
A real gateway on loopback over the tiny Qwen3 model (it speaks noise: the canary measures timing)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from attack import ATTACKS, Context
from canary import Canary, HealthProbe
from support.servers import serve

from engine import load_engine
from gateway.connection import Limits

SLOTS = 32


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    engine = load_engine("tiny", cache_dir=tmp_path, max_streams=SLOTS, frames_per_token=2.0, min_frames=6)
    # The gateway finishes an utterance idle past its own bound; keep it out of the way here: the engine
    # must give the slots back by itself.
    fields = {f.name for f in dataclasses.fields(Limits)}
    limits = Limits(**({"utterance_idle_timeout": 600.0} if "utterance_idle_timeout" in fields else {}))
    try:
        yield from serve(engine, limits)
    finally:
        engine.close()


async def test_32_parked_utterances_leave_the_canary_and_a_newcomer_audio(url: str) -> None:
    async with Canary(url, voice="ryan") as canary, HealthProbe(url) as health:
        seen = await ATTACKS["parked_slots"](Context(url, None, {"voice": "ryan", "sockets": SLOTS, "hold_s": 6.0}))
        await canary.keep_hearing(2)
    report = canary.report()
    assert report.failure is None, report
    assert seen["sockets_heard"] >= SLOTS - 1, seen  # every one was admitted (one may wait behind the canary)
    assert seen["probe_first_audio_s"] is not None and seen["probe_first_audio_s"] < 3.0, seen
    assert report.worst_wait_s < 3.0, report  # before: no audio at all once the slots were taken
    assert health.worst_s < 1.0
