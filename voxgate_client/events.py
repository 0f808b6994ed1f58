"""What the server sends, as types: one `msgspec.Struct` per event of voxgate's WebSocket protocol
(docs/protocol.md "Server events"), and `Audio` for its binary frames.

These are the client's own declarations, not the server's (the client never imports the server); a test
checks that the two agree. Decoding is lenient where the protocol grows: unknown fields are ignored, a
field the server leaves out takes its default, and an event type this client does not know yet decodes
to `UnknownEvent` instead of failing, so a newer server never breaks an older client.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Timing(msgspec.Struct, frozen=True):
    """An utterance's timing record (whole milliseconds; None: it did not happen)."""

    queue_wait_ms: int | None = None
    ttfa_ms: int | None = None
    audible_ttfa_ms: int | None = None
    synthesis_ms: int | None = None
    audio_ms: int | None = None
    rtf: float | None = None
    trimmed_ms: int | None = None


class Event(msgspec.Struct, tag_field="type", kw_only=True):
    """A server event. `context_id` is set on the events of a context (several per socket); None without."""

    context_id: str | None = None


class SessionReady(Event, tag="session.ready"):
    session_id: str
    sample_rate: int
    format: str
    channels: int = 1
    voice: str | None = None
    language: str = "auto"
    split_granularity: str = "auto"
    resumed: bool = False
    next_utterance_index: int = 0
    # {language: voice}: languages the session may speak that its voice cannot, and who speaks them instead.
    voice_switches: dict[str, str] = {}


class SegmentCommitted(Event, tag="segment.committed"):
    utterance_index: int
    segment_index: int
    text: str
    start: int = 0
    end: int = 0
    reason: str = ""


class AudioStart(Event, tag="audio.start"):
    utterance_index: int
    sample_rate: int
    format: str = "pcm"
    channels: int = 1
    sentence_index: int = 0
    word_timestamps: bool | None = None  # vLLM-Omni's mode: the audio comes as audio.chunk events


class AudioMark(Event, tag="audio.mark"):
    """Where a segment's audio begins: `sample_offset` (PCM) or `frame_offset` (codec tokens)."""

    utterance_index: int
    segment_index: int
    sample_offset: int | None = None
    frame_offset: int | None = None


class Word(msgspec.Struct, frozen=True):
    """One word (or Han character/word) of the text sent, on the utterance's audio clock. `char_start`,
    `char_end`: where it stands in the utterance's text (None from a server that does not say)."""

    word: str
    start_ms: float
    end_ms: float
    segment_index: int = 0
    char_start: int | None = None
    char_end: int | None = None


class AudioWords(Event, tag="audio.words"):
    """Word timings (with `word_timestamps: true`), sent before or with the audio holding them.
    `estimated`: the model gave no alignment and the times are estimated."""

    utterance_index: int
    words: list[Word] = msgspec.field(default_factory=list)
    estimated: bool = False


class OmniWord(msgspec.Struct, frozen=True):
    word: str
    start_ms: float
    end_ms: float


class AudioChunk(Event, tag="audio.chunk"):
    """vLLM-Omni's word-timestamp shape (`timestamps_format: "vllm_omni"`): audio as base64 in JSON, the
    timings in a last, empty chunk. `Speech` turns its audio into `Audio` items as well."""

    utterance_index: int
    chunk_id: int = 0
    chunk_start_ms: float = 0
    chunk_end_ms: float = 0
    sample_rate: int = 0
    channels: int = 1
    audio_b64: str = ""
    timestamps: list[OmniWord] | None = None
    sentence_index: int = 0


class AudioWaiting(Event, tag="audio.waiting"):
    utterance_index: int
    reason: str = ""
    ahead: int | None = None


class AudioDone(Event, tag="audio.done"):
    utterance_index: int
    total_bytes: int = 0
    error: bool = False
    timing: Timing | None = None
    sentence_index: int = 0


class SessionDone(Event, tag="session.done"):
    """The utterance is complete."""

    utterance_index: int
    total_sentences: int = 0
    timing: Timing | None = None


class AudioCancelled(Event, tag="audio.cancelled"):
    """The answer to a cancel: no audio of the utterance follows it. `cancelled: false`: its audio had all
    been sent already. `heard_text`: with a `played_ms` in the cancel, the text heard up to there."""

    utterance_index: int | None
    played_bytes: int = 0
    spoken_text: str = ""
    cancelled: bool = True
    heard_text: str | None = None
    heard_estimated: bool | None = None  # the cut used estimated word places, not the model's


class CodecStart(Event, tag="codec.start"):
    utterance_index: int
    codebooks: int
    codebook_size: int
    frame_rate_hz: float
    sample_rate: int
    decoder_id: str = ""
    header_format: str = "<IHB"


class CodecDone(Event, tag="codec.done"):
    """The utterance's last codec message; when cancelled with a `played_ms`, `heard_text` as on
    audio.cancelled."""

    utterance_index: int
    total_frames: int = 0
    seq_last: int = 0
    error: bool = False
    cancelled: bool = False
    timing: Timing | None = None
    spoken_text: str | None = None
    heard_text: str | None = None
    heard_estimated: bool | None = None


class Error(Event, tag="error"):
    """`code` is stable; the other fields name what it concerns, where one applies."""

    code: str
    message: str = ""
    utterance_index: int | None = None
    segment_indexes: list[int] | None = None
    rejected_chars: int | None = None
    action: str | None = None
    bound: str | None = None
    retry_after_s: float | None = None
    first_audio_slo_s: float | None = None  # bound "slo": the first-audio target it would have missed
    predicted_first_audio_s: float | None = None  # when the server predicted it would have been heard


class UnknownEvent(msgspec.Struct, kw_only=True):
    """An event of a type this client does not know (a newer server): its `type` and raw fields."""

    type: str
    fields: dict[str, Any]
    context_id: str | None = None


class Audio(msgspec.Struct, kw_only=True):
    """One binary frame: audio of the utterance whose `audio.start` (or `codec.start`) came last.
    `offset` is the byte offset of `data` in that utterance's audio."""

    data: bytes
    utterance_index: int | None = None
    context_id: str | None = None
    offset: int = 0


ServerEvent = (SessionReady | SegmentCommitted | AudioStart | AudioMark | AudioWords | AudioChunk | AudioWaiting
               | AudioDone | SessionDone | AudioCancelled | CodecStart | CodecDone | Error)  # fmt: skip
EVENT_TYPES: dict[str, type[Event]] = {t.__struct_config__.tag: t for t in ServerEvent.__args__}  # type: ignore[attr-defined]
_decoder = msgspec.json.Decoder(ServerEvent)


def decode_event(raw: str | bytes) -> Event | UnknownEvent:
    """One JSON text frame from the server. Raises `msgspec.DecodeError` for text that is not JSON, and
    `msgspec.ValidationError` for a known event missing what it must have."""
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError:
        fields = msgspec.json.decode(raw)
        if not isinstance(fields, dict) or fields.get("type") in EVENT_TYPES:
            raise
        context_id = fields.get("context_id")
        return UnknownEvent(type=str(fields.get("type")), fields=fields,
                            context_id=context_id if isinstance(context_id, str) else None)  # fmt: skip
