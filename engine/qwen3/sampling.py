"""Sampling as small pure functions over [batch, vocab] logits, with per-row parameters.

Order and semantics follow Hugging Face's logits processors as the reference uses them: repetition
penalty (over the row's generated codebook-0 ids only), token suppression, EOS masked until
`min_new_tokens`, then — for sampled rows only — temperature, top-k, top-p. Randomness comes from one
uniform per row per draw, taken from the row's own generator, so a row's tokens do not depend on which
other rows share its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NEG_INF = float("-inf")


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF-style: seen ids' positive logits are divided by the penalty, negative ones multiplied.

    seen [B, V] bool, penalty [B]. Each id counts once however often it was generated (HF gathers and
    scatters the same value for repeated ids).
    """
    p = penalty[:, None].to(logits.dtype)
    penalised = torch.where(logits < 0, logits * p, logits / p)
    return torch.where(seen, penalised, logits)


def suppress(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Set ids where mask ([V] or [B, V] bool) is true to -inf."""
    return logits.masked_fill(mask, NEG_INF)


def control_id_mask(vocab_size: int, eos_id: int, n_control: int = 1024) -> torch.Tensor:
    """The talker never emits its control/speaker/language ids [vocab-1024, vocab), except EOS."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[vocab_size - n_control:] = True
    mask[eos_id] = False
    return mask


def forbid_eos(logits: torch.Tensor, eos_id: int, rows: torch.Tensor) -> torch.Tensor:
    """min_new_tokens: mask EOS on rows [B] (bool) that have generated too few tokens."""
    out = logits.clone()
    out[rows, eos_id] = NEG_INF
    return out


def temperature_top_k_top_p(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                            top_p: torch.Tensor) -> torch.Tensor:
    """Scale by temperature [B] (>0), keep the top_k [B] best (<=0: all, ties kept), then the smallest
    set whose probability reaches top_p [B] (>=1: all). Removed ids become -inf."""
    v = logits.shape[-1]
    x = logits / temperature[:, None].to(logits.dtype)
    k = torch.where(top_k > 0, top_k.clamp(max=v), torch.full_like(top_k, v))
    # topk to the largest k in the batch, not a full sort: it was 35% of a sampled batch-8 step.
    kth = torch.topk(x, int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
    x = x.masked_fill(x < kth, NEG_INF)
    if bool((top_p < 1.0).any()):
        sorted_x, order = torch.sort(x, dim=-1)
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1 - top_p[:, None].to(cum.dtype))
        drop[:, -1] = False  # always keep the best id
        drop = drop & (top_p[:, None] < 1.0)
        x = x.masked_fill(drop.scatter(1, order, drop), NEG_INF)
    return x


def sample_from_logits(logits: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: ids [B] with P(id) = softmax(logits); uniforms [B] in (0, 1]."""
    probs = torch.softmax(logits.float(), dim=-1)
    cdf = probs.cumsum(dim=-1)
    target = uniforms[:, None].to(cdf.dtype) * cdf[:, -1:]
    ids = torch.searchsorted(cdf, target).squeeze(1)
    return ids.clamp(max=logits.shape[-1] - 1)


def draw_uniforms(generators: Sequence[torch.Generator | None], device: torch.device | str = "cpu") -> torch.Tensor:
    """One uniform in (0, 1] per row from that row's generator (rows without one get zeros: unused)."""
    u = [1.0 - torch.rand((), generator=g, dtype=torch.float64).item() if g is not None else 0.0
         for g in generators]
    return torch.tensor(u, dtype=torch.float64, device=device)


def choose(logits: torch.Tensor, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
           top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Argmax for greedy rows [B] (bool), a filtered sample for the others."""
    best = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return best
    filtered = temperature_top_k_top_p(logits, temperature.clamp(min=1e-5), top_k, top_p)
    return torch.where(greedy, best, sample_from_logits(filtered, uniforms))
