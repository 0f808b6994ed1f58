"""The WebSocket wire protocol (DESIGN §5): typed client messages, decoded once at the edge.

A superset of vLLM-Omni's vocabulary; unknown fields are ignored (as vLLM-Omni does) so its clients
work unchanged. Every rejection is a `ProtocolError` with a stable code the client can act on.
"""

from __future__ import annotations

import json
from typing import Literal

import msgspec

from gateway.audio import FILE_FORMATS, STREAM_FORMATS

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # room for an inline base64 reference clip
MAX_MESSAGE_BYTES = 128 * 1024

Granularity = Literal["none", "sentence", "clause", "auto"]


class ProtocolError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class SessionConfig(msgspec.Struct, tag="session.config", tag_field="type", forbid_unknown_fields=False):
    voice: str | None = None
    speaker: str | None = None  # vLLM-Omni's alias of voice
    language: str = "auto"
    model: str | None = None
    response_format: str = "pcm"
    sample_rate: int | None = None
    stream_audio: bool = True
    speed: float = 1.0
    instructions: str | None = None
    split_granularity: Granularity = "auto"
    output_mode: Literal["pcm", "codec_tokens"] = "pcm"  # codec_tokens: frames for on-device decoding
    session_id: str | None = None
    seed: int | None = None

    def validate(self) -> None:
        formats = STREAM_FORMATS if self.stream_audio else FILE_FORMATS
        if self.response_format not in formats:
            how = "streamed (stream_audio=true)" if self.stream_audio else "sent as files (stream_audio=false)"
            raise ProtocolError(
                "unsupported_format", f"response_format {self.response_format!r}: audio {how} is one of {formats}"
            )
        if self.sample_rate is not None and not 8000 <= self.sample_rate <= 48000:
            raise ProtocolError("invalid_config", "sample_rate must be between 8000 and 48000")
        if not 0.25 <= self.speed <= 4.0:
            raise ProtocolError("invalid_config", "speed must be between 0.25 and 4.0")
        if self.instructions is not None and len(self.instructions) > 500:
            raise ProtocolError("invalid_config", "instructions are limited to 500 characters")

    @property
    def voice_name(self) -> str | None:
        return self.voice or self.speaker


class InputText(msgspec.Struct, tag="input.text", tag_field="type"):
    text: str = ""


class InputDone(msgspec.Struct, tag="input.done", tag_field="type"):
    pass


class InputCancel(msgspec.Struct, tag="input.cancel", tag_field="type"):
    pass


class SessionClose(msgspec.Struct, tag="session.close", tag_field="type"):
    pass


ClientMessage = SessionConfig | InputText | InputDone | InputCancel | SessionClose
_decoder = msgspec.json.Decoder(ClientMessage)
KNOWN_TYPES = ("session.config", "input.text", "input.done", "input.cancel", "session.close")


def decode(raw: str) -> ClientMessage:
    limit = MAX_CONFIG_BYTES if '"session.config"' in raw[:256] else MAX_MESSAGE_BYTES
    if len(raw) > limit:
        raise ProtocolError("message_too_large", f"message of {len(raw)} characters; the limit is {limit}")
    try:
        return _decoder.decode(raw)
    except msgspec.ValidationError as e:
        text = str(e)
        if ("Invalid value" in text and "$.type" in text) or "Object missing required field `type`" in text:
            kind = _type_of(raw)
            raise ProtocolError(
                "unknown_type", f"unknown message type {kind!r}; known: {KNOWN_TYPES}"
            ) from None
        raise ProtocolError("invalid_message", text) from None
    except msgspec.DecodeError as e:
        try:
            obj = json.loads(raw)  # stricter than JSON itself: msgspec refuses lone surrogates
        except ValueError:
            raise ProtocolError("invalid_json", f"message is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ProtocolError("invalid_message", "messages must be JSON objects with a type") from None
        raise ProtocolError(
            "invalid_text", "text holds an invalid UTF-16 surrogate; send whole code points"
        ) from None


def _type_of(raw: str) -> object:
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return obj.get("type") if isinstance(obj, dict) else None


def event(type_: str, **fields: object) -> bytes:
    return msgspec.json.encode({"type": type_, **fields})
