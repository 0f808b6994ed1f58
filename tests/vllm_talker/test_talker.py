"""The vLLM talker passes the checks every TalkerBackend passes (tests/support/talker_conformance.py):
greedy codes equal the model's reference loop for staggered batches in changing order, a slot left out
keeps its state, abort frees a slot for a fresh request, seeded sampling reproduces alone and batched —
driven exactly as the core drives a talker. Then what is vLLM's own: its counters after abort, chunked
prefill, the KV budget refused at start-up, and the batch-layout checks failing loudly."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.talker_conformance import ALL_CHECKS, SPEC

from engine.qwen3 import Qwen3TTSModel
from engine.qwen3.generate import SamplingParams
from engine.qwen3.serving.talker_backend import talker_factory
from engine.vllm_talker.side import LayoutError
from engine.vllm_talker.talker import VllmTalker

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_vllm_talker_conforms(borrow: Callable[..., Any], model: Qwen3TTSModel, check: Callable[..., None]
                                  ) -> None:
    check(borrow, model)


def test_the_vllm_talker_is_found_by_name() -> None:
    assert talker_factory("vllm") == VllmTalker.create


def _prompt(model: Qwen3TTSModel, text: str = "Hello there, how are you doing today?") -> Any:
    return model.build_prompt(text, voice="ryan", language="english")


def test_every_prefill_is_chunked_and_abort_frees_the_kv_at_once(borrow: Callable[..., Any],
                                                                  model: Qwen3TTSModel) -> None:
    talker = borrow(SPEC)
    before = talker.counters()
    greedy = SamplingParams(greedy=True)
    prompt = _prompt(model)
    assert prompt.rows.shape[0] > talker.engine.vllm_config.scheduler_config.max_num_batched_tokens
    steps0 = talker.stats["prefill_steps"]
    talker.prefill(2, prompt.rows, greedy)
    assert talker.stats["prefill_steps"] - steps0 >= 2  # the prompt went in in chunks
    talker.complete([2], [greedy], 4)
    talker.step([2], prompt.trailing[:1], [greedy], 4)
    held = talker.counters()
    assert held["requests"] == 1 and held["free_blocks"] < before["free_blocks"]
    talker.abort(2)
    after = talker.counters()  # vLLM's own scheduler and block pool: no step needed to free it
    assert after["requests"] == 0 and after["unfinished"] == 0 and after["free_blocks"] == before["free_blocks"]


def test_a_kv_budget_that_would_need_preemption_is_refused_at_start_up(model: Qwen3TTSModel) -> None:
    with pytest.raises(ValueError, match="would have to preempt"):
        VllmTalker(model, 6, 128, kv_cache_memory_bytes=64 * 1024)


def test_a_step_over_a_slot_without_a_request_fails_loudly(borrow: Callable[..., Any], model: Qwen3TTSModel) -> None:
    talker = borrow(SPEC)
    with pytest.raises(LayoutError, match="not distinct live slots"):
        talker.step([4], torch.zeros(1, model.talker.cfg.hidden_size), [SamplingParams(greedy=True)], 4)
