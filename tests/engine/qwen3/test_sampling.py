from __future__ import annotations

import math

import pytest
import torch

from engine.qwen3 import sampling


def test_repetition_penalty_shrinks_seen_logits_toward_less_likely() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = sampling.repetition_penalty(logits, seen, torch.tensor([2.0]))
    assert out.tolist() == [[1.0, -4.0, 1.0, -1.0]]  # positive divided, negative multiplied, unseen untouched


def test_control_ids_are_suppressed_except_eos() -> None:
    mask = sampling.control_id_mask(3072, eos_id=2150)
    assert not mask[:2048].any()
    assert mask[2048:].sum() == 1023
    assert not mask[2150]
    out = sampling.suppress(torch.zeros(1, 3072), mask)
    assert math.isinf(out[0, 3000]) and out[0, 2150] == 0 and out[0, 5] == 0


def test_forbid_eos_only_on_selected_rows() -> None:
    out = sampling.forbid_eos(torch.zeros(2, 8), 3, torch.tensor([True, False]))
    assert math.isinf(out[0, 3]) and out[1, 3] == 0 and out[0, 2] == 0


def test_top_k_keeps_k_best_and_ties() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 3.0, 0.0], [1.0, 5.0, 3.0, 3.0, 0.0]])
    out = sampling.temperature_top_k_top_p(logits, torch.ones(2), torch.tensor([1, 2]), torch.ones(2))
    assert torch.isfinite(out[0]).tolist() == [False, True, False, False, False]
    assert torch.isfinite(out[1]).tolist() == [False, True, True, True, False]  # tie at the k-th value kept


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    out = sampling.temperature_top_k_top_p(logits, torch.ones(1), torch.tensor([0]), torch.tensor([0.75]))
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]
    kept = sampling.temperature_top_k_top_p(logits, torch.ones(1), torch.tensor([0]), torch.tensor([1.0]))
    assert torch.isfinite(kept).all()


def test_temperature_sharpens() -> None:
    logits = torch.tensor([[1.0, 2.0]])
    out = sampling.temperature_top_k_top_p(logits, torch.tensor([0.5]), torch.tensor([0]), torch.ones(1))
    assert out.tolist() == [[2.0, 4.0]]


def test_inverse_cdf_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    n = 1000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # evenly spaced quantiles
    ids = sampling.sample_from_logits(probs.log().expand(n, -1), u)
    counts = torch.bincount(ids, minlength=4).tolist()
    assert counts[1] == 0  # zero probability is never drawn
    assert counts == pytest.approx([100, 0, 600, 300], abs=1)


def test_a_sampler_mixes_greedy_and_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    sampler = sampling.RowSampler.build([True, False], [1.0, 1.0], [2, 2], [1.0, 1.0], vocab=3)
    ids = sampler(logits, torch.tensor([0.0, 1e-9], dtype=torch.float64))
    assert ids.tolist() == [1, 1]
    ids = sampler(logits, torch.tensor([0.0, 1.0], dtype=torch.float64))
    assert ids.tolist() == [1, 2]  # top-2 keeps ids 1 and 2; u=1 takes the last of them; id 0 never


def test_uniforms_come_from_each_rows_own_generator() -> None:
    a = sampling.draw_uniforms([torch.Generator().manual_seed(1), None, torch.Generator().manual_seed(2)])
    b = sampling.draw_uniforms([torch.Generator().manual_seed(1)])
    assert a[0] == b[0] and a[1] == 0 and a[2] != a[0]
    assert (a[[0, 2]] > 0).all() and (a <= 1).all()


@pytest.mark.parametrize("rows", [1, 4, 16, 32])
def test_top_k_candidates_equal_torch_topk(rows: int) -> None:
    logits = torch.randn(rows, 2048, generator=torch.Generator().manual_seed(rows))
    vals, ids = sampling.top_k_candidates(logits, 50)
    ref = torch.topk(logits, 50)
    assert torch.equal(vals, ref.values) and torch.equal(ids, ref.indices)


@pytest.mark.parametrize(("top_k", "top_p"), [(5, 1.0), (50, 1.0), (20, 0.5), (50, 0.9)])
def test_candidate_sampling_draws_the_full_vocabulary_distribution(top_k: int, top_p: float) -> None:
    """Over evenly spaced quantiles, the candidate path picks every id as often as the filtered
    softmax over the whole vocabulary gives it probability (16 rows: the blocked topk path)."""
    rows, vocab, n = 16, 256, 4000
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(top_k)) * 2
    temp = torch.full((rows,), 0.8)
    filtered = sampling.temperature_top_k_top_p(logits, temp, torch.full((rows,), top_k), torch.full((rows,), top_p))
    expected = torch.softmax(filtered, dim=-1)
    sampler = sampling.RowSampler.build([False] * rows, [0.8] * rows, [top_k] * rows, [top_p] * rows, vocab)
    assert sampler.k == top_k and sampler.any_top_p == (top_p < 1.0)
    counts = torch.zeros(rows, vocab)
    for q in range(n):
        u = torch.full((rows,), (q + 0.5) / n, dtype=torch.float64)
        counts[torch.arange(rows), sampler(logits, u)] += 1
    assert (counts[expected == 0] == 0).all()  # a filtered-out id is never drawn
    assert torch.allclose(counts / n, expected, atol=1.5 / n)


def test_row_sampler_falls_back_to_the_whole_vocabulary_when_a_row_keeps_it() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    sampler = sampling.RowSampler.build([True, False, False], [1.0] * 3, [0, 2, 0], [1.0] * 3, 3)
    assert sampler.k == 0 and sampler.any_greedy and not sampler.all_greedy
    ids = sampler(logits, torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64))
    assert ids.tolist() == [1, 2, 2]  # greedy argmax; top-2 ends at id 2; all ids: u=1 takes the last


def test_uniform_blocks_continue_each_rows_stream() -> None:
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    block = sampling.draw_uniforms([g1, None], n=15)
    assert block.shape == (2, 15) and (block[1] == 0).all() and (block[0] > 0).all()
    again = sampling.draw_uniforms([g2], n=15)
    assert torch.equal(block[0], again[0])
