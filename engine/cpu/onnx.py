"""onnxruntime sessions for the CPU voices (imported lazily: only these backends need onnxruntime)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# onnxruntime 1.32 on Linux starts a telemetry client that writes a device id and an event database
# under ~/.cache/Microsoft and may upload them. Off unless the operator sets the variable otherwise;
# it must be set before the library creates its environment.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")


def make_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    # Several pool workers share the cores: spinning threads would steal them from each other.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3  # int8 Kokoro warns about unused initialisers on every load
    # Memory patterns are planned and kept per input shape, and every sentence has a new length: with
    # them Piper's RSS kept growing (+76 MB over 120 sentences of 25 lengths, 1 worker; two 64 KiB
    # streams: 486 MB and rising after 20 s, 346 MB flat without) at the same speed (72.9 vs 72.7 s
    # over 60 interleaved runs). Kokoro: +68 MB over 14 lengths (up to 100 exist) for runs ~8 % faster
    # without: bounded memory wins.
    opts.enable_mem_pattern = False
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def run_options() -> Any:
    """A RunOptions whose `terminate = True` (from any thread) aborts a run in progress."""
    import onnxruntime as ort

    return ort.RunOptions()
