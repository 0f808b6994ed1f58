"""Checking a stream's options at `open_stream`, with messages that never echo unbounded input.

Options come from clients through the gateway (JSON: any type, any size, NaN). `stream_request` checks
them once into a `StreamRequest` (engine/types.py declares the bounds) on the caller's thread, so a bad
one fails at once as `EngineError("invalid_option", …)` — never later, deep in a model call, as a crash
that closes the socket. Each backend then narrows the request to what it serves (`engine.check`).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from engine.languages import canonical_language
from engine.types import EngineError, StreamRequest


def shown(value: object, limit: int = 40) -> str:
    """`value` as an error message may show it: its short repr, else its type and size. (Sizes first:
    repr of a 5000-digit int raises ValueError, and of a huge string costs its length.)"""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"a {type(value).__name__} of {len(value)} characters"
    if isinstance(value, bool | int | float | str | bytes):
        text = repr(value)
        return text if len(text) <= limit else f"a {type(value).__name__} of {len(text)} characters"
    return f"a {type(value).__name__}"


def quote_text(text: str, limit: int = 80) -> str:
    """Committed text named in an error: quoted, cut after `limit` characters (the count says how much)."""
    if not text.strip():
        return ""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return repr(flat)
    return f"{flat[:limit]!r}… ({len(flat)} characters)"


# open_stream's keywords → StreamRequest's fields (the clone's two become one ReferenceClip).
OPTION_NAMES = ("sample_rate", "speed", "seed", "instructions", "output", "ref_audio", "ref_text", "word_timings",
                "phonemes", "listener_buffer_s", "listener", "listener_group")
_CODES = {"voice": "unknown_voice", "language": "unsupported_language"}  # a field's own code; else invalid_option


def stream_request(voice: object, language: object, options: Mapping[str, object]) -> StreamRequest:
    """`open_stream`'s arguments as one checked `StreamRequest`: types strictly (no bools for numbers,
    no strings for ints, no NaN) and the bounds StreamRequest declares. Raises EngineError: the field's
    code (`unknown_voice`, `unsupported_language`) or `invalid_option`, with a message that names the
    field and never echoes unbounded input."""
    unknown = sorted((k for k in options if k not in OPTION_NAMES), key=str)
    if unknown:
        names = [shown(k) for k in unknown[:5]]
        raise EngineError("invalid_option", f"no stream option {names}; known: {OPTION_NAMES}")
    fields: dict[str, object] = {k: v for k, v in options.items() if v is not None and not k.startswith("ref_")}
    # The language's canonical name (engine/languages.py): every engine and admission's costs speak it.
    fields["voice"] = voice
    fields["language"] = (
        "auto" if language is None else canonical_language(language) if isinstance(language, str) else language)
    if options.get("ref_audio") is not None:
        fields["reference"] = {"audio": options["ref_audio"], "text": options.get("ref_text")}
    elif options.get("ref_text") is not None:
        raise EngineError("invalid_option", "ref_text belongs to a cloned voice: send it with ref_audio")
    try:
        return msgspec.convert(fields, StreamRequest)
    except msgspec.ValidationError as e:
        message, _, where = str(e).rpartition(" - at `$.")
        name = where.rstrip("`").split(".")[0]
        if len(message) > 120:  # an enum's message quotes the value given
            message = "Invalid value"
        raise EngineError(_CODES.get(name, "invalid_option"), f"{_OPTION.get(name, name)}: {message}") from None


_OPTION = {"reference": "ref_audio/ref_text"}  # a field's name as open_stream's caller knows it
