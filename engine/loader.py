"""`load_engine(model, **options)`: the one way the gateway gets an `Engine` (docs/engine.md)."""

from __future__ import annotations

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


def _without_qwen3(model: str, name: str, missing: str) -> str:
    """Why `model` cannot load where the `qwen3` extra is not installed: a name that is no model at all
    says so first (installing gigabytes of torch would not help it)."""
    if name not in TINY and not (Path(model).expanduser() / "config.json").is_file():
        known = ", ".join((*CPU_BACKENDS, SYNTHETIC, *TINY))
        return f"{model!r} is neither a model name ({known}) nor a Qwen3-TTS checkpoint directory (no config.json)"
    what = "PyTorch" if missing.startswith("torch") else missing
    return f"{model!r} runs on the Qwen3 engine, which needs {what}; this install has none: {QWEN3_INSTALL}"
