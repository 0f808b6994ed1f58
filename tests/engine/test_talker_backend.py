"""The engine's sampling adapter picks exactly the ids `engine.qwen3.sampling.choose` picks."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.qwen3 import sampling
from engine.talker_backend import choose


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 6), vocab=st.sampled_from([5, 64, 2048]),
       ties=st.booleans())
def test_choose_equals_the_models_choose(seed: int, rows: int, vocab: int, ties: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 3
    if ties:  # coarse values: many logits tie with the k-th best
        logits = logits.round()
    logits[:, torch.randint(0, vocab, (vocab // 4,), generator=g)] = float("-inf")  # suppressed ids
    greedy = torch.rand(rows, generator=g) < 0.3
    temperature = torch.rand(rows, generator=g) + 0.2
    top_k = torch.randint(-1, vocab + 3, (rows,), generator=g)
    top_p = torch.where(torch.rand(rows, generator=g) < 0.5, torch.ones(rows), torch.rand(rows, generator=g))
    uniforms = 1.0 - torch.rand(rows, generator=g, dtype=torch.float64)
    for p in (top_p, torch.ones(rows)):  # with and without a top-p row (the fast path needs none)
        expected = sampling.choose(logits, greedy, temperature, top_k, p, uniforms)
        assert torch.equal(choose(logits, greedy, temperature, top_k, p, uniforms), expected)
