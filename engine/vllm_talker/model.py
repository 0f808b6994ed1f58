"""The talker backbone and codebook-0 head as a vLLM model: vLLM's own Qwen3 (paged KV, its attention
kernels, chunked prefill), with two hooks. Registered out of tree (plugin.py); no vLLM module is
patched.

- `embed_input_ids`: a decode token id is `V + slot` (the logits processor forces it), so each row
  names its slot; the row fed is the one the talker prepared for that slot: Σ embeddings of its last
  frame + its text-track row. Prompts come in as `prompt_embeds` and never pass through here.
- `compute_logits`: keeps the sampled rows' final-normed hidden states (the code predictor's input)
  for the processor to file by slot.

Weights: the checkpoint's talker backbone (`talker.model.layers.*`, `talker.model.norm`), the codebook-0
table as `embed_tokens` and `talker.codec_head` as `lm_head`, both padded with zero rows to V + slots
ids. RoPE is plain 1-D: the checkpoint's interleaved MRoPE with identical T/H/W position ids is exactly
1-D RoPE (the native talker relies on the same identity).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from engine.vllm_talker import side as side_state
from engine.vllm_talker.side import expect


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


class VoxgateTalkerModel(Qwen3ForCausalLM):
    def __init__(self, *, vllm_config: object, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)  # type: ignore[arg-type]
        self.codec_vocab = int(self.config.voxgate_codec_vocab)
        self.hidden_size = int(self.config.hidden_size)

    def embed_input_ids(self, input_ids: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        side = side_state.current()
        n = input_ids.shape[0]
        if side is None or not side.stepping:  # vLLM's own dummy and profiling runs
            return torch.zeros(n, self.hidden_size, dtype=self.lm_head.weight.dtype, device=input_ids.device)
        slots = input_ids.long() - self.codec_vocab
        listed = slots.tolist()
        expect(all(0 <= s < side.max_slots for s in listed),
               f"decode token ids {input_ids.tolist()} are not slot-coded (V={self.codec_vocab})")
        expect(len(set(listed)) == n and set(listed) <= side.input_ready,
               f"decode rows name slots {listed}; the talker prepared rows for {sorted(side.input_ready)}")
        return side.inputs[slots.to(side.inputs.device)].to(device=input_ids.device)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        side = side_state.current()
        if side is not None and side.stepping:
            side.captured = hidden_states
        return super().compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        rows = int(self.config.vocab_size)

        def mapped() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.startswith("talker.model.layers.") or name == "talker.model.norm.weight":
                    yield name[len("talker."):], tensor
                elif name == "talker.model.codec_embedding.weight":
                    yield "model.embed_tokens.weight", _pad_rows(tensor, rows)
                elif name == "talker.codec_head.weight":
                    yield "lm_head.weight", _pad_rows(tensor, rows)
                # text embedding/projection, code predictor, speaker encoder: ours, outside vLLM

        loaded = super().load_weights(mapped())
        missing = {n for n, _ in self.named_parameters()} - loaded
        expect(not missing, f"the talker checkpoint left vLLM parameters unloaded: {sorted(missing)[:8]}")
        return loaded
