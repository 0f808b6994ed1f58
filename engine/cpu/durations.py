"""Make a voice's ONNX graph also output the durations its duration predictor chose.

Piper (VITS) and Kokoro decide how many frames each phoneme id lasts before they make any audio;
the released graphs compute that tensor and keep it internal. One extra graph output exposes it, so a
model run returns, beside its audio, how long each of its input ids is spoken: word timings that cost
nothing and are exact to the frame (engine/cpu/timings.py maps them to words). The patched graph is
written once next to the voice's cache and reused while the source file is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

# The tensor each graph computes its per-id durations into (frames, before the decoder upsamples).
# (name, ONNX element type: 1 float, 7 int64). Facts of the released graphs, not knobs: the node each
# exporter named, and the element type that ONNX's TensorProto enum gives the tensor's dtype.
PIPER_DURATIONS = ("/Ceil_output_0", 1)  # float [1, 1, ids]: ceil(exp(logw) · length_scale)
KOKORO_DURATIONS = ("/encoder/Gather_output_0", 7)  # int64 [ids + 2]: the rounded, clipped durations


def with_durations(source: Path, tensor: tuple[str, int], cache: Path) -> Path:
    """`source` with `tensor` added as a graph output, as a file under `cache/durations/` (made once:
    its name carries the source's path, size and mtime, so an upgraded voice package gets a new one).
    Raises ValueError when the graph computes no such tensor (a voice exported another way)."""
    name, elem_type = tensor
    st = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{name}".encode()).hexdigest()[:16]
    out = cache / "durations" / f"{source.stem}.{key}.onnx"
    if out.exists():
        return out
    import onnx  # only when a patched graph must be made (the cpu extra has it)

    model = onnx.load(str(source))
    if not any(name in node.output for node in model.graph.node):
        raise ValueError(f"{source.name} computes no tensor {name!r}: no durations to expose")
    model.graph.output.append(onnx.helper.make_tensor_value_info(name, elem_type, None))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        onnx.save(model, str(tmp))
        tmp.replace(out)  # atomic: a concurrent loader never sees half a graph
    finally:
        tmp.unlink(missing_ok=True)
    return out
