"""Every TalkerBackend passes the same checks (tests/support/talker_conformance.py): the native talker
here (its static-buffer CUDA-graph path equals it: tests/engine/test_graphs.py); another backend's tier
runs `ALL_CHECKS` with its own factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from support.talker_conformance import ALL_CHECKS

from engine.qwen3 import Qwen3TTSModel, load_model
from engine.qwen3_engine import tiny_checkpoint
from engine.talker_backend import NativeTalker, TalkerBackend, TalkerSpec, talker_factory


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine core's setting; tiny ops on 2 busy cores crawl with more
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Qwen3TTSModel:
    return load_model(tiny_checkpoint(tmp_path_factory.mktemp("cache")))


def native(model: Qwen3TTSModel) -> Callable[[TalkerSpec], TalkerBackend]:
    return lambda spec: NativeTalker.create(model, spec)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_native_talker_conforms(model: Qwen3TTSModel, check: Callable[..., None]) -> None:
    check(native(model), model)


def test_talkers_are_found_by_name_and_an_unknown_one_is_refused() -> None:
    assert talker_factory("native") == NativeTalker.create
    with pytest.raises(ValueError, match=r"no talker 'nope'; known: .*native"):
        talker_factory("nope")
