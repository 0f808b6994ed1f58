"""The connection's outbox (gateway/outbox.py): bounded, cancel purges audio, and `voxgate_outbox_frames`
counts what every live outbox holds when it is read (nothing is kept up per frame)."""

from __future__ import annotations

import asyncio
import gc

import pytest
from prometheus_client import REGISTRY

from gateway.outbox import Outbox, Outgoing, SlowClient


def frames_gauge() -> float:
    value = REGISTRY.get_sample_value("voxgate_outbox_frames")
    assert value is not None
    return value


async def test_the_gauge_counts_the_frames_queued_in_live_outboxes() -> None:
    gc.collect()
    before = frames_gauge()  # other tests' outboxes may still live
    a, b = Outbox(8, 1.0), Outbox(8, 1.0)
    for i in range(3):
        await a.put(Outgoing(b"pcm", utterance=0))
        await b.put(Outgoing(f"event {i}"))
    assert frames_gauge() - before == 6
    await a.get()
    a.cancel_audio(0)  # the rest of a's audio is purged
    assert frames_gauge() - before == 3
    b.close()  # the writer's stop signal is not a frame
    assert frames_gauge() - before == 3
    b.discard()
    del a, b
    gc.collect()
    assert frames_gauge() == before


async def test_a_full_outbox_refuses_past_its_timeout() -> None:
    box = Outbox(1, 0.05)
    await box.put(Outgoing(b"x", utterance=0))
    with pytest.raises(SlowClient):
        await box.put(Outgoing(b"y", utterance=0))
    getter = asyncio.create_task(box.get())
    assert (await asyncio.wait_for(getter, 1)).data == b"x"


async def test_get_nowait_takes_what_waits_and_frees_its_room() -> None:
    box = Outbox(1, 0.5)
    assert box.get_nowait() is None
    await box.put(Outgoing(b"x", utterance=0))
    waiting = asyncio.create_task(box.put(Outgoing(b"y", utterance=0)))  # full: waits for room
    await asyncio.sleep(0)
    item = box.get_nowait()
    assert item is not None and item.data == b"x"
    await asyncio.wait_for(waiting, 1)  # the room it freed let the waiting put in
    assert [box.get_nowait().data, box.get_nowait()] == [b"y", None]  # type: ignore[union-attr]


def test_the_audio_bytes_counter_is_exported_as_a_counter() -> None:
    from gateway import metrics

    before = REGISTRY.get_sample_value("voxgate_audio_bytes_total")
    assert before is not None
    metrics.AUDIO_BYTES.inc(4800)
    assert REGISTRY.get_sample_value("voxgate_audio_bytes_total") == before + 4800
    assert REGISTRY.get_sample_value("voxgate_audio_bytes_created") is not None
