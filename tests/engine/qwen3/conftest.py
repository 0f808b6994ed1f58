"""A tiny random Qwen3-TTS checkpoint, written once per session and loaded through the real loader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engine.qwen3 import Qwen3TTSModel, load_model, make_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("qwen3-tiny"), seed=0)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> Qwen3TTSModel:
    torch.manual_seed(0)
    return load_model(tiny_dir)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The tiny model's ops are microseconds long; on a shared 2-core box two OpenMP threads spin against
    other processes and made the 1-frame codec loop 10-80× slower (measured 0.8 s vs 8-68 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
