"""The engine contract (DESIGN §3): what every backend — the Qwen3-TTS core or a CPU voice — offers.

The gateway sees only these names; it never learns which backend is behind them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """A piece of a stream's audio, in order.

    `first_frame` is the stream-relative index of the chunk's first PCM frame (sample, mono) at
    `sample_rate`, so the gateway can place `audio.mark`s exactly; `segment` is the index of the
    `append` call whose text this audio speaks.
    """

    pcm: np.ndarray  # int16, shape (n,)
    sample_rate: int
    first_frame: int
    segment: int


@dataclass(frozen=True, slots=True)
class CodecFrames:
    """Codec frames of a stream opened with `output="codec_tokens"` (no code2wav): for clients that
    decode on the device. `codes` is int16 `[n, codebooks]`; `first_frame` is the stream-relative index
    of its first frame; `segment` as in `AudioChunk`. `prime`: not speech of this stream but the frames
    its decoder state must start from (an ICL clone's reference): decode them, play nothing; they
    come first, numbered before frame 0."""

    codes: np.ndarray
    first_frame: int
    segment: int
    prime: bool = False


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The last event of every stream."""

    reason: Literal["done", "cancelled", "error"]
    message: str = ""


@dataclass(frozen=True, slots=True)
class Waiting:
    """The stream has text to speak but waits for engine capacity (a slot, a worker): sent once when
    the wait begins (and again if it begins anew), so the gateway can tell its client why audio is late
    instead of leaving it to guess. `reason` is a stable code (`capacity`); `ahead`: streams waiting
    before this one, when the engine knows."""

    reason: str = "capacity"
    ahead: int | None = None


StreamEvent = AudioChunk | CodecFrames | Waiting | StreamEnd


@dataclass(frozen=True, slots=True)
class Capacity:
    """What an engine can take now, judged from its measured cost (issue 14): `streams` is how many
    streams it can keep ahead of their listeners at once (those it serves included), `active` how many
    it serves. Admission starts a new stream only while `active < streams`. `busy_s`: seconds its
    workers have spent synthesising since it started, all workers together (None: not measured), and
    `workers` how many there are — how loaded it is, for /metrics."""

    streams: int
    active: int
    busy_s: float | None = None
    workers: int = 1


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    name: str
    languages: tuple[str, ...]
    kind: Literal["preset", "cloned"] = "preset"
    description: str = ""
    extra: dict[str, str] = field(default_factory=dict)


class EngineError(ValueError):
    """A request the engine cannot serve (unknown voice, unsupported language or option).

    `code` is a stable protocol error code the gateway forwards unchanged.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@runtime_checkable
class Stream(Protocol):
    """One utterance: text goes in as it is committed, audio comes out as it is made."""

    def append(self, text: str) -> None: ...

    def finish(self) -> None: ...

    def cancel(self) -> None: ...

    def events(self) -> AsyncIterator[StreamEvent]: ...


@runtime_checkable
class Engine(Protocol):
    sample_rate: int

    def voices(self) -> list[VoiceInfo]: ...

    def languages(self) -> list[str]: ...

    def open_stream(self, voice: str | None, language: str, **options: object) -> Stream: ...

    def close(self) -> None: ...
