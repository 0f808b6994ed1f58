from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from support import streams

from engine.types import AudioChunk, StreamEnd

Collected = tuple[list[AudioChunk], StreamEnd]


@pytest.fixture(scope="session")
def cpu_engine(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One warmed-up engine for the session (loading takes seconds); its cache in a temp dir."""
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    from engine import load_engine

    engine = load_engine("cpu", cache_dir=tmp_path_factory.mktemp("voxgate-cache"))
    yield engine
    engine.close()


@pytest.fixture
def collect() -> Callable[[object], Awaitable[Collected]]:
    return streams.collect


def pcm_of(chunks: list[AudioChunk], segment: int | None = None) -> np.ndarray:
    parts = [c.pcm for c in chunks if segment is None or c.segment == segment]
    return np.concatenate(parts) if parts else np.zeros(0, np.int16)


@pytest.fixture
def pcm() -> Callable[..., np.ndarray]:
    return pcm_of
