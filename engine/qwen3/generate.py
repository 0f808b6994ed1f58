"""Generation over a loaded model, as gpt-fast's generate.py beside its model.py: model.py owns the modules
and caches, this module drives them. Per-request sampling params, codebook-0 choice, the code-predictor
pass split into its host and tensor halves, the talker's next input rows, and `generate_batch`, the
reference composition of those primitives that the engine core's talker backends reproduce exactly
(tests/support/talker_conformance.py).

Every function takes the model first, typed as `GenerationModel` (what they use of `Qwen3TTSModel`), so
this module does not import model.py and model.py may import it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from engine.qwen3 import sampling
from engine.qwen3.code_predictor import CodePredictor
from engine.qwen3.config import GenerationDefaults
from engine.qwen3.layers import KVCache
from engine.qwen3.prompt import Prompt, VoiceClone, frame_embedding
from engine.qwen3.talker import Talker


class GenerationModel(Protocol):
    """What generation uses of a loaded model (`engine.qwen3.model.Qwen3TTSModel`)."""

    talker: Talker
    predictor: CodePredictor
    gen: GenerationDefaults
    eos_id: int
    suppress_mask: torch.Tensor

    @property
    def device(self) -> torch.device: ...

    def new_kv_cache(self, slots: int, max_len: int) -> KVCache: ...

    def predictor_cache(self, rows: int) -> KVCache: ...

    def build_prompt(self, text: str | Sequence[int], *, voice: str | VoiceClone | None, language: str = ...,
                     instructions: str | None = ..., streaming_text: bool = ..., final: bool = ...) -> Prompt: ...


@dataclass
class SamplingParams:
    """Per-request sampling. `greedy` = argmax in talker and code predictor (penalty and suppression still
    apply, as the reference's do_sample=False, subtalker_dosample=False)."""

    greedy: bool = False
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    sub_temperature: float = 0.9
    sub_top_k: int = 50
    sub_top_p: float = 1.0
    min_new_tokens: int = 2
    seed: int | None = None
    generator: torch.Generator | None = field(default=None, repr=False)

    @classmethod
    def from_defaults(cls, gen: GenerationDefaults, *, greedy: bool = False, seed: int | None = None
                      ) -> SamplingParams:
        p = cls(greedy=greedy or not gen.do_sample, temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p,
                repetition_penalty=gen.repetition_penalty, sub_temperature=gen.subtalker_temperature,
                sub_top_k=gen.subtalker_top_k, sub_top_p=gen.subtalker_top_p, seed=seed)
        return p.seeded()

    def seeded(self) -> SamplingParams:
        """A copy with its own generator (seeded from `seed`, or from fresh entropy)."""
        seed = self.seed if self.seed is not None else random.SystemRandom().randrange(2**63)
        return replace(self, seed=seed, generator=torch.Generator().manual_seed(seed))


@dataclass
class GenerationRequest:
    prompt: Prompt
    params: SamplingParams
    max_frames: int


def _col(values: Sequence[float | int | bool], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(list(values), dtype=dtype, device=device)


# ---- one step's primitives ---------------------------------------------------------------------------
def choose_cb0(model: GenerationModel, logits: torch.Tensor, seen: torch.Tensor, n_generated: torch.Tensor,
               params: Sequence[SamplingParams]) -> torch.Tensor:
    """Codebook 0 for rows [B]: seen [B, V] bool (their generated cb0 ids), n_generated [B]."""
    dev = logits.device
    x = sampling.repetition_penalty(logits, seen, _col([p.repetition_penalty for p in params], logits.dtype, dev))
    x = sampling.suppress(x, model.suppress_mask)
    x = sampling.forbid_eos(x, model.eos_id, n_generated < _col([p.min_new_tokens for p in params], torch.long, dev))
    u = sampling.draw_uniforms([None if p.greedy else p.generator for p in params], dev)
    sampler = sampling.RowSampler.build(
        [p.greedy for p in params], [p.temperature for p in params], [p.top_k for p in params],
        [p.top_p for p in params], x.shape[-1], dev, x.dtype)
    return sampler(x, u)


def predictor_sampler(model: GenerationModel, params: Sequence[SamplingParams], device: torch.device
                      ) -> tuple[sampling.RowSampler, torch.Tensor]:
    """The host half of `complete_frames`: the rows' code-predictor sampler and their uniforms [B, 15]
    (one draw per row for all 15 codebooks: each row's generator is called once per frame)."""
    sampler = sampling.RowSampler.build(
        [p.greedy for p in params], [p.sub_temperature for p in params], [p.sub_top_k for p in params],
        [p.sub_top_p for p in params], model.predictor.cfg.vocab_size, device)
    u = sampling.draw_uniforms([None if p.greedy else p.generator for p in params], device,
                               n=model.predictor.steps)
    return sampler, u


def predict_frames(model: GenerationModel, hidden: torch.Tensor, cb0: torch.Tensor, sampler: sampling.RowSampler,
                   u: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The tensor half of `complete_frames` (CUDA-graph capturable when the sampler's path is, see
    engine/qwen3/serving/graphs.py): hidden [B, H], cb0 [B], uniforms [B, 15] → frames [B, 16]."""

    def pick(codebook: int, logits: torch.Tensor) -> torch.Tensor:
        return sampler(logits, u[:, codebook - 1])

    rest = model.predictor(hidden, model.talker.codec_rows(cb0), pick, cache)
    return torch.cat([cb0[:, None], rest], dim=1)


def complete_frames(model: GenerationModel, hidden: torch.Tensor, cb0: torch.Tensor, params: Sequence[SamplingParams],
                    cache: KVCache | None = None) -> torch.Tensor:
    """Run the code predictor for rows [B]: hidden [B, H] (the talker state that produced cb0) → [B, 16];
    in the model's own predictor cache unless `cache` is given."""
    sampler, u = predictor_sampler(model, params, hidden.device)
    cache = cache if cache is not None else model.predictor_cache(hidden.shape[0])
    return predict_frames(model, hidden, cb0, sampler, u, cache)


def next_inputs(model: GenerationModel, frames: torch.Tensor, text_rows: torch.Tensor) -> torch.Tensor:
    """Talker input rows [B, H] after frames [B, 16]: Σ16 code embeddings + the text-track row."""
    return frame_embedding(model.talker, model.predictor, frames) + text_rows


# ---- the reference loop --------------------------------------------------------------------------------
@torch.no_grad()
def generate_batch(model: GenerationModel, requests: Sequence[GenerationRequest]) -> list[np.ndarray]:
    """Generate several requests together (prompts of different lengths) → [frames, 16] int64 each."""
    dev, b = model.device, len(requests)
    lengths = torch.tensor([r.prompt.rows.shape[0] for r in requests], device=dev)
    t_max = int(lengths.max())
    hidden_size = model.talker.cfg.hidden_size
    embeds = torch.zeros(b, t_max, hidden_size, dtype=requests[0].prompt.rows.dtype, device=dev)
    for i, r in enumerate(requests):
        embeds[i, : r.prompt.rows.shape[0]] = r.prompt.rows
    cache = model.new_kv_cache(b, t_max + max(r.max_frames for r in requests) + 1)
    slots = torch.arange(b, device=dev)
    params = [r.params for r in requests]
    logits, hidden = model.talker.prefill(embeds, lengths, slots, cache)
    seen = torch.zeros(b, model.talker.cfg.vocab_size, dtype=torch.bool, device=dev)
    n_gen = torch.zeros(b, dtype=torch.long, device=dev)
    cb0 = choose_cb0(model, logits, seen, n_gen, params)
    frames: list[list[torch.Tensor]] = [[] for _ in range(b)]
    rows = [i for i in range(b) if int(cb0[i]) != model.eos_id and requests[i].max_frames > 0]
    while rows:
        idx = torch.tensor(rows, device=dev)
        sub = [params[i] for i in rows]
        seen[idx, cb0[idx]] = True
        n_gen[idx] += 1
        done = complete_frames(model, hidden[idx], cb0[idx], sub)
        text = []
        for j, i in enumerate(rows):
            frames[i].append(done[j])
            g, trailing = len(frames[i]) - 1, requests[i].prompt.trailing
            text.append(trailing[g] if g < trailing.shape[0] else requests[i].prompt.pad)
        keep = [j for j, i in enumerate(rows) if len(frames[i]) < requests[i].max_frames]
        if not keep:
            break
        rows = [rows[j] for j in keep]
        idx, keep_t = torch.tensor(rows, device=dev), torch.tensor(keep, device=dev)
        x = next_inputs(model, done[keep_t], torch.stack([text[j] for j in keep]))
        positions = lengths[idx] + n_gen[idx] - 1
        step_logits, step_hidden = model.talker.step(x, positions, idx, cache)
        hidden[idx] = step_hidden
        cb0[idx] = choose_cb0(model, step_logits, seen[idx], n_gen[idx], [params[i] for i in rows])
        rows = [i for i in rows if int(cb0[i]) != model.eos_id]
    return [torch.stack(f).cpu().numpy().astype(np.int64) if f else np.zeros((0, 16), np.int64) for f in frames]


def generate(model: GenerationModel, text: str, *, voice: str | VoiceClone | None = None, language: str = "auto",
             instructions: str | None = None, greedy: bool = False, seed: int | None = None,
             max_frames: int | None = None, streaming_text: bool = True) -> np.ndarray:
    """Codes [frames, 16] (int64) for one utterance; EOS may stop before `max_frames`."""
    prompt = model.build_prompt(text, voice=voice, language=language, instructions=instructions,
                                streaming_text=streaming_text)
    params = SamplingParams.from_defaults(model.gen, greedy=greedy, seed=seed)
    limit = max_frames if max_frames is not None else model.gen.max_new_tokens
    return generate_batch(model, [GenerationRequest(prompt, params, limit)])[0]
