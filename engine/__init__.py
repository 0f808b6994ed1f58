"""The embedded streaming engine (contract: engine/types.py). Knows nothing of sockets, Redis or punctuation."""

from engine.loader import load_engine
from engine.types import (
    AudioChunk,
    Capacity,
    CodecFrames,
    Engine,
    EngineError,
    Stream,
    StreamEnd,
    StreamEvent,
    StreamRequest,
    VoiceInfo,
    Waiting,
    Words,
    WordTiming,
)

__all__ = [
    "AudioChunk", "Capacity", "CodecFrames", "Engine", "EngineError", "Stream", "StreamEnd", "StreamEvent",
    "StreamRequest", "VoiceInfo", "Waiting", "WordTiming", "Words", "load_engine",
]
