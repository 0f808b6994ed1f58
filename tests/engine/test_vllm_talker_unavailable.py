"""Without vLLM installed (the default install), asking for the vLLM talker fails at once with a stable
code and says what to install; the CPU voices ignore a gateway-wide talker choice. On a CPU, a talker
whose head size vLLM's CPU attention has no kernel for (the built-in `tiny`: 16) is refused before vLLM
starts, naming the fix, and `voxgate serve --talker vllm` refuses it before serving (it would start, and
never become ready). The vLLM talker itself is tested in its own tier (tests/vllm_talker, docs/vllm.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.servers import free_port

from engine import EngineError, load_engine
from engine.qwen3 import make_tiny_checkpoint
from engine.qwen3.serving.talker_backend import TALKERS
from engine.vllm_talker.preflight import have_vllm, problems, talker_head_dim


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny32"), talker_head_dim=32)


@pytest.mark.skipif(have_vllm(), reason="vLLM is installed here")
def test_the_vllm_talker_without_vllm_is_model_unavailable_naming_the_install(tiny32: Path) -> None:
    assert "vllm" in TALKERS
    with pytest.raises(EngineError) as err:
        load_engine(str(tiny32), talker="vllm", max_streams=1, warm_up=False)  # a head size vLLM's CPU runs
    assert err.value.code == "model_unavailable" and "voxgate[vllm]" in str(err.value)


def test_a_talker_head_size_vllms_cpu_attention_cannot_run_is_refused_before_vllm_starts() -> None:
    t0 = time.monotonic()
    with pytest.raises(EngineError) as err:
        load_engine("tiny", talker="vllm", max_streams=1, warm_up=False)
    assert err.value.code == "model_unavailable", err.value
    assert "head_dim is 16" in str(err.value) and "--talker native" in str(err.value), err.value
    assert time.monotonic() - t0 < 60  # the tiny model's load, not a wait for a warm-up that never ends


def test_the_start_up_check_reads_the_checkpoints_talker_head_size(tmp_path: Path) -> None:
    for head_dim, refused in ((16, True), (32, False), (128, False), (48, True)):
        path = tmp_path / f"h{head_dim}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"talker_config": {"head_dim": head_dim}}))
        assert talker_head_dim(str(path)) == head_dim
        said = " ".join(problems(str(path), {}))
        assert (f"head_dim is {head_dim}" in said) == refused, said
        assert "head_dim" not in " ".join(problems(str(path), {"device": "cuda"}))  # a GPU's attention decides
    assert talker_head_dim("tiny") == 16 and talker_head_dim(str(tmp_path / "missing")) is None


def test_voxgate_serve_with_the_readmes_vllm_line_exits_at_once_naming_the_fix() -> None:
    port = str(free_port())
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--model", "tiny", "--talker", "vllm", "--port", port]
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        raise AssertionError("voxgate serve --model tiny --talker vllm started serving a model that cannot warm") from e
    print(f"\nexit {done.returncode} after {time.monotonic() - t0:.1f} s:\n{done.stderr}")
    assert done.returncode == 2, done.stderr
    assert "head_dim is 16" in done.stderr and "--talker native" in done.stderr, done.stderr
    if not have_vllm():
        assert "voxgate[vllm]" in done.stderr, done.stderr
