"""No CPU stream takes another stream's lock: what a stream needs of the other streams of its listener
(the one before it, the one behind it) it reads from their published, immutable snapshots. Checked
twice: in the source (no attribute of another object's private state is touched in engine/cpu/stream.py)
and at run time (a listener's streams, sentence after sentence, under a lock that records who holds it).
"""

from __future__ import annotations

import ast
import asyncio
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.streams import collect
from support.waits import until

import engine.cpu.stream as stream_module
import engine.cpu.stream_runs as runs_module
from engine import load_engine
from engine.types import StreamEnd

STREAM_SOURCES = (Path(stream_module.__file__), Path(runs_module.__file__))  # the driver's side, the workers'


def test_a_stream_touches_no_private_state_but_its_own() -> None:
    # `other._cond`, `other._jobs`, ...: reading another stream's state under its lock is how locks come
    # to be taken two at a time (and, one day, in a cycle). Only `self._x` is allowed.
    foreign = [
        f"{source.name} line {node.lineno}: {ast.unparse(node)}"
        for source in STREAM_SOURCES
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id == "self")
    ]
    assert foreign == []


class _Held(threading.local):
    def __init__(self) -> None:
        self.locks: list[int] = []


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Every stream's lock records, per thread, which stream locks it holds when it takes one."""
    held = _Held()
    record: dict[str, Any] = {"nested": [], "by_thread": defaultdict(set)}
    base = stream_module.StreamLock

    class Recording(base):  # type: ignore[misc,valid-type]
        def __enter__(self) -> bool:
            if held.locks:
                record["nested"].append((threading.current_thread().name, list(held.locks), id(self)))
            entered = super().__enter__()
            held.locks.append(id(self))
            record["by_thread"][threading.current_thread().name, threading.get_ident()].add(id(self))
            return entered

        def __exit__(self, *exc: object) -> None:
            held.locks.remove(id(self))
            super().__exit__(*exc)

    monkeypatch.setattr(stream_module, "StreamLock", Recording)
    yield record


@pytest.fixture(scope="module")
def piper() -> Iterator[Any]:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    engine = load_engine("piper", workers=2)
    yield engine
    engine.close()


async def test_a_listeners_streams_never_take_each_others_locks(piper: Any, recorded: dict[str, Any]) -> None:
    # Sentence by sentence, each its own stream of one listener: each follows the one before it (reads
    # when its audio ends, whether its text is all cut) and the first's hold looks at the one behind it.
    # A barge-in cancels the last while the others play.
    sentences = ["Doctor Smith.", "Will see you at three.", "Please bring your card.", "Thanks, goodbye."]
    streams = []
    for text in sentences:
        stream = piper.open_stream("joe", "en", listener="L", listener_group="T")
        stream.append(text)
        streams.append(stream)
    for stream in streams[:-1]:
        stream.finish()
    reads = [asyncio.create_task(collect(s, timeout=60)) for s in streams[:-1]]
    await until(lambda: streams[0].first_audio_at is not None, "the first sentence plays", 30)
    streams[-1].cancel()  # barged in on while the others play
    results = await asyncio.gather(*reads)
    assert [end for _, end in results] == [StreamEnd("done")] * 3
    assert all(events for events, _ in results)
    # No thread ever held two streams' locks at once ...
    assert recorded["nested"] == []
    # ... and each stream's driver took only its own stream's lock.
    drivers = {key: locks for key, locks in recorded["by_thread"].items() if key[0] == "cpu-stream"}
    assert len(drivers) == len(streams)
    assert all(len(locks) == 1 for locks in drivers.values()), drivers


def test_a_snapshot_is_the_state_the_stream_last_let_go(piper: Any) -> None:
    stream = piper.open_stream("joe", "en")
    assert stream.snapshot.status is stream.status and not stream.snapshot.all_cut
    stream.cancel()
    assert stream.snapshot.cancelled and stream.snapshot.all_cut  # the cancel let its lock go: published
