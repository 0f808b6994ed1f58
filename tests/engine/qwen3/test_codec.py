from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from engine.qwen3 import Qwen3TTSModel

FRAMES = 160  # > 2 × the 72-frame attention window, so the carried window is really exercised


@pytest.fixture(scope="module")
def codes() -> np.ndarray:
    g = torch.Generator().manual_seed(7)
    return torch.randint(0, 2048, (FRAMES, 16), generator=g).numpy()


@pytest.fixture(scope="module")
def full(tiny_model: Qwen3TTSModel, codes: np.ndarray) -> np.ndarray:
    return tiny_model.decode(codes)


def _schedule(pattern: list[int], total: int) -> list[int]:
    out, left = [], total
    for n in itertools.cycle(pattern):
        if left <= 0:
            return out
        out.append(min(n, left))
        left -= n
    raise AssertionError


def test_full_decode_is_1920_samples_per_frame_and_not_trivial(full: np.ndarray) -> None:
    assert full.shape == (FRAMES * 1920,)
    assert full.dtype == np.float32
    assert 0.05 < float(full.std()) < 0.9  # neither silent nor clamped flat
    assert float(np.mean(np.abs(full) >= 1.0)) < 0.05


@pytest.mark.parametrize("pattern", [[1], [2, 4, 8, 16, 25], [25], [3, 7, 11, 5]],
                         ids=["1-frame", "ramp", "25", "ragged"])
def test_streamed_decode_equals_full_decode(tiny_model: Qwen3TTSModel, codes: np.ndarray, full: np.ndarray,
                                            pattern: list[int]) -> None:
    dec = tiny_model.stream_decoder()
    pieces, start = [], 0
    for n in _schedule(pattern, FRAMES):
        out = dec.step(codes[start:start + n])
        assert out.shape == (n * 1920,)
        pieces.append(out)
        start += n
    streamed = np.concatenate(pieces)
    rel = float(np.max(np.abs(streamed - full))) / float(np.max(np.abs(full)))
    assert rel <= 1e-5, rel
    assert dec.frames == FRAMES


def test_decoding_a_prefix_gives_the_prefix_of_the_full_decode(tiny_model: Qwen3TTSModel, codes: np.ndarray,
                                                               full: np.ndarray) -> None:
    head = tiny_model.decode(codes[:90])
    assert np.max(np.abs(head - full[: 90 * 1920])) <= 1e-5


def test_streams_at_different_positions_decode_together(tiny_model: Qwen3TTSModel, codes: np.ndarray,
                                                        full: np.ndarray) -> None:
    """Batched stepping of several streams (as the engine core does) equals each stream alone."""
    codec = tiny_model.codec
    other = np.roll(codes, 5, axis=0)
    other_full = tiny_model.decode(other)
    pool = codec.new_state(3)  # slot 0: `codes`, slot 1: idle, slot 2: `other` started 10 frames later
    outs: dict[int, list[np.ndarray]] = {0: [], 2: []}
    with torch.no_grad():
        for n in (10,):
            sub = pool.rows([0])
            outs[0].append(codec.step(torch.as_tensor(codes[:n].T[None]), sub)[0].numpy())
            pool.put([0], sub)
        pos = {0: 10, 2: 0}
        for n in (4, 4, 8, 8, 8):
            sub = pool.rows([0, 2])
            batch = np.stack([codes[pos[0]:pos[0] + n].T, other[pos[2]:pos[2] + n].T])
            wav = codec.step(torch.as_tensor(batch), sub).numpy()
            pool.put([0, 2], sub)
            outs[0].append(wav[0])
            outs[2].append(wav[1])
            pos = {k: v + n for k, v in pos.items()}
    assert pool.pos.tolist() == [42, 0, 32]
    a, b = np.concatenate(outs[0]), np.concatenate(outs[2])
    assert np.max(np.abs(a - full[: a.shape[0]])) <= 1e-5
    assert np.max(np.abs(b - other_full[: b.shape[0]])) <= 1e-5


def test_reset_slot_starts_a_fresh_stream(tiny_model: Qwen3TTSModel, codes: np.ndarray, full: np.ndarray) -> None:
    codec = tiny_model.codec
    state = codec.new_state(1)
    with torch.no_grad():
        codec.step(torch.as_tensor(np.roll(codes, 3, axis=0)[:20].T[None]), state)
        state.reset([0])
        wav = codec.step(torch.as_tensor(codes[:20].T[None]), state)[0].numpy()
    assert np.max(np.abs(wav - full[: 20 * 1920])) <= 1e-5


def test_padding_codes_are_clamped_like_the_reference(tiny_model: Qwen3TTSModel, codes: np.ndarray) -> None:
    padded = codes[:6].copy()
    padded[4:] = -1
    zeroed = codes[:6].copy()
    zeroed[4:] = 0
    assert np.array_equal(tiny_model.decode(padded), tiny_model.decode(zeroed))


def test_state_size_is_reported(tiny_model: Qwen3TTSModel) -> None:
    state = tiny_model.codec.new_state(2)
    assert state.batch == 2
    assert state.nbytes() > 0
    with pytest.raises(ValueError, match="streams"):
        tiny_model.codec.step(torch.zeros(1, 16, 2, dtype=torch.long), state)


def test_long_decode_in_blocks_equals_one_pass(tiny_model: Qwen3TTSModel, codes: np.ndarray, full: np.ndarray,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tiny_model, "FULL_DECODE_FRAMES", 64)
    blocked = tiny_model.decode(codes)
    assert blocked.shape == full.shape
    assert np.max(np.abs(blocked - full)) <= 1e-5
