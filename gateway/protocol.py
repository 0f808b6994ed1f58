"""The WebSocket wire protocol (docs/protocol.md): typed client messages, decoded once at the edge.

A superset of vLLM-Omni's vocabulary; unknown fields are ignored (as vLLM-Omni does) so its clients
work unchanged. Every rejection is a `ProtocolError` with a stable code the client can act on.
"""

from __future__ import annotations

import enum
import re
import struct
from typing import Annotated, Literal, NamedTuple

import msgspec
from msgspec import UNSET, UnsetType

from engine.languages import canonical_language
from gateway.audio import FILE_FORMATS, STREAM_FORMATS
from gateway.timing import Timing

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # room for an inline base64 reference clip
MAX_MESSAGE_BYTES = 128 * 1024
CODEC_HEADER_FORMAT = "<IHB"  # codec_tokens messages: seq, n_frames, flags (see `pack_codec_header`)

Granularity = Literal["none", "sentence", "clause", "auto"]


class ProtocolError(Exception):
    """A request refused with a stable `code`; `fields` go into the `error` event (`utterance_index`…)."""

    def __init__(self, code: str, message: str, **fields: object) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields


# Close codes (docs/protocol.md): what a client sees when the server ends the socket, and why.
CLOSE_NORMAL = 1000  # session.close, or the client left
CLOSE_GOING_AWAY = 1001  # the server is shutting down
CLOSE_POLICY = 1008  # a bad first message, a missing key, a client that stopped reading
CLOSE_INTERNAL = 1011  # the server failed
CLOSE_TRY_LATER = 1013  # the engine is not ready
CLOSE_TIMEOUT = 4408  # no session.config in time, or idle past the session's idle timeout
CLOSE_TAKEN_OVER = 4409  # another connection took the session over
CLOSE_RECONNECT = 1012  # the server drains (a restart): reconnect, to any replica, and resume with session_id


class SessionConfig(msgspec.Struct, forbid_unknown_fields=False):
    """A session's effective config: what the message sent, the defaults for the rest."""

    voice: str | None = None
    speaker: str | None = None  # vLLM-Omni's alias of voice
    task_type: Literal["CustomVoice", "VoiceDesign", "Base"] | None = None  # vLLM-Omni's; the voice implies it
    language: str = "auto"
    model: str | None = None
    response_format: str = "pcm"
    sample_rate: int | None = None
    # None (not sent): streamed for a stream format (pcm, ulaw, alaw), one file per utterance for a file
    # format (wav, …), so vLLM-Omni's clients, which send `response_format: "wav"` alone, get its default.
    stream_audio: bool | None = None
    speed: float = 1.0
    instructions: str | None = None
    split_granularity: Granularity = "auto"
    output_mode: Literal["pcm", "codec_tokens"] = "pcm"  # codec_tokens: frames for on-device decoding
    session_id: str | None = None
    seed: int | None = None
    lexicon: str | None = None  # a tenant lexicon's name (PUT /v1/lexicons/{name}): its pronunciations
    word_timestamps: bool = False  # vLLM-Omni's name: audio.words events beside the audio
    timestamps_format: Literal["voxgate", "vllm_omni"] | None = None  # None: vllm_omni if task_type was sent
    # vLLM-Omni's inline reference (a Base task's clone): never taken, but known, so it is refused by code
    # (gateway/voices.py refuse_missing_capability) rather than ignored; never stored with the session.
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool | None = None
    speaker_embedding: Annotated[list[float], msgspec.Meta(max_length=8192)] | None = None

    def validate(self) -> None:
        formats = STREAM_FORMATS if self.streamed else FILE_FORMATS
        if self.response_format not in formats:
            how = "streamed (stream_audio=true)" if self.streamed else "sent as files (stream_audio=false)"
            raise ProtocolError(
                "unsupported_format", f"response_format {self.response_format!r}: audio {how} is one of {formats}"
            )
        if self.sample_rate is not None and not 8000 <= self.sample_rate <= 48000:
            raise ProtocolError("invalid_config", "sample_rate must be between 8000 and 48000")
        if not 0.25 <= self.speed <= 4.0:
            raise ProtocolError("invalid_config", "speed must be between 0.25 and 4.0")
        if self.instructions is not None and len(self.instructions) > 500:
            raise ProtocolError("invalid_config", "instructions are limited to 500 characters")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ProtocolError("invalid_config", "seed must be between 0 and 2**63 - 1")
        if self.word_timestamps and self.output_mode == "codec_tokens":
            raise ProtocolError("invalid_config", "word_timestamps time audio; codec_tokens output has none")
        for name in ("voice", "speaker", "model", "session_id", "language", "lexicon"):
            value = getattr(self, name)
            if value is not None and len(value) > 256:
                raise ProtocolError("invalid_config", f"{name} is limited to 256 characters")

    @property
    def voice_name(self) -> str | None:
        return self.voice or self.speaker

    @property
    def inline_reference(self) -> bool:
        """The config carries a reference to clone from (vLLM-Omni's Base task fields)."""
        return bool(self.ref_audio or self.ref_text or self.speaker_embedding) or self.x_vector_only_mode is True

    @property
    def language_code(self) -> str:
        """`language` by its canonical name ("English", "en-US" → "en"; engine/languages.py), as the
        segmenter, the normaliser and admission read it; `session.ready` echoes it as sent."""
        return canonical_language(self.language)

    @property
    def omni_timestamps(self) -> bool:
        """Word timings in vLLM-Omni's shape (`audio.chunk`), not as `audio.words` (docs/protocol.md)."""
        if not self.word_timestamps:
            return False
        if self.timestamps_format is None:
            return self.task_type is not None  # only vLLM-Omni's clients send its task_type
        return self.timestamps_format == "vllm_omni"

    @property
    def streamed(self) -> bool:
        """Audio streamed as frames (else one encoded file per utterance)."""
        if self.stream_audio is None:
            return self.response_format in STREAM_FORMATS or self.response_format not in FILE_FORMATS
        return self.stream_audio


def _sent_form(config: type[SessionConfig]) -> type[msgspec.Struct]:
    """The wire form of `session.config`: each field UNSET unless the message sent it, so one decode tells
    both the config and which fields were sent (a resume overrides only those)."""
    fields = [(f.name, f.type | UnsetType, UNSET) for f in msgspec.structs.fields(config)]
    return msgspec.defstruct("ConfigMessage", fields, tag="session.config", tag_field="type",
                             forbid_unknown_fields=False, module=__name__)  # fmt: skip


ConfigMessage = _sent_form(SessionConfig)


def sent_fields(msg: msgspec.Struct) -> dict[str, object]:
    """The fields a decoded `session.config` message set explicitly."""
    return {k: v for k in msg.__struct_fields__ if (v := getattr(msg, k)) is not UNSET}


def config_of(msg: msgspec.Struct) -> SessionConfig:
    """The effective config of a decoded `session.config` message (defaults for what it did not send)."""
    return SessionConfig(**sent_fields(msg))  # type: ignore[arg-type]


# A context's name (docs/protocol.md "Contexts"): echoed in every event of the context, so bounded.
ContextId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class InputText(msgspec.Struct, tag="input.text", tag_field="type"):
    text: str = ""
    context_id: ContextId | None = None


class InputDone(msgspec.Struct, tag="input.done", tag_field="type"):
    context_id: ContextId | None = None


class InputCancel(msgspec.Struct, tag="input.cancel", tag_field="type"):
    context_id: ContextId | None = None  # None: every context's utterances
    # ms of the playing utterance the client's player has played: audio.cancelled then says what was heard
    played_ms: Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None = None


class CancelBody(msgspec.Struct, forbid_unknown_fields=False):
    """The optional JSON body of `POST /v1/sessions/{id}/cancel`: what `input.cancel` may say."""

    played_ms: Annotated[float, msgspec.Meta(ge=0, le=1e9)] | None = None


class SessionClose(msgspec.Struct, tag="session.close", tag_field="type"):
    pass


ClientMessage = ConfigMessage | InputText | InputDone | InputCancel | SessionClose
_decoder = msgspec.json.Decoder(ClientMessage)
KNOWN_TYPES = ("session.config", "input.text", "input.done", "input.cancel", "session.close")


# A lone UTF-16 surrogate escape (\ud800–\udfff): msgspec refuses it, and it is a text problem, not bad JSON.
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def quote(value: object, limit: int = 64) -> str:
    """`value` for an error message: repr'd and cut, so an error never echoes unbounded client input."""
    text = repr(value[: limit + 1] if isinstance(value, str) else value)  # never repr a megabyte
    return text if len(text) <= limit else text[: limit - 1] + "…"


def decode(raw: str) -> ClientMessage:
    """One client message. The size limit is the decoded type's: only a `session.config` (which may
    carry an inline reference clip) may be larger than `MAX_MESSAGE_BYTES`. msgspec decodes without
    recursion limits of Python's own and in well under a millisecond per 100 KiB, so decoding first
    and checking after costs no more than the limit allows."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ProtocolError("message_too_large", f"message of {len(raw)} characters; the limit is {MAX_CONFIG_BYTES}")
    try:
        msg = _decoder.decode(raw)
    except msgspec.ValidationError as e:
        # Known by the message's own `type`, not by msgspec's wording: any other mismatch is in its fields.
        if (kind := _type_of(raw)) is not _NOT_AN_OBJECT and kind not in KNOWN_TYPES:
            raise ProtocolError("unknown_type", f"unknown message type {quote(kind)}; known: {KNOWN_TYPES}") from None
        raise ProtocolError("invalid_message", str(e)[:200]) from None
    except msgspec.DecodeError as e:
        if _SURROGATE.search(raw):
            message = "text holds an invalid UTF-16 surrogate; send whole code points"
            raise ProtocolError("invalid_text", message) from None
        raise ProtocolError("invalid_json", f"message is not valid JSON: {str(e)[:200]}") from None
    except RecursionError:  # msgspec skips unknown fields recursively
        raise ProtocolError("invalid_json", "message nests too deeply") from None
    if not isinstance(msg, ConfigMessage) and len(raw) > MAX_MESSAGE_BYTES:
        kind = type(msg).__struct_config__.tag
        raise ProtocolError(
            "message_too_large", f"{kind} of {len(raw)} characters; the limit is {MAX_MESSAGE_BYTES}"
        )
    return msg


_NOT_AN_OBJECT = object()


def _type_of(raw: str) -> object:
    """The `type` a JSON message names (None: none), or `_NOT_AN_OBJECT`."""
    try:
        obj = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _NOT_AN_OBJECT
    return msgspec.json.decode(obj["type"]) if "type" in obj else None


# -- server events (docs/protocol.md "Server events" lists every field) ----------------------------------
# One Struct per event, tagged on `type`. A field that is UNSET is left out of the JSON: it is sent only
# where it applies (an error's `utterance_index`, a codec mark's `frame_offset`).


class ServerEvent(msgspec.Struct, tag_field="type", kw_only=True):
    context_id: str | UnsetType = UNSET  # the context of the utterance it concerns, when it has one


class SessionReady(ServerEvent, tag="session.ready"):
    session_id: str
    sample_rate: int
    channels: int
    format: str
    voice: str | None
    language: str
    split_granularity: Granularity
    resumed: bool
    next_utterance_index: int
    # {language: voice}: a language the session may speak that its voice cannot, and the voice that speaks
    # it instead (gateway/voices.py voice_switches); absent when the voice speaks every one.
    voice_switches: dict[str, str] | UnsetType = UNSET


class SegmentCommitted(ServerEvent, tag="segment.committed"):
    utterance_index: int
    segment_index: int
    text: str
    start: int
    end: int
    reason: str


class AudioStart(ServerEvent, tag="audio.start", kw_only=True):
    utterance_index: int
    sentence_index: int = 0  # one engine stream per utterance: vLLM-Omni's "sentence" is the utterance
    sample_rate: int
    channels: int = 1
    format: str
    word_timestamps: bool | UnsetType = UNSET  # vLLM-Omni's mark that audio.chunk messages carry the audio


class WordTime(msgspec.Struct):
    """One committed word, as the client wrote it, where it lies in the utterance's text (`char_start`,
    `char_end`: offsets into the text sent, as `segment.committed`'s `start`/`end`) and where its speech
    lies on the utterance's audio clock (docs/protocol.md)."""

    word: str
    start_ms: int
    end_ms: int
    segment_index: int
    char_start: int
    char_end: int


class AudioWords(ServerEvent, tag="audio.words"):
    """Word timings, sent before (or with) the audio that speaks them. `estimated`: not the model's own."""

    utterance_index: int
    words: list[WordTime]
    estimated: bool


class OmniWord(msgspec.Struct):
    word: str
    start_ms: int
    end_ms: int


class AudioChunkMessage(ServerEvent, tag="audio.chunk", kw_only=True):
    """vLLM-Omni's word-timestamp mode: audio as base64 in JSON, the timings in a last, empty chunk."""

    utterance_index: int
    sentence_index: int = 0
    chunk_id: int
    chunk_start_ms: int
    chunk_end_ms: int
    sample_rate: int
    channels: int = 1
    audio_b64: str
    timestamps: list[OmniWord] | None


class AudioMark(ServerEvent, tag="audio.mark"):
    """Where a segment's audio begins: `sample_offset` (PCM) or `frame_offset` (codec_tokens)."""

    utterance_index: int
    segment_index: int
    sample_offset: int | UnsetType = UNSET
    frame_offset: int | UnsetType = UNSET


class AudioWaiting(ServerEvent, tag="audio.waiting"):
    utterance_index: int
    reason: str  # "capacity" (the engine's) or "queue" (admission's)
    ahead: int | None


class AudioDone(ServerEvent, tag="audio.done", kw_only=True):
    utterance_index: int
    sentence_index: int = 0
    total_bytes: int
    error: bool
    timing: Timing


class SessionDone(ServerEvent, tag="session.done"):
    utterance_index: int
    total_sentences: int
    timing: Timing


class AudioCancelled(ServerEvent, tag="audio.cancelled"):
    """No audio of the utterance follows. `cancelled: false`: the cancel came after its audio was all sent
    (nothing was cut; `played_bytes` is the whole)."""

    utterance_index: int | None  # None: a cancel before the session's first utterance
    played_bytes: int
    spoken_text: str
    cancelled: bool = True
    heard_text: str | UnsetType = UNSET  # with the cancel's played_ms: the text heard, cut at a word
    heard_estimated: bool | UnsetType = UNSET  # the cut used estimated word places, not the model's


class CodecStart(ServerEvent, tag="codec.start"):
    utterance_index: int
    codebooks: int
    codebook_size: int
    frame_rate_hz: float
    sample_rate: int
    decoder_id: str
    header_format: str = CODEC_HEADER_FORMAT


class CodecDone(ServerEvent, tag="codec.done"):
    """The utterance's last codec message is sent: `timing` when it ended, `spoken_text` when cancelled (and
    `heard_text`/`heard_estimated` when the cancel carried `played_ms`, as on audio.cancelled)."""

    utterance_index: int
    total_frames: int
    seq_last: int
    error: bool
    cancelled: bool
    timing: Timing | UnsetType = UNSET
    spoken_text: str | UnsetType = UNSET
    heard_text: str | UnsetType = UNSET
    heard_estimated: bool | UnsetType = UNSET


class Error(ServerEvent, tag="error"):
    """`code` is stable; the other fields name what it concerns, where one applies."""

    code: str
    message: str
    utterance_index: int | UnsetType = UNSET
    segment_indexes: list[int] | UnsetType = UNSET
    rejected_chars: int | UnsetType = UNSET
    action: str | UnsetType = UNSET
    bound: str | UnsetType = UNSET
    retry_after_s: float | UnsetType = UNSET
    first_audio_slo_s: float | UnsetType = UNSET  # bound "slo": the target it would have missed …
    predicted_first_audio_s: float | UnsetType = UNSET  # … and when it would have been heard


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def error_event(code: str, message: str, **fields: object) -> Error:
    """An `error` event. The message is cut and stripped of object addresses: errors carry causes from
    deep inside (an engine, the store) and must never echo unbounded input or internals."""
    message = _ADDRESS.sub("", message)
    if len(message) > 300:
        message = message[:299] + "…"
    return Error(code=code, message=message, **fields)  # type: ignore[arg-type]


Event = (SessionReady | SegmentCommitted | AudioStart | AudioMark | AudioWords | AudioChunkMessage | AudioWaiting
         | AudioDone | SessionDone | AudioCancelled | CodecStart | CodecDone | Error)  # fmt: skip
_encoder = msgspec.json.Encoder()


def encode(ev: ServerEvent) -> str:
    """One server event as the JSON text frame the client gets."""
    return _encoder.encode(ev).decode()


# -- codec_tokens binary messages ---------------------------------------------------------------------
# A little-endian header: seq (uint32), n_frames (uint16), flags (uint8); then int16[n_frames × codebooks].
CODEC_HEADER = struct.Struct(CODEC_HEADER_FORMAT)


class CodecFlag(enum.IntFlag):
    EOS = 1  # the utterance's last message
    SEGMENT_END = 2  # closes a segment (a header-only message)
    RESET = 4  # the utterance's first message: reset the decoder
    PRIME = 8  # an ICL clone's reference frames: decode into the decoder's state, play nothing


class CodecHeader(NamedTuple):
    seq: int
    n_frames: int
    flags: CodecFlag


def pack_codec_header(seq: int, n_frames: int, flags: int) -> bytes:
    return CODEC_HEADER.pack(seq, n_frames, flags)


def unpack_codec_header(message: bytes) -> CodecHeader:
    seq, n_frames, flags = CODEC_HEADER.unpack_from(message)
    return CodecHeader(seq, n_frames, CodecFlag(flags))
