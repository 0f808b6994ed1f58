"""CUDA graphs behind `cuda_graphs` (engine/qwen3/serving/graphs.py, talker_backend.py), on the real tiny model.

On CPU the flag runs the same static-buffer plumbing without capture, so these tests check that path
against the flag-off engine; the CUDA tests (replay equals eager) skip where there is no GPU.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import AudioChunk, CodecFrames, StreamEnd, load_engine
from engine.qwen3 import Qwen3TTSModel, load_model
from engine.qwen3.generate import SamplingParams
from engine.qwen3.serving.graphs import StaticCall
from engine.qwen3.serving.qwen3_engine import Qwen3Engine, tiny_checkpoint
from engine.qwen3.serving.talker_backend import NativeTalker

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TEXTS = ["Hello there, how are you doing today? ", "The quick brown fox jumps over the lazy dog. ",
         "Streaming speech should start quickly. ", "Numbers like 42 are read aloud. ",
         "Thank you for asking. "]


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the engine core's setting; tiny ops on 2 busy cores crawl with more
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def model(ckpt: Path) -> Qwen3TTSModel:
    return load_model(ckpt)


# ---- StaticCall --------------------------------------------------------------------------------------
def affine(scale: float, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x @ w * scale
    return y, y.sum(-1)


def test_static_call_copies_inputs_into_its_buffers_and_returns_the_eager_result() -> None:
    call = StaticCall(affine, torch.device("cpu"), capture=False)
    w = torch.randn(8, 3)
    x1, x2 = torch.randn(4, 8), torch.randn(4, 8)
    y1, s1 = call(2.0, x1, w)
    torch.testing.assert_close(y1, affine(2.0, x1, w)[0], rtol=0, atol=0)
    torch.testing.assert_close(s1, affine(2.0, x1, w)[1], rtol=0, atol=0)
    (entry,) = call.entries.values()
    assert entry.inputs[0] is not x1 and torch.equal(entry.inputs[0], x1)
    y2, _ = call(2.0, x2, w)
    # Same key: the same static output, now holding the second call's result (callers clone to keep).
    assert y2 is y1 and torch.equal(y2, affine(2.0, x2, w)[0])
    assert torch.equal(entry.inputs[0], x2)


def test_static_call_gives_distinct_keys_distinct_buffers() -> None:
    call = StaticCall(affine, torch.device("cpu"), capture=False)
    w = torch.randn(8, 3)
    big, small = torch.randn(8, 8), torch.randn(4, 8)
    y_big = call(1.0, big, w)[0].clone()
    y_small = call(1.0, small, w)[0]
    y_scaled = call(3.0, small, w)[0]  # same shapes, other static fact: its own entry
    assert len(call.entries) == 3
    assert len({e.inputs[0].data_ptr() for e in call.entries.values()}) == 3
    assert y_small.shape == (4, 3) and torch.equal(y_small, affine(1.0, small, w)[0])
    assert torch.equal(y_scaled, affine(3.0, small, w)[0])
    assert torch.equal(call(1.0, big, w)[0], y_big)  # back to the larger key: its own inputs and outputs


def test_static_call_refuses_to_capture_off_cuda() -> None:
    with pytest.raises(ValueError, match="CUDA"):
        StaticCall(affine, torch.device("cpu"), capture=True)


# ---- NativeTalker with the flag, against the flag off, on a scripted schedule ---------------------------
Schedule = Sequence[tuple[Sequence[int], int]]  # (slots, bucket) per cycle
# Large batches first, then smaller buckets: stale rows of the larger batch must not leak into them.
SCHEDULE: Schedule = [([0, 1, 2, 3, 4, 5], 8), ([0, 1, 2, 3, 4, 5], 8), ([0], 4), ([2, 4], 4), ([0], 4),
                      ([0, 1, 2, 3, 4], 8), ([5], 4), ([0, 1, 3, 4], 4), ([0, 1, 2, 3, 4, 5], 8)]


def run_schedule(model: Qwen3TTSModel, params: Callable[[int], SamplingParams], cuda_graphs: bool,
                 schedule: Schedule = SCHEDULE, device: str = "cpu") -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prefill six slots, then per cycle complete each slot's frame and step it; → cb0 ids and frames."""
    talker = NativeTalker(model, max_slots=8, max_context=256, kv_block=32, cuda_graphs=cuda_graphs)
    talker.warm_up([4, 8])
    per_slot = {s: params(s) for s in range(6)}
    pad_row = None
    for s in range(6):
        prompt = model.build_prompt(TEXTS[s % len(TEXTS)], voice=model.speakers[0], language="english")
        talker.prefill(s, prompt.rows.to(device), per_slot[s])
        pad_row = prompt.pad.to(device)
    assert pad_row is not None
    ids, frames = [], []
    for slots, bucket in schedule:
        ps = [per_slot[s] for s in slots]
        frames.append(talker.complete(slots, ps, bucket).cpu())
        ids.append(talker.step(slots, pad_row.expand(len(slots), -1).contiguous(), ps, bucket))
    return ids, frames


def greedy(_: int) -> SamplingParams:
    return SamplingParams(greedy=True)


def seeded(model: Qwen3TTSModel) -> Callable[[int], SamplingParams]:
    return lambda slot: SamplingParams.from_defaults(model.gen, seed=100 + slot)


def mixed(model: Qwen3TTSModel) -> Callable[[int], SamplingParams]:
    """Greedy, default-sampled and full-vocabulary (uncaptured path) rows in the same batches."""
    def make(slot: int) -> SamplingParams:
        p = SamplingParams.from_defaults(model.gen, seed=200 + slot, greedy=slot % 3 == 0)
        if slot % 3 == 2:
            p.sub_top_k, p.top_k, p.sub_top_p = 0, 0, 0.8
        return p
    return make


@pytest.mark.parametrize("kind", ["greedy", "seeded", "mixed"])
def test_the_static_path_gives_the_flag_off_codes_as_buckets_change(model: Qwen3TTSModel, kind: str) -> None:
    params = {"greedy": greedy, "seeded": seeded(model), "mixed": mixed(model)}[kind]
    ids_off, frames_off = run_schedule(model, params, cuda_graphs=False)
    ids_on, frames_on = run_schedule(model, params, cuda_graphs=True)
    assert ids_on == ids_off
    for on, off in zip(frames_on, frames_off, strict=True):
        assert torch.equal(on, off)


def test_frames_handed_out_survive_the_next_pass(model: Qwen3TTSModel) -> None:
    talker = NativeTalker(model, max_slots=4, max_context=128, kv_block=32, cuda_graphs=True)
    prompt = model.build_prompt(TEXTS[0], voice=model.speakers[0], language="english")
    params = SamplingParams.from_defaults(model.gen, seed=1)
    slot = 0
    talker.prefill(slot, prompt.rows, params)
    first = talker.complete([slot], [params], 4)
    kept = first.clone()
    talker.step([slot], prompt.pad[None], [params], 4)
    talker.complete([slot], [params], 4)
    assert torch.equal(first, kept)  # a clone, not a view of the static output


# ---- the engine end to end -------------------------------------------------------------------------
async def speak(eng: Qwen3Engine, text: str, seed: int | None, output: str) -> np.ndarray:
    s = eng.open_stream("ryan", "en", seed=seed, output=output)
    s.append(text)
    s.finish()
    parts: list[np.ndarray] = []
    async for ev in s.events():
        if isinstance(ev, StreamEnd):
            assert ev.reason == "done", ev.message
        elif isinstance(ev, CodecFrames):
            parts.append(ev.codes)
        elif isinstance(ev, AudioChunk):
            parts.append(ev.pcm)
    return np.concatenate(parts)


async def engine_outputs(ckpt: Path, cuda_graphs: bool, greedy: bool) -> list[np.ndarray]:
    eng = load_engine(str(ckpt), max_streams=8, max_context=256, frames_per_token=2.0, min_frames=6,
                      greedy=greedy, cuda_graphs=cuda_graphs)
    assert isinstance(eng, Qwen3Engine)
    try:
        # Five streams batched (bucket 8), then one alone (bucket 4): codes exactly, and PCM.
        batched = await asyncio.gather(*[speak(eng, t, 10 + i, "codec_tokens") for i, t in enumerate(TEXTS)])
        alone = await speak(eng, TEXTS[0], 10, "codec_tokens")
        audio = await speak(eng, TEXTS[1], 11, "pcm")
    finally:
        eng.close()
    return [*batched, alone, audio]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "seeded"])
async def test_the_engine_with_cuda_graphs_on_cpu_speaks_as_without(ckpt: Path, greedy: bool,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    off = await engine_outputs(ckpt, cuda_graphs=False, greedy=greedy)
    with caplog.at_level(logging.WARNING, logger="voxgate.engine.talker"):
        on = await engine_outputs(ckpt, cuda_graphs=True, greedy=greedy)
    for codes_on, codes_off in zip(on[:-1], off[:-1], strict=True):
        assert np.array_equal(codes_on, codes_off)
    assert on[-1].size == off[-1].size
    # Same codes; chunk boundaries may differ with timing, which moves float rounding by an LSB at most.
    assert np.abs(on[-1].astype(np.int32) - off[-1]).max() <= 2
    warnings = [r for r in caplog.records if r.name == "voxgate.engine.talker" and "cuda_graphs" in r.message]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_the_flag_off_engine_does_not_warn(ckpt: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="voxgate.engine.talker"):
        load_engine(str(ckpt), max_streams=4, max_context=128).close()
    assert not [r for r in caplog.records if r.name == "voxgate.engine.talker"]


# ---- on a GPU (skipped without one) --------------------------------------------------------------------
@needs_cuda
def test_static_call_replays_a_captured_graph_equal_to_eager() -> None:
    dev = torch.device("cuda")
    call = StaticCall(affine, dev, capture=True)
    w = torch.randn(64, 32, device=dev)
    for rows in (8, 4, 8):
        x = torch.randn(rows, 64, device=dev)
        y, s = call(0.5, x, w)
        assert torch.equal(y, affine(0.5, x, w)[0]) and torch.equal(s, affine(0.5, x, w)[1])
    assert all(e.graph is not None for e in call.entries.values()) and len(call.entries) == 2


@needs_cuda
@pytest.mark.parametrize("kind", ["greedy", "seeded", "mixed"])
def test_cuda_graph_replay_gives_the_eager_codes(ckpt: Path, kind: str) -> None:
    cuda_model = load_model(ckpt, device="cuda", dtype=torch.float32)
    params = {"greedy": greedy, "seeded": seeded(cuda_model), "mixed": mixed(cuda_model)}[kind]
    ids_off, frames_off = run_schedule(cuda_model, params, cuda_graphs=False, device="cuda")
    ids_on, frames_on = run_schedule(cuda_model, params, cuda_graphs=True, device="cuda")
    assert ids_on == ids_off
    for on, off in zip(frames_on, frames_off, strict=True):
        assert torch.equal(on, off)
