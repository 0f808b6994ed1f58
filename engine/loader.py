"""`load_engine(model, **options)`: the one way the gateway gets an `Engine` (docs/engine.md)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from engine.types import Engine, EngineError

#: Names of the CPU voice backends: "cpu" is the default bundle (Piper joe for English, Kokoro-82M for
#: Mandarin), "piper" English only, "kokoro" Mandarin + English with one model.
CPU_BACKENDS = ("cpu", "piper", "kokoro")
#: Speech-shaped babble at a set pace and capacity, no model: for load tests and capacity benchmarks.
SYNTHETIC = "synthetic"
#: The backends without a talker: a gateway-wide `--talker` choice is for the Qwen3 models only.
NO_TALKER = (*CPU_BACKENDS, SYNTHETIC)
DEFAULT_MODEL = "cpu"
#: The randomly initialised Qwen3-TTS checkpoints built on first use (engine.qwen3.serving.qwen3_engine.TINY_MODELS).
TINY = ("tiny", "tiny-base")
#: What installs the Qwen3 engine's torch (pyproject.toml); a default install has none.
QWEN3_INSTALL = "pip install 'voxgate[qwen3]'"
#: The distributions that extra brings, as imported.
QWEN3_MODULES = ("torch", "safetensors", "tokenizers")
#: What installs the CPU voices, and the modules of it they import first.
CPU_INSTALL = "pip install 'voxgate[cpu]'"
CPU_MODULES = ("onnxruntime", "espeakng_loader")


def load_engine(model: str = DEFAULT_MODEL, **options: Any) -> Engine:
    """Load and warm up the engine for `model`.

    - a CPU voice backend name (`CPU_BACKENDS`): options `cache_dir`, `workers`, `threads`, `warmup`,
      `queue_size` (see engine.cpu.engine.CpuEngine);
    - "synthetic": babble at a set pace, no model (engine.synthetic): options `speed`, `first_audio_s`,
      `capacity`, `chunk_s`, `queue_size`, `max_pending_chars`;
    - "tiny", "tiny-base" (cloned voices) or a Qwen3-TTS checkpoint directory: the Qwen3 engine
      (engine.qwen3.serving.qwen3_engine.Qwen3Engine):
      options `cache_dir`, `device`, `greedy`, the core's (`max_streams`, `max_context`, `threads`, …) and
      `talker` ("native", or "vllm": engine/vllm_talker, docs/vllm.md) with its `talker_options`.
    Raises EngineError("model_unavailable", …) when the model cannot be served, naming the install when a
    Qwen3 model is asked of an install without torch (the `qwen3` extra).
    """
    name = model.strip().lower()
    if name in NO_TALKER:
        # These have no talker: a gateway-wide `--talker` choice is for its Qwen3 models.
        options.pop("talker", None)
        options.pop("talker_options", None)
    if name == SYNTHETIC:
        from engine.synthetic import load_synthetic_engine

        return load_synthetic_engine(**options)
    if name in CPU_BACKENDS:
        from engine.cpu.engine import load_cpu_engine  # heavy imports (onnxruntime) stay lazy

        return load_cpu_engine(name, **options)
    try:
        from engine.qwen3.serving.qwen3_engine import load_qwen3_engine  # torch stays unimported for CPU voices
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in QWEN3_MODULES:
            raise
        raise EngineError("model_unavailable", _without_qwen3(model, name, exc.name or "")) from exc

    return load_qwen3_engine(model, **options)


def unavailable(model: str) -> str | None:
    """Why `model` cannot load in this install, told without loading or importing anything heavy (the
    gateway asks before it starts, so a typo exits with one line instead of a server whose only model
    failed): a source that is neither a model name nor a checkpoint directory, or an engine whose extra
    is not installed. None: it may load (the weights themselves are read by `load_engine` only)."""
    name = model.strip().lower()
    if name == SYNTHETIC:
        return None
    if name in CPU_BACKENDS:
        missing = _missing(CPU_MODULES)
        return f"the CPU voices need {missing}; this install has none: {CPU_INSTALL}" if missing else None
    if (problem := _not_a_model(model, name)) is not None:
        return problem
    missing = _missing(QWEN3_MODULES)
    return _without_qwen3(model, name, missing) if missing else None


def _missing(modules: tuple[str, ...]) -> str | None:
    """The first of `modules` that cannot be imported here (found, not imported)."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # an import hook that refuses it, a broken half-install
            found = False
        if not found:
            return module
    return None


def _not_a_model(model: str, name: str) -> str | None:
    """Why `model`, neither a CPU voice nor synthetic, is no Qwen3 model either (None: it may be one)."""
    if name in TINY:
        return None
    path = Path(model).expanduser()
    if (path / "config.json").is_file():
        return _incomplete(model, path)
    a_path = "/" in model or os.sep in model  # as the settings read a --model entry (a path, not a name)
    if a_path and not path.exists():
        return f"{model!r}: no such directory"
    if a_path:
        return f"{model!r} is not a Qwen3-TTS checkpoint directory (no config.json)"
    known = ", ".join((*CPU_BACKENDS, SYNTHETIC, *TINY))
    return f"{model!r} is neither a model name ({known}) nor a Qwen3-TTS checkpoint directory (no config.json)"


#: What a checkpoint directory must hold besides config.json, each as alternatives (engine/qwen3/weights.py
#: reads `model.safetensors` or a sharded index; engine/qwen3/text.py `tokenizer.json` or the BPE pair).
CHECKPOINT_FILES = (
    ("model.safetensors", "model.safetensors.index.json"),
    ("speech_tokenizer/config.json",),
    ("speech_tokenizer/model.safetensors", "speech_tokenizer/model.safetensors.index.json"),
    ("tokenizer.json", "vocab.json"),
)


def _incomplete(model: str, path: Path) -> str | None:
    """What a checkpoint directory lacks (an interrupted download, say); None: every file is there."""
    for choices in CHECKPOINT_FILES:
        if not any((path / name).is_file() for name in choices):
            return (f"{model!r} is an incomplete Qwen3-TTS checkpoint: no {' or '.join(choices)} "
                    "(fetch it again: docs/gpu.md)")
    return None


def _without_qwen3(model: str, name: str, missing: str) -> str:
    """Why `model` cannot load where the `qwen3` extra is not installed: a name that is no model at all
    says so first (installing gigabytes of torch would not help it)."""
    if (problem := _not_a_model(model, name)) is not None:
        return problem
    what = "PyTorch" if missing.startswith("torch") else missing
    return f"{model!r} runs on the Qwen3 engine, which needs {what}; this install has none: {QWEN3_INSTALL}"
