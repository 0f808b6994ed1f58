"""Checking a stream's options at `open_stream`, with messages that never echo unbounded input.

Options come from clients through the gateway (JSON: any type, any size, NaN); each backend checks its
own, on the caller's thread, so a bad one fails at once as `EngineError("invalid_option", …)` — never
later, deep in a model call, as a crash that closes the socket.
"""

from __future__ import annotations

import math

from engine.types import EngineError

SEED_LIMIT = 2**63  # seeds are 0 … 2**63-1 (what every backend's generator takes)


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


def int_option(value: object, default: int, lo: int, hi: int, name: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineError("invalid_option", f"{name} must be an integer, got {shown(value)}")
    if not lo <= value <= hi:
        raise EngineError("invalid_option", f"{name} must be within {lo}–{hi}, got {shown(value)}")
    return value


def number_option(value: object, default: float, name: str) -> float:
    """A finite real number (not a bool: JSON's true is no speed)."""
    if value is None:
        return default
    number = float(value) if isinstance(value, float) or (isinstance(value, int) and abs(value) < 2**53) else None
    if isinstance(value, bool) or number is None or not math.isfinite(number):
        raise EngineError("invalid_option", f"{name} must be a finite number, got {shown(value)}")
    return number


def seed_option(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise EngineError("invalid_option", f"seed must be an integer within 0–2**63-1, got {shown(value)}")
    return value


def text_option(value: object, name: str, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise EngineError("invalid_option", f"{name} must be a string, got {shown(value)}")
    if len(value) > max_chars:
        raise EngineError("invalid_option", f"{name}: at most {max_chars} characters, got {len(value)}")
    return value
