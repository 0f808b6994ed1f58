"""`VllmTalker`: the `TalkerBackend` (engine/qwen3/serving/talker_backend.py) on stock vLLM, in this process.

vLLM runs the talker backbone and codebook-0 head (our model class, model.py) with its paged KV cache,
attention kernels and chunked prefill, as an `LLMEngine` whose engine core lives in this process and
on the core's thread (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the uni executor): each talker call is one
or a few `LLMEngine.step()`s. What the core keeps — prompts, text tracks, codec, urgency scheduling,
the protocol — it keeps whichever talker runs.

- `prefill(slot, rows)`: one vLLM request per talker request, its prompt given as `prompt_embeds`;
  only it may run until its prompt is in (chunked when longer than `max_num_batched_tokens`). Its
  first codebook-0 id is picked by our sampler in the logits processor (logits.py).
- `step(slots, text_rows)`: the input row of each slot (Σ embeddings of its last frame + its next text
  row) is prepared here; one vLLM step runs exactly those slots' requests (scheduler.py holds the
  others back, KV kept): a slot whose text ran dry waits inside the same vLLM request, without padding,
  and resumes when the core steps it again. Streamed text is these rows: appended text never starts a
  new request, so a streamed utterance costs one prefill (`stats["prefills"]`).
- `complete(slots)`: our batched code predictor over the hidden states the step kept, between vLLM
  steps, in this process and on the model's device (padded to the core's bucket, like the native one).
- `abort(slot)`: `LLMEngine.abort_request` — the scheduler frees the request's KV blocks at once.

The KV cache is sized for every slot at its full context, checked at start-up: vLLM can never preempt
(its recompute would replay outputs our hooks cannot rebuild); a budget too small is refused.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engine.qwen3 import generate
from engine.qwen3.generate import SamplingParams
from engine.qwen3.layers import KVCache
from engine.qwen3.model import Qwen3TTSModel
from engine.qwen3.serving.talker_backend import TalkerSpec
from engine.types import EngineError
from engine.vllm_talker import side as side_state
from engine.vllm_talker.plugin import ARCHITECTURE, register
from engine.vllm_talker.preflight import INSTALL, cpu_head_problem
from engine.vllm_talker.side import LayoutError, SideState, SlotState, expect

log = logging.getLogger("voxgate.engine.vllm")

_PAD_PARAMS = SamplingParams(greedy=True, repetition_penalty=1.0, min_new_tokens=0)


def _talker_dir(model: Qwen3TTSModel, max_slots: int, dtype: torch.dtype) -> Path:
    """A model directory vLLM can load: a Qwen3 config naming our architecture, and the talker's
    backbone and codebook-0 tensors taken from the loaded model (so vLLM runs exactly its weights)."""
    tc = model.cfg.talker_config
    root = Path(tempfile.mkdtemp(prefix="voxgate-vllm-talker-"))
    config = {
        "architectures": [ARCHITECTURE], "model_type": "qwen3",
        "hidden_size": tc.hidden_size, "intermediate_size": tc.intermediate_size,
        "num_hidden_layers": tc.num_hidden_layers, "num_attention_heads": tc.num_attention_heads,
        "num_key_value_heads": tc.num_key_value_heads, "head_dim": tc.head_dim, "rms_norm_eps": tc.rms_norm_eps,
        "rope_theta": tc.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": tc.rope_theta},
        "max_position_embeddings": tc.max_position_embeddings, "hidden_act": "silu",
        "vocab_size": tc.vocab_size + max_slots, "voxgate_codec_vocab": tc.vocab_size,
        "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": str(dtype).removeprefix("torch."),
    }
    (root / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    talker = model.talker
    tensors = {f"talker.{k}": v.detach().to("cpu").contiguous().clone() for k, v in talker.state_dict().items()
               if k.startswith(("model.layers.", "model.norm.", "model.codec_embedding.", "codec_head."))}
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


class VllmTalker:
    """Options (`TalkerSpec.options`, `load_engine(..., talker="vllm", talker_options={...})`):
    `max_num_batched_tokens` (tokens per vLLM step: a longer prompt is chunked; default 2048),
    `enforce_eager` (default True on CPU: no torch.compile; on GPUs vLLM compiles and captures CUDA
    graphs), `kv_cache_memory_bytes` (default exactly what max_slots × max_context need, so vLLM never
    preempts), or instead `gpu_memory_utilization` (vLLM sizes the KV cache; checked the same way)."""

    def __init__(self, model: Qwen3TTSModel, max_slots: int, max_context: int, *,
                 max_num_batched_tokens: int = 2048, enforce_eager: bool | None = None,
                 kv_cache_memory_bytes: int | None = None, gpu_memory_utilization: float | None = None) -> None:
        self.model, self.max_slots, self.max_context = model, max_slots, max_context
        self.eos_id = model.eos_id
        if max_num_batched_tokens < max_slots:
            raise ValueError(f"max_num_batched_tokens {max_num_batched_tokens} < max_slots {max_slots}: a step "
                             "could not run every slot's decode")
        self.dtype = model.talker.codec_head.weight.dtype
        # CPU attention wants blocks in multiples of 32; on GPUs vLLM's default (16).
        self.block_size = 32 if model.device.type == "cpu" else 16
        memory = self._kv_budget(kv_cache_memory_bytes, gpu_memory_utilization)
        self.stats: dict[str, int] = {"prefills": 0, "prefill_steps": 0, "steps": 0, "aborts": 0}
        self._serial = 0
        self._predictor_caches: dict[int, KVCache] = {}
        self._broken: BaseException | None = None
        self._dir: Path | None = None
        self.side = SideState.allocate(model, max_slots)
        side_state.install(self.side)
        try:
            self._start_vllm(max_num_batched_tokens, enforce_eager, memory)
        except BaseException:
            self.close()
            raise
        self.side.inputs.zero_()
        log.info("vLLM talker: %d slots × %d positions, %d KV blocks of %d, up in %.1f s",
                 max_slots, max_context, self.kv_blocks, self.block_size, self.start_s)

    def _kv_budget(self, kv_cache_memory_bytes: int | None, gpu_memory_utilization: float | None) -> dict[str, Any]:
        """vLLM's memory options: exactly what the slots need by default, on GPUs too (vLLM's default would
        take 90 % of the device beside the engine's own tensors, and a second engine's); checked before
        vLLM starts, so a budget too small is refused at once."""
        tc = self.model.cfg.talker_config
        per_token = 2 * tc.num_hidden_layers * tc.num_key_value_heads * tc.head_dim * self.dtype.itemsize
        self.kv_bytes_per_slot = math.ceil(self.max_context / self.block_size) * self.block_size * per_token
        if kv_cache_memory_bytes is not None or gpu_memory_utilization is None:
            given = kv_cache_memory_bytes or (self.max_slots + 1) * self.kv_bytes_per_slot
            self._check_kv(int(given) // (self.block_size * per_token))
            return {"kv_cache_memory_bytes": int(given)}
        return {"gpu_memory_utilization": gpu_memory_utilization}

    def _start_vllm(self, max_num_batched_tokens: int, enforce_eager: bool | None, memory: dict[str, Any]) -> None:
        """vLLM's `LLM` over the talker's weights, its engine core in this process and on this thread."""
        dev = self.model.device
        # vLLM's engine core in this process (no busy-polling child, no pickling of side state) and no
        # spawned workers: every hook runs on the caller's thread, inside LLMEngine.step().
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # The V1 model runner: our hooks are its extension points (embed_input_ids on the prompt-embeds
        # path, compute_logits, V1 logits processors). 0.32 picks Model Runner V2 on GPUs by default.
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")
        head_dim = self.model.cfg.talker_config.head_dim
        if dev.type == "cpu" and (problem := cpu_head_problem(head_dim)) is not None:
            raise EngineError("model_unavailable", problem)  # before vLLM starts: it would fail at its first step
        try:
            from vllm import LLM
        except ImportError as exc:
            why = f"the vLLM talker needs vLLM installed ({INSTALL}): {exc}"
            raise EngineError("model_unavailable", why) from exc
        register()

        from engine.vllm_talker.logits import Cb0Processor
        from engine.vllm_talker.scheduler import VoxgateScheduler

        self._dir = _talker_dir(self.model, self.max_slots, self.dtype)
        t0 = time.perf_counter()
        self.llm = LLM(
            model=str(self._dir), skip_tokenizer_init=True, enable_prompt_embeds=True,
            dtype=str(self.dtype).removeprefix("torch."), seed=0,
            max_model_len=self.max_context, max_num_seqs=self.max_slots, max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=True, enable_prefix_caching=False, async_scheduling=False,
            block_size=self.block_size, enforce_eager=dev.type == "cpu" if enforce_eager is None else enforce_eager,
            distributed_executor_backend="uni", logits_processors=[Cb0Processor],
            scheduler_cls=VoxgateScheduler, **memory,
        )
        self.engine = self.llm.llm_engine
        self.start_s = time.perf_counter() - t0
        self._check_kv(self.kv_blocks)  # vLLM's own count of the blocks it made

    @classmethod
    def create(cls, model: Qwen3TTSModel, spec: TalkerSpec) -> VllmTalker:
        """The `TalkerFactory` (engine/qwen3/serving/talker_backend.py `TALKERS["vllm"]`)."""
        return cls(model, spec.max_slots, spec.max_context, **dict(spec.options))

    # ---- vLLM's own view (tests, stats) -------------------------------------------------------------
    @property
    def scheduler(self) -> Any:
        """The engine core's scheduler (in this process). Its counters are vLLM's own."""
        return self.engine.engine_core.engine_core.scheduler

    @property
    def kv_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.num_gpu_blocks)

    def counters(self) -> dict[str, int]:
        """vLLM's own count of requests it holds and of free KV blocks."""
        sched = self.scheduler
        return {"requests": len(sched.requests), "running": len(sched.running),
                "waiting": len(sched.waiting), "unfinished": self.engine.get_num_unfinished_requests(),
                "free_blocks": int(sched.kv_cache_manager.block_pool.get_num_free_blocks()),
                "blocks": self.kv_blocks, "preemptions": self.side.preemptions}

    def _check_kv(self, blocks: int) -> None:
        """Every slot at its full context must fit at once, so vLLM never needs to preempt."""
        usable = blocks - 1  # the block pool keeps one null block
        need = self.max_slots * math.ceil(self.max_context / self.block_size)
        if usable < need:
            raise ValueError(f"the vLLM KV cache holds {usable} blocks of {self.block_size}, but {self.max_slots} "
                             f"slots × {self.max_context} positions need {need}: it would have to preempt, which "
                             "the talker refuses (raise kv_cache_memory_bytes, or lower max_streams/max_context)")

    # ---- the seam ---------------------------------------------------------------------------------
    def _engine_step(self) -> None:
        side = self.side
        side.stepping, side.captured = True, None
        side.sampled.clear()
        try:
            self.engine.step()
        except BaseException as exc:
            # vLLM's request state may be half-advanced: no later call can trust it.
            self._broken = exc
            raise
        finally:
            side.stepping, side.captured = False, None
            side.input_ready.clear()
            side.sampling = set()

    def _usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"the vLLM talker failed earlier and cannot go on: {self._broken!r}")

    @torch.no_grad()
    def prefill(self, slot: int, rows: torch.Tensor, params: SamplingParams) -> int:
        """Prompt rows [T, H] into free `slot` → codebook 0 of frame 0 (EOS possible)."""
        from vllm import SamplingParams as VllmSamplingParams

        self._usable()
        side = self.side
        t = rows.shape[0]
        if not 0 <= slot < self.max_slots or slot in side.slots:
            raise ValueError(f"slot {slot} is not a free slot of [0, {self.max_slots})")
        if not 0 < t < self.max_context:
            raise ValueError(f"prompt of {t} rows does not fit max_context {self.max_context}")
        self._serial += 1
        serial = self._serial
        side.seen[slot] = False
        side.n_generated[slot] = 0
        vparams = VllmSamplingParams(
            temperature=0.0, max_tokens=self.max_context - t, ignore_eos=True, detokenize=False,
            extra_args={"voxgate_slot": slot, "voxgate_serial": serial},
        )
        embeds = rows.detach().to(device="cpu", dtype=self.dtype)
        side.slots[slot] = SlotState("", serial, params, t)
        try:
            rid = self.engine.add_request(f"voxgate-{slot}-{serial}", {"prompt_embeds": embeds}, vparams)
        except BaseException:
            side.slots.pop(slot, None)
            raise
        side.slots[slot].request_id = rid
        side.by_request[rid] = slot
        self.stats["prefills"] += 1
        side.allowed = {rid}
        # Chunks of at most max_num_batched_tokens; a little slack for a scheduler that cuts them smaller.
        chunks = math.ceil(t / self.engine.vllm_config.scheduler_config.max_num_batched_tokens) + 2
        try:
            for _ in range(chunks):
                self._engine_step()
                self.stats["prefill_steps"] += 1
                if slot in side.sampled:
                    return side.sampled[slot]
        finally:
            side.allowed = set()
        expect(False, f"slot {slot}: a prompt of {t} rows made no codebook 0 in {chunks} vLLM steps")
        raise AssertionError  # unreachable

    @torch.no_grad()
    def step(self, slots: Sequence[int], text_rows: torch.Tensor, params: Sequence[SamplingParams],
             bucket: int) -> list[int]:
        """One vLLM step running exactly `slots`: input = Σ codes of each slot's last frame + its text row."""
        self._usable()
        side = self.side
        expect(len(set(slots)) == len(slots) and all(s in side.slots for s in slots),
               f"step over slots {list(slots)}: not distinct live slots ({sorted(side.slots)})")
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=side.inputs.device)
        side.inputs[idx] = generate.next_inputs(self.model, side.last_frame[idx], text_rows).to(side.inputs.dtype)
        side.input_ready = set(slots)
        side.allowed = {side.slots[s].request_id for s in slots}
        try:
            self._engine_step()
        finally:
            side.allowed = set()
        self.stats["steps"] += 1
        if set(side.sampled) != set(slots):
            # Some requests advanced and some did not: a re-run row by row would not find them as they were.
            self._broken = LayoutError(f"vLLM stepped slots {sorted(side.sampled)}, the core asked for {sorted(slots)}")
            raise self._broken
        return [side.sampled[s] for s in slots]

    def _predictor_cache(self, rows: int) -> KVCache:
        cache = self._predictor_caches.get(rows)
        if cache is None:
            cache = self._predictor_caches[rows] = self.model.predictor.new_cache(rows)
        return cache

    @torch.no_grad()
    def complete(self, slots: Sequence[int], params: Sequence[SamplingParams], bucket: int) -> torch.Tensor:
        """Our batched code predictor for the slots' pending codebook 0 → frames [len(slots), 16]."""
        self._usable()
        side, n = self.side, len(slots)
        expect(all(s in side.slots for s in slots), f"complete over slots {list(slots)}: not all live")
        idx = torch.as_tensor(list(slots), dtype=torch.long, device=side.hidden.device)
        hidden, cb0, all_params = side.hidden[idx], side.cb0[idx], list(params)
        if bucket > n:  # padded like the native talker: a row's codes do not depend on the batch size
            hidden = torch.cat([hidden, hidden.new_zeros(bucket - n, hidden.shape[1])])
            cb0 = torch.cat([cb0, cb0.new_zeros(bucket - n)])
            all_params += [_PAD_PARAMS] * (bucket - n)
        sampler, u = generate.predictor_sampler(self.model, all_params, hidden.device)
        cache = self._predictor_cache(hidden.shape[0])
        frames = generate.predict_frames(self.model, hidden, cb0, sampler, u, cache)[:n]
        side.last_frame[idx] = frames
        return frames.clone()

    def abort(self, slot: int) -> None:
        """End the request in `slot`: vLLM frees its KV blocks now."""
        live = self.side.slots.pop(slot, None)
        if live is None:
            return
        self.side.by_request.pop(live.request_id, None)
        self.stats["aborts"] += 1
        if live.request_id and self._broken is None:
            self.engine.abort_request([live.request_id], internal=True)

    @torch.no_grad()
    def warm_up(self, buckets: Sequence[int]) -> dict[int, float]:
        """Every bucket once through prefill, step and complete on throwaway requests (vLLM warmed up its
        own kernels at start-up) → seconds of one warm step + complete per bucket."""
        h = self.model.talker.cfg.hidden_size
        prompt = torch.zeros(4, h, dtype=self.dtype, device=self.model.device)
        text = torch.zeros(max(buckets, default=1), h, dtype=self.dtype, device=self.model.device)
        costs: dict[int, float] = {}
        for b in buckets:
            slots = list(range(min(b, self.max_slots)))
            params = [_PAD_PARAMS] * len(slots)
            try:
                for s in slots:
                    self.prefill(s, prompt, _PAD_PARAMS)
                self.complete(slots, params, b)
                self.step(slots, text[: len(slots)], params, b)
                self.complete(slots, params, b)
                t0 = time.perf_counter()
                self.step(slots, text[: len(slots)], params, b)
                self.complete(slots, params, b)
                costs[b] = time.perf_counter() - t0
            finally:
                for s in slots:
                    self.abort(s)
        self.stats.update(dict.fromkeys(self.stats, 0))  # count the streams' work, not the warm-up's
        return costs

    def slot_bytes(self) -> dict[str, int]:
        side = self.side
        carry = sum(t[0].numel() * t.element_size() for t in
                    (side.hidden, side.cb0, side.last_frame, side.inputs, side.seen, side.n_generated))
        return {"kv": self.kv_bytes_per_slot, "carry": carry}

    def close(self) -> None:
        for slot in list(self.side.slots):
            try:
                self.abort(slot)
            except Exception:  # closing: the engine may already be gone
                log.debug("abort of slot %d at close failed", slot, exc_info=True)
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                log.debug("vLLM engine shutdown failed", exc_info=True)
            self.llm = None
        if side_state.current() is self.side:
            side_state.install(None)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
