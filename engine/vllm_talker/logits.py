"""Codebook-0 sampling inside vLLM's step, with our sampler: a V1 logits processor (vLLM's documented
batch-level extension point, `LLM(logits_processors=[...])`).

It mirrors the persistent batch from each `BatchUpdate` (index → slot, read from the request's
`SamplingParams.extra_args`), and for every row that samples this step (the scheduler says which: a
partial prefill chunk does not) it runs `Qwen3TTSModel.choose_cb0` — the native talker's penalty over
generated ids, control-id suppression, min-new-tokens and the row's own seeded generator — on the
codebook-0 logits, files the row's hidden state and id by slot, then leaves vLLM's greedy sampler one
choice: `V + slot`, the next step's slot-coded decode token. vLLM's own penalties and sampling stay off
(temperature 0), so the ids are exactly the native talker's for the same logits.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from engine.qwen3 import generate
from engine.vllm_talker import side as side_state
from engine.vllm_talker.side import expect


class Cb0Processor(LogitsProcessor):
    def __init__(self, vllm_config: object, device: torch.device, is_pin_memory: bool) -> None:
        self.batch: dict[int, int] = {}  # persistent-batch index → slot

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the id: vLLM must apply it to greedy rows too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        side = side_state.current()
        if batch_update is None or side is None:
            return
        for index in batch_update.removed:
            self.batch.pop(index, None)
        for index, params, _prompt, _output in batch_update.added:
            self.batch[index] = side.slot_of_params(params.extra_args)
        for a, b, kind in batch_update.moved:
            if kind == MoveDirectionality.SWAP:
                self.batch[a], self.batch[b] = self.batch[b], self.batch[a]
            else:
                self.batch[b] = self.batch.pop(a)
        expect(set(self.batch) == set(range(batch_update.batch_size)),
               f"the mirrored batch {self.batch} does not fill indices 0..{batch_update.batch_size - 1}")

    @torch.no_grad()
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        side = side_state.current()
        if side is None or not side.stepping:
            return logits
        n = logits.shape[0]
        expect(sorted(self.batch) == list(range(n)), f"{n} logit rows but the mirrored batch is {self.batch}")
        expect(side.captured is not None and side.captured.shape[0] == n,
               f"{n} logit rows but compute_logits kept {None if side.captured is None else side.captured.shape}")
        assert side.captured is not None
        rows, slots = [], []
        for i in range(n):
            slot = self.batch[i]
            if side.slots[slot].request_id in side.sampling:
                rows.append(i)
                slots.append(slot)
        expect(len(set(slots)) == len(slots) == len(side.sampling),
               f"rows {rows} sample slots {slots}; the scheduler said {sorted(side.sampling)} sample")
        if not rows:
            return logits
        v, dev = side.vocab, side.seen.device
        idx = torch.tensor(slots, dtype=torch.long, device=dev)
        row_idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        params = [side.slots[s].params for s in slots]
        cb0 = generate.choose_cb0(side.model, logits[row_idx, :v].to(dev), side.seen[idx], side.n_generated[idx],
                                  params)
        side.hidden[idx] = side.captured[row_idx].to(device=dev, dtype=side.hidden.dtype)
        side.cb0[idx] = cb0
        spoken = cb0 != side.model.eos_id
        side.seen[idx[spoken], cb0[spoken]] = True
        side.n_generated[idx] += spoken.long()
        for s, c in zip(slots, cb0.tolist(), strict=True):
            side.sampled[s] = c
        forced = torch.full_like(logits[row_idx], float("-inf"))
        forced[torch.arange(len(rows), device=logits.device), idx.to(logits.device) + v] = 0.0
        logits[row_idx] = forced
        return logits
