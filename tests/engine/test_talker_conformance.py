"""Every TalkerBackend passes the same checks (tests/support/talker_conformance.py): the native talker
here (its static-buffer CUDA-graph path equals it: tests/engine/test_graphs.py); another backend's tier
runs `ALL_CHECKS` with its own factory."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
import torch
from support.streams import collect
from support.talker_conformance import ALL_CHECKS, CheckedTalker

from engine import load_engine
from engine.qwen3 import Qwen3TTSModel, load_model
from engine.qwen3.serving.qwen3_engine import Qwen3Engine, tiny_checkpoint
from engine.qwen3.serving.talker_backend import NativeTalker, TalkerBackend, TalkerSpec, talker_factory


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine core's setting; tiny ops on 2 busy cores crawl with more
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> Qwen3TTSModel:
    return load_model(tiny_checkpoint())  # the default cache: built once, shared with other modules' "tiny"


def native(model: Qwen3TTSModel) -> Callable[[TalkerSpec], TalkerBackend]:
    return lambda spec: NativeTalker.create(model, spec)


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_native_talker_conforms(model: Qwen3TTSModel, check: Callable[..., None]) -> None:
    check(native(model), model)


def test_talkers_are_found_by_name_and_an_unknown_one_is_refused() -> None:
    assert talker_factory("native") == NativeTalker.create
    with pytest.raises(ValueError, match=r"no talker 'nope'; known: .*native"):
        talker_factory("nope")


async def test_the_core_keeps_the_guarantees_a_backend_relies_on() -> None:
    """The engine core driving a checked native talker through parking, a stream past its KV context
    (several requests), more streams than slots, a cancel mid-stream and a reader that pauses: every
    call honours the contract in `TalkerBackend`'s docstring, and a stream that fits one request makes
    one prefill (a parked one may be evicted after 0.2 s and resume in a second)."""
    eng = load_engine("tiny", max_streams=2, max_context=64,
                      frames_per_token=2.0, min_frames=6, queue_size=4, park_evict_s=0.2, warm_up=False,
                      talker=CheckedTalker.around(NativeTalker.create))
    assert isinstance(eng, Qwen3Engine)
    checked = eng.core.talker
    assert isinstance(checked, CheckedTalker)
    try:
        one = eng.open_stream("ryan", "en", seed=1)
        one.append("Hello there. ")  # then it parks until the second piece
        long = eng.open_stream("ryan", "en", seed=2)
        for n in range(4):  # past one request's context (about 3 pieces): it goes on in a fresh request
            long.append(f"Sentence number {n} is spoken here. ")
        long.finish()
        late = eng.open_stream("ryan", "en", seed=3)  # waits for a slot
        late.append("Short one.")
        late.finish()
        cut = eng.open_stream("ryan", "en", seed=4)
        cut.append("This stream is cancelled before it ends. ")
        await asyncio.sleep(0.3)
        one.append("How are you? ")
        one.finish()
        cut.cancel()
        ends = await asyncio.gather(*(collect(s, timeout=120) for s in (one, long, late, cut)))
        assert [end.reason for _, end in ends] == ["done", "done", "done", "cancelled"]
    finally:
        eng.close()
    assert not checked.violations
    assert all(checked.calls[c] > 0 for c in ("prefill", "step", "complete", "abort"))
    assert not checked.state  # every slot aborted: nothing left allocated
    requests = {rid: done[0] for rid, done in eng.core.stats.finished_text.items()}
    assert requests[late.rid] == 1 and requests[long.rid] >= 2
    assert eng.core.stats.prefills == checked.calls["prefill"]
