"""voxgate's Python client: an async session over its streaming WebSocket protocol, typed events, and
(with the `pipecat` / `livekit` extras) TTS services for Pipecat and LiveKit Agents.

It needs only `websockets` and `msgspec`, and never imports the server.
"""

from voxgate_client.events import (
    Audio,
    AudioCancelled,
    AudioChunk,
    AudioDone,
    AudioMark,
    AudioStart,
    AudioWaiting,
    AudioWords,
    CodecDone,
    CodecStart,
    Error,
    Event,
    SegmentCommitted,
    SessionDone,
    SessionReady,
    Timing,
    UnknownEvent,
    Word,
    decode_event,
)
from voxgate_client.session import (
    Limits,
    Refused,
    Session,
    SessionClosed,
    Speech,
    VoxgateError,
    connect,
    stream_url,
)

__all__ = [
    "Audio",
    "AudioCancelled",
    "AudioChunk",
    "AudioDone",
    "AudioMark",
    "AudioStart",
    "AudioWaiting",
    "AudioWords",
    "CodecDone",
    "CodecStart",
    "Error",
    "Event",
    "Limits",
    "Refused",
    "SegmentCommitted",
    "Session",
    "SessionClosed",
    "SessionDone",
    "SessionReady",
    "Speech",
    "Timing",
    "UnknownEvent",
    "VoxgateError",
    "Word",
    "connect",
    "decode_event",
    "stream_url",
]
