"""What the client sends: voxgate's client messages as `msgspec.Struct`s (docs/protocol.md).

A field left at None is not sent, so the server applies its own default, and an older server never
sees a field it would not know.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Message(msgspec.Struct, tag_field="type", omit_defaults=True, kw_only=True):
    pass


class SessionConfig(Message, tag="session.config"):
    """The session's config (sticky; may be sent again between utterances)."""

    voice: str | None = None
    language: str | None = None
    model: str | None = None
    response_format: str | None = None
    sample_rate: int | None = None
    stream_audio: bool | None = None
    speed: float | None = None
    instructions: str | None = None
    split_granularity: str | None = None  # none / sentence / clause / auto
    session_id: str | None = None  # resume this session
    seed: int | None = None
    word_timestamps: bool | None = None  # audio.words events
    timestamps_format: str | None = None  # "voxgate" (audio.words) or "vllm_omni" (audio.chunk)
    lexicon: str | None = None  # a tenant lexicon's name (PUT /v1/lexicons/{name})
    output_mode: str | None = None  # "pcm" or "codec_tokens"


class InputText(Message, tag="input.text"):
    text: str
    context_id: str | None = None


class InputDone(Message, tag="input.done"):
    context_id: str | None = None


class InputCancel(Message, tag="input.cancel"):
    context_id: str | None = None
    played_ms: float | None = None  # the listener's playback position in the utterance


class SessionClose(Message, tag="session.close"):
    pass


_encoder = msgspec.json.Encoder()
CONFIG_FIELDS = frozenset(f.name for f in msgspec.structs.fields(SessionConfig))


def encode(message: Message, extra: dict[str, Any] | None = None) -> str:
    """The JSON text frame for `message`; `extra` adds fields this client has no name for yet."""
    data = _encoder.encode(message)
    if extra:
        data = _encoder.encode(msgspec.json.decode(data) | extra)
    return data.decode()
