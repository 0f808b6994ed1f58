"""The engine contract: what every backend — the Qwen3-TTS core or a CPU voice — offers.

The gateway sees only these names; it never learns which backend is behind them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Annotated, Literal, Protocol, runtime_checkable

import msgspec
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
    """The last event of every stream. `code`: with reason "error", a stable protocol code the gateway
    forwards (e.g. `engine_restarting`: the engine process died); "" means `engine_error`."""

    reason: Literal["done", "cancelled", "error"]
    message: str = ""
    code: str = ""


@dataclass(frozen=True, slots=True)
class Waiting:
    """Why the stream's audio is late, sent once when the wait begins (and again if it begins anew), so
    the gateway can tell its client instead of leaving it to guess. `reason` is a stable code:
    `capacity` — it has text to speak but waits for engine capacity (a slot, a worker); `pacing` — its
    first audio is made and the engine holds it until what follows will come in time to play on without
    a gap (the CPU voices' first-audio hold: the text after it, or its run, is still to come). `ahead`:
    streams waiting before this one, when the engine knows (`capacity` only).

    `pacing` also marks when the stream's first audio was ready: admission measures this box's speed to
    first audio up to it (gateway/queued_stream.py), not up to the release, which waits on the client's
    text as much as on the box. The gateway tells its client of `capacity` waits only (`audio.waiting`)."""

    reason: str = "capacity"
    ahead: int | None = None


@dataclass(frozen=True, slots=True)
class WordTiming:
    """One word (engine/words.py: a Latin word or a Han character) of the text the engine was given,
    and where its speech lies: [start, end) stream-relative frames at the stream's sample rate, on the
    same count as `AudioChunk.first_frame`."""

    word: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Words:
    """Word timings of a stream opened with `word_timings=True`, put before the `AudioChunk`s whose
    audio holds them (a client may show or cut text as it plays). `segment` as in `AudioChunk`; words in
    the order spoken, each segment's words in one or more `Words`. `estimated`: the model gives no
    alignment and the times come from what the engine knows (segment marks, text positions): good for
    cutting text at a barge-in, not for lip sync."""

    segment: int
    sample_rate: int
    words: tuple[WordTiming, ...]
    estimated: bool = False


StreamEvent = AudioChunk | CodecFrames | Words | Waiting | StreamEnd


@dataclass(frozen=True, slots=True)
class Capacity:
    """What an engine can take now, judged from its measured cost: `streams` is how many
    streams it can keep ahead of their listeners at once (those it serves included), `active` how many
    it serves. Admission starts a new stream only while `active < streams`. `busy_s`: seconds its
    workers have spent synthesising since it started, all workers together (None: not measured), and
    `workers` how many there are — how loaded it is, for /metrics. `follows_listener`: it makes a stream
    opened while another of its listener is open due after that one (`StreamRequest.listener`), so
    admission may start a listener's next stream beside the one it hears; an engine that would run the
    two at once (the Qwen3 core steps every row it holds) leaves it False, and the next stream waits
    for the slot.

    `budget`: where streams differ in cost (the CPU voices: Kokoro costs about ten times Piper), the cost
    of the streams it keeps ahead at once, in worker-seconds per audio second; `costs` what a stream costs
    by language, spoken with that language's default voice, and `voice_costs` by the voice it names.
    Admission then starts a stream while the cost of those it admitted and its own fit `budget`
    (gateway/admission.py), not while fewer than `streams` run, so a cheap stream never waits out a
    costly one it fits beside. None: every stream costs one of `streams`.

    `behind_s`: how long until the engine expects to be caught up with its urgent work (a listener's
    first piece waiting for a worker, a playing stream's piece due now): it starts no newcomer before
    then, and admission predicts none sooner (0: it is not behind). A moment's strain is not a full
    engine: a newcomer waits it out rather than for a stream to end.

    `first_audio_s`: where its voices differ in speed (the CPU voices: a Piper run is about eight times
    quicker than a Kokoro one), each class of voice's time from a stream's start to its first audio,
    alone on the engine, in seconds, as its cost model puts it now, and which class speaks a language
    (its default voice: `language_classes`) and a voice (`voice_classes`). Admission forecasts a
    stream's first audio per class (`voice_class`), starting from this. Empty: one class, unestimated."""

    streams: int
    active: int
    busy_s: float | None = None
    workers: int = 1
    follows_listener: bool = False
    budget: float | None = None
    costs: tuple[tuple[str, float], ...] = ()
    voice_costs: tuple[tuple[str, float], ...] = ()
    behind_s: float = 0.0
    first_audio_s: tuple[tuple[str, float], ...] = ()
    language_classes: tuple[tuple[str, str], ...] = ()
    voice_classes: tuple[tuple[str, str], ...] = ()

    def price(self, language: str | None, voice: str | None = None) -> float:
        """What a stream in `language` (`voice`: None or "default", the language's default) holds of
        `budget`: one of `streams` where the engine counts streams. Else its language's cost, or its
        voice's where that costs more (a voice that does not speak the language leaves it to the
        default). A language or voice not costed ("auto" among them): the costliest, as the engine may
        speak it with its costliest voice (never admitted for less). Bounded by the voices."""
        if self.budget is None:
            return 1.0
        by_language, by_voice = dict(self.costs), dict(self.voice_costs)
        costliest = max((*by_language.values(), *by_voice.values()), default=self.budget)  # none told: all
        default = voice in (None, "default", "auto")  # StreamRequest.voice: the language's default
        cost = by_language.get(language or "")
        if cost is None or not (default or voice in by_voice):
            return costliest
        return cost if default else max(cost, by_voice.get(voice or "", 0.0))

    def voice_class(self, language: str | None, voice: str | None = None) -> str:
        """Which class of voice speaks a stream in `language` (`voice` as in `price`): its language's
        default voice's, or the slower of that and its voice's. A language or voice not classed ("auto"
        among them): the slowest class, as the engine may speak it with its slowest voice (as `price`).
        "" where the engine tells no classes. Bounded by the voices."""
        speed = dict(self.first_audio_s)
        if not speed:
            return ""
        by_language, by_voice = dict(self.language_classes), dict(self.voice_classes)
        named = [by_language.get(language or "")]
        if voice not in (None, "default", "auto"):
            named.append(by_voice.get(voice or ""))
        known = [c for c in named if c is not None and c in speed]
        candidates = known if len(known) == len(named) else list(speed)
        return max(candidates, key=lambda c: (speed[c], c))


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    name: str
    languages: tuple[str, ...]
    # "designed": a voice shaped by each request's instructions (a VoiceDesign checkpoint's): the engine's
    # declaration that it designs voices, which the gateway reads before it takes a VoiceDesign request.
    kind: Literal["preset", "cloned", "designed"] = "preset"
    description: str = ""
    extra: dict[str, str] = field(default_factory=dict)


MAX_INSTRUCTIONS_CHARS = 2000  # prompt rows for the Qwen3 engine; the gateway's protocols allow 500
MAX_REF_TEXT_CHARS = 2000  # a 30 s reference's transcript is a few hundred characters
MAX_NAME_CHARS = 256  # voice and language names (the gateway's protocols bound them tighter)
MAX_LISTENER_CHARS = 64  # a listener's name (StreamRequest.listener): the gateway's are 32 hex digits
SEED_MAX = 2**63 - 1  # what every backend's generator takes (msgspec bounds must fit an int64)


MAX_LISTENER_BUFFER_S = 3600.0  # a continuation's listener buffer: far more than any backlog bound lets through
MAX_PHONEME_WORDS = 1000  # a lexicon's bound (sessions/lexicon.py)
PhonemeWord = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
PhonemeIpa = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^\S+$")]


class ReferenceClip(msgspec.Struct, frozen=True):
    """A cloned voice's reference: the bytes of an audio file, and what it says (None: x-vector only)."""

    audio: Annotated[bytes, msgspec.Meta(min_length=1)]
    text: Annotated[str, msgspec.Meta(max_length=MAX_REF_TEXT_CHARS)] | None = None


class StreamRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one stream is asked to be, checked once against declared bounds (`engine.options.stream_request`
    builds it; a Struct built by hand skips the bounds). The bounds are what any engine could take; an
    engine narrows them in `check` (Qwen3 speaks at one speed, CPU voices make no codec frames).
    `voice` None / "default" / "auto": the engine's default for the language."""

    voice: Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)] | None = None
    language: Annotated[str, msgspec.Meta(max_length=MAX_NAME_CHARS)] = "auto"
    sample_rate: Annotated[int, msgspec.Meta(ge=8000, le=48000)] | None = None  # None: the engine's own
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] = 1.0
    seed: Annotated[int, msgspec.Meta(ge=0, le=SEED_MAX)] | None = None
    instructions: Annotated[str, msgspec.Meta(max_length=MAX_INSTRUCTIONS_CHARS)] | None = None
    output: Literal["pcm", "codec_tokens"] = "pcm"
    reference: ReferenceClip | None = None
    word_timings: bool = False  # emit `Words` beside the audio (engines that cannot time words ignore it)
    # word → IPA (a tenant lexicon's entries) for engines that phonemize text themselves (the CPU voices);
    # one that cannot take phonemes refuses the request (`phonemes_unsupported`): none goes unheard silently.
    phonemes: Annotated[dict[PhonemeWord, PhonemeIpa], msgspec.Meta(max_length=MAX_PHONEME_WORDS)] | None = None
    # A continuation: the seconds of audio its listener still has to hear when the stream opens
    # (the session's earlier utterance playing), so its first audio is due by then and not as a newcomer's;
    # None: the listener hears nothing now. A scheduling hint: an engine that orders its work by the
    # listener (the CPU voices' pool) uses it, the others may ignore it; it never changes what is said.
    listener_buffer_s: Annotated[float, msgspec.Meta(ge=0.0, le=MAX_LISTENER_BUFFER_S)] | None = None
    # Names the listener (a session's player) across its streams: a stream opened while an earlier stream
    # of the same listener is open continues it, its audio heard once that one's has played (a client
    # sending sentence by sentence has its next sentence open while the one before is made). The same
    # kind of hint, used by the same engines; None: a listener of its own.
    listener: Annotated[str, msgspec.Meta(max_length=MAX_LISTENER_CHARS)] | None = None
    # The listener's group (the gateway sets its tenant's digest): what an engine learns from a listener's
    # streams (the CPU voices' sentence-splitter vote) is shared within its group only, so one tenant's
    # traffic never changes another's scheduling. None: the group of listeners no tenant names.
    listener_group: Annotated[str, msgspec.Meta(max_length=MAX_LISTENER_CHARS)] | None = None

    def options(self) -> dict[str, object]:
        """The `open_stream` keywords that say the same (those not at their default)."""
        out: dict[str, object] = {}
        for name in ("sample_rate", "seed", "instructions", "listener_buffer_s", "listener", "listener_group"):
            if (value := getattr(self, name)) is not None:
                out[name] = value
        if self.speed != 1.0:
            out["speed"] = self.speed
        if self.output != "pcm":
            out["output"] = self.output
        if self.word_timings:
            out["word_timings"] = True
        if self.phonemes:
            out["phonemes"] = self.phonemes
        if self.reference is not None:
            out["ref_audio"] = self.reference.audio
            if self.reference.text is not None:
                out["ref_text"] = self.reference.text
        return out


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
    """A backend. Capabilities are declared, never probed: `supports_cloning` (streams may carry a
    `ReferenceClip`), `codec_info()` (None: no `output="codec_tokens"`). `check(request)` raises the
    `EngineError` that opening `request` would, without opening anything (cheap: the gateway calls it at
    every `session.config`). `open_stream(voice, language, **options)` is the adapter every caller uses:
    its keywords are `StreamRequest`'s (`ref_audio` + `ref_text` for `reference`), checked into one by
    `engine.options.stream_request`."""

    sample_rate: int
    supports_cloning: bool

    def voices(self) -> list[VoiceInfo]: ...

    def languages(self) -> list[str]: ...

    def codec_info(self) -> dict[str, object] | None: ...

    def check(self, request: StreamRequest) -> None: ...

    def capacity(self) -> Capacity | None:
        """How many streams it can keep ahead of their listeners now (None: it cannot tell; admission
        then trusts the `max_active_streams` setting alone). Cheap: read on every admission decision."""
        ...

    def open_stream(self, voice: str | None, language: str, **options: object) -> Stream: ...

    def close(self) -> None: ...
