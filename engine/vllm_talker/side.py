"""The side state shared by the three pieces we plug into vLLM and the `VllmTalker` that drives them.

vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the uni executor), on the core's one
thread: its scheduler (`scheduler.VoxgateScheduler`), our model class (`model.VoxgateTalkerModel`) and
our logits processor (`logits.Cb0Processor`) all run inside `LLMEngine.step()`, which the talker calls.
They meet here, keyed by slot, and nothing here is touched from another thread.

Per step the talker sets `allowed` (the vLLM requests that may run: parked and paused slots sit out
with their KV kept) and each stepped slot's input row; the scheduler records which scheduled requests
sample this step (a partial prefill chunk does not); the model gathers the input rows by the slot
encoded in each decode token id and captures the sampled rows' hidden states; the processor mirrors
the batch layout, picks codebook 0 with our sampler and forces vLLM's sampler onto `V + slot`, so the
next decode token names its own slot again. Every assumption is checked where it is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.qwen3.generate import SamplingParams
from engine.qwen3.model import Qwen3TTSModel


class LayoutError(AssertionError):
    """vLLM's batch did not look as the hooks assume (a changed vLLM, or a setting we do not support)."""


def expect(cond: bool, what: str) -> None:
    """Fail loudly (also under `python -O`) when a batch-layout assumption does not hold."""
    if not cond:
        raise LayoutError(what)


@dataclass
class SlotState:
    """One live vLLM request of the talker."""

    request_id: str
    serial: int
    params: SamplingParams
    prompt_len: int


@dataclass
class SideState:
    model: Qwen3TTSModel  # ours: the sampler's masks, the code predictor, the embedding tables
    max_slots: int
    vocab: int  # codebook-0 ids [0, vocab); decode token V + slot names its slot
    hidden: torch.Tensor  # [S, H] the hidden state that produced each slot's codebook 0
    cb0: torch.Tensor  # [S]
    last_frame: torch.Tensor  # [S, 16]
    inputs: torch.Tensor  # [S, H] each slot's next talker input row (set by the talker before a step)
    seen: torch.Tensor  # [S, V] bool: generated codebook-0 ids (repetition penalty)
    n_generated: torch.Tensor  # [S]
    slots: dict[int, SlotState] = field(default_factory=dict)
    by_request: dict[str, int] = field(default_factory=dict)
    allowed: set[str] = field(default_factory=set)  # request ids the scheduler may run this step
    input_ready: set[int] = field(default_factory=set)  # slots whose `inputs` row is for this step
    sampling: set[str] = field(default_factory=set)  # scheduled requests that sample this step
    sampled: dict[int, int] = field(default_factory=dict)  # slot → the codebook-0 id this step chose
    captured: torch.Tensor | None = None  # the sampled rows' hidden states, batch order (compute_logits)
    batch: list[int | None] = field(default_factory=list)  # persistent-batch index → slot (the processor's mirror)
    stepping: bool = False  # inside a talker call (else: vLLM's own warm-up and profiling runs)
    preemptions: int = 0

    @classmethod
    def allocate(cls, model: Qwen3TTSModel, max_slots: int) -> SideState:
        tc, dev = model.cfg.talker_config, model.device
        dtype = model.talker.codec_head.weight.dtype
        s, h, v = max_slots, tc.hidden_size, tc.vocab_size
        return cls(model, s, v, hidden=torch.zeros(s, h, dtype=dtype, device=dev),
                   cb0=torch.zeros(s, dtype=torch.long, device=dev),
                   last_frame=torch.zeros(s, 16, dtype=torch.long, device=dev),
                   inputs=torch.zeros(s, h, dtype=dtype, device=dev),
                   seen=torch.zeros(s, v, dtype=torch.bool, device=dev),
                   n_generated=torch.zeros(s, dtype=torch.long, device=dev))

    def slot_of_params(self, extra_args: dict[str, object] | None) -> int:
        """The slot a vLLM request's `SamplingParams.extra_args` name (the processor's only key)."""
        expect(bool(extra_args) and "voxgate_slot" in extra_args,  # type: ignore[operator]
               f"a request without voxgate_slot in its extra_args reached the talker's batch: {extra_args}")
        assert extra_args is not None
        slot, serial = extra_args["voxgate_slot"], extra_args["voxgate_serial"]
        live = self.slots.get(slot)  # type: ignore[call-overload]
        expect(live is not None and live.serial == serial,
               f"batch holds slot {slot} serial {serial}, but the talker's slot holds {live}")
        return int(slot)  # type: ignore[call-overload]


_CURRENT: SideState | None = None


def install(state: SideState | None) -> None:
    """One vLLM talker per process (its hooks find the state here)."""
    global _CURRENT
    if state is not None and _CURRENT is not None:
        raise RuntimeError("a vLLM talker is already running in this process (one per process)")
    _CURRENT = state


def current() -> SideState | None:
    return _CURRENT
