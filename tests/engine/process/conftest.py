"""Engines for the process tests: the same engine in-process and in a child process, side by side.

One child per engine per module, both started at once (each is a fresh interpreter importing torch or
onnxruntime: seconds on a loaded box), the tiny checkpoint from the shared cache (made once)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine import load_engine
from engine.process import ProcessEngine, start_engine

# A low frame cap keeps the tiny model's utterances short (it rarely says EOS by itself); no warm-up
# (it only calibrates the capacity estimate, which these tests do not judge).
TINY = {"max_streams": 4, "frames_per_token": 2.0, "min_frames": 6, "queue_size": 4, "warm_up": False}
PIPER = {"queue_size": 4}  # a stream's own queue: 1 s of audio, so a reader that stops is felt soon


@pytest.fixture(scope="module")
def children() -> Iterator[dict[str, ProcessEngine]]:
    """Started, not waited for: the pairs below wait (loading their in-process twin meanwhile)."""
    started = {"tiny": start_engine("tiny", **TINY), "piper": start_engine("piper", **PIPER)}
    try:
        yield started
    finally:
        for child in started.values():
            child.close()


@pytest.fixture(scope="module")
def tiny_pair(children: dict[str, ProcessEngine]) -> Iterator[dict[str, Any]]:
    """{"inproc": the tiny Qwen3 engine, "process": the same in a child}."""
    inproc = load_engine("tiny", **TINY)
    children["tiny"].wait_ready(240)
    yield {"inproc": inproc, "process": children["tiny"]}
    inproc.close()


@pytest.fixture(scope="module")
def piper_pair(children: dict[str, ProcessEngine], piper_engine: Any) -> dict[str, Any]:
    children["piper"].wait_ready(240)
    return {"inproc": piper_engine, "process": children["piper"]}
