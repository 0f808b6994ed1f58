"""Issue 13, finding 2 at the gateway: 32 sockets each hold an open utterance (one sentence said, no
input.done), so on the Qwen engine each parks a request in one of the 32 KV slots. A canary session
speaking throughout must keep hearing audio, and a newcomer must get its first audio within seconds.
A real gateway on loopback over the tiny Qwen3 model (it speaks noise: the canary measures timing)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from attack import ATTACKS, Context
from canary import Canary, HealthProbe
from support.servers import serve
from support.wsclient import open_session, utterance

from engine import load_engine
from gateway.connection import Limits

SLOTS = 32


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    engine = load_engine("tiny", cache_dir=tmp_path, max_streams=SLOTS, frames_per_token=2.0, min_frames=6)
    # The gateway finishes an utterance idle past its own bound; keep it out of the way here: the engine
    # must give the slots back by itself.
    limits = Limits(utterance_idle_timeout=600.0)
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
    # Admission (issue 14) starts only as many streams as the measured capacity keeps ahead, and an open
    # utterance that holds one while others wait is finished after utterance_idle_under_pressure: the
    # parked sockets take turns, and the rest wait or are refused by name — never silence without a word.
    # (Whether any parked one is heard depends on the box: at a capacity of one stream the canary's
    # continuations, a listener already hearing speech, go first, and the parked ones only wait.)
    print(seen)
    assert seen["sockets_untold"] == 0, seen
    assert set(seen["codes"]) <= {"queue_full", "utterance_timeout"}, seen
    probe = seen["probe_events"]
    assert seen["probe_first_audio_s"] is not None or "error" in probe, seen  # audio, or told why not
    # The canary is one more session of the same tenant: under this 10× overload it waits its turn in
    # admission (told by audio.waiting), as the parked ones do. Before: no audio at all for 20 s and more.
    assert report.worst_wait_s < 15.0, report
    assert health.worst_s < 1.0


@pytest.fixture
def short_context_url(tmp_path: Path) -> Iterator[str]:
    engine = load_engine("tiny", cache_dir=tmp_path, max_streams=2, max_context=64, frames_per_token=2.0, min_frames=6)
    try:
        yield from serve(engine)
    finally:
        engine.close()


@pytest.mark.parametrize("mode", ["pcm", "codec_tokens"])
async def test_an_utterance_past_the_kv_context_is_spoken_to_its_last_sentence(short_context_url: str,
                                                                               mode: str) -> None:
    """Finding 8 at the gateway: 12 sentences streamed in, far past what one 64-position request holds
    (before: the stream ended "done" at the cap, the later sentences were never spoken and
    session.done came early)."""
    ws, ready = await open_session(short_context_url, voice="ryan", output_mode=mode)
    assert ready["type"] == "session.ready", ready
    sentences = [f"Sentence number {n} is spoken here." for n in range(12)]
    for s in sentences:
        await ws.send(json.dumps({"type": "input.text", "text": s + " "}))
        await asyncio.sleep(0.05)
    events, binary = await utterance(ws, "", timeout=60)
    await ws.close()
    kinds = [e["type"] for e in events]
    assert "error" not in kinds, events
    assert kinds[-1] == "session.done"
    committed = [e for e in events if e["type"] == "segment.committed"]
    marks = [e["segment_index"] for e in events if e["type"] == "audio.mark"]
    assert marks and marks[-1] == len(committed) - 1 == len(sentences) - 1  # audio reached the last sentence
    if mode == "pcm":
        assert sum(len(b) for b in binary) // 2 > 64 * 1920  # more than one request's worth of frames
