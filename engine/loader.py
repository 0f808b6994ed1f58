"""`load_engine(model, **options)`: the one way the gateway gets an `Engine` (DESIGN §3)."""

from __future__ import annotations

from typing import Any

from engine.types import Engine

#: Names of the CPU voice backends: "cpu" is the default bundle (Piper joe for English, Kokoro-82M for
#: Mandarin), "piper" English only, "kokoro" Mandarin + English with one model.
CPU_BACKENDS = ("cpu", "piper", "kokoro")
#: Speech-shaped babble at a set pace and capacity, no model: for load tests and capacity benchmarks.
SYNTHETIC = "synthetic"
#: The backends without a talker: a gateway-wide `--talker` choice is for the Qwen3 models only.
NO_TALKER = (*CPU_BACKENDS, SYNTHETIC)
DEFAULT_MODEL = "cpu"


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
    Raises EngineError("model_unavailable", …) when the model cannot be served.
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
    from engine.qwen3.serving.qwen3_engine import load_qwen3_engine  # torch stays unimported for CPU voices

    return load_qwen3_engine(model, **options)
