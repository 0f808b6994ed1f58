"""The WebSocket wire protocol (DESIGN §5): typed client messages, decoded once at the edge.

A superset of vLLM-Omni's vocabulary; unknown fields are ignored (as vLLM-Omni does) so its clients
work unchanged. Every rejection is a `ProtocolError` with a stable code the client can act on.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from gateway.audio import FILE_FORMATS, STREAM_FORMATS

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # room for an inline base64 reference clip
MAX_MESSAGE_BYTES = 128 * 1024

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
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ProtocolError("invalid_config", "seed must be between 0 and 2**63 - 1")
        for name in ("voice", "speaker", "model", "session_id", "language"):
            value = getattr(self, name)
            if value is not None and len(value) > 256:
                raise ProtocolError("invalid_config", f"{name} is limited to 256 characters")

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
        text = str(e)
        if ("Invalid value" in text and "$.type" in text) or "Object missing required field `type`" in text:
            raise ProtocolError(
                "unknown_type", f"unknown message type {quote(_type_of(raw))}; known: {KNOWN_TYPES}"
            ) from None
        raise ProtocolError("invalid_message", text[:200]) from None
    except msgspec.DecodeError as e:
        if _SURROGATE.search(raw):
            message = "text holds an invalid UTF-16 surrogate; send whole code points"
            raise ProtocolError("invalid_text", message) from None
        raise ProtocolError("invalid_json", f"message is not valid JSON: {str(e)[:200]}") from None
    except RecursionError:  # msgspec skips unknown fields recursively
        raise ProtocolError("invalid_json", "message nests too deeply") from None
    if not isinstance(msg, SessionConfig) and len(raw) > MAX_MESSAGE_BYTES:
        kind = type(msg).__struct_config__.tag
        raise ProtocolError(
            "message_too_large", f"{kind} of {len(raw)} characters; the limit is {MAX_MESSAGE_BYTES}"
        )
    return msg


def explicit_fields(raw: str) -> dict[str, object]:
    """The fields a (valid, already decoded) config message set explicitly: a resume overrides only these."""
    fields = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
    return {k: msgspec.json.decode(v) for k, v in fields.items() if k in SessionConfig.__struct_fields__}


def _type_of(raw: str) -> object:
    try:
        obj = msgspec.json.decode(raw, type=dict[str, msgspec.Raw])
        return msgspec.json.decode(obj["type"]) if "type" in obj else None
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def event(type_: str, **fields: object) -> bytes:
    return msgspec.json.encode({"type": type_, **fields})
