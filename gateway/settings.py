"""Gateway settings: defaults, then a TOML file, then `VOXGATE_*` environment, then flags.

    [voxgate]                     # voxgate.toml
    host = "127.0.0.1"
    port = 8000
    model = "cpu"
    idle_timeout = 300
    [voxgate.voice_aliases]
    alloy = "joe"

Environment: `VOXGATE_HOST`, `VOXGATE_PORT`, `VOXGATE_MODEL`, `VOXGATE_IDLE_TIMEOUT`, … (a field's
name, upper-cased). Flags win over both.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.connection import Limits


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "cpu"
    engine_options: dict[str, Any] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    voice_aliases: dict[str, str] = field(default_factory=dict)  # e.g. OpenAI names → engine voices


_SCALARS = {f.name: f.type for f in dataclasses.fields(Settings) if f.name in ("host", "port", "model")}
_LIMITS = {f.name: f for f in dataclasses.fields(Limits)}


def _coerce(name: str, value: object, kind: type) -> object:
    try:
        return kind(value)  # type: ignore[call-arg]
    except (TypeError, ValueError):
        raise ValueError(f"setting {name}: {value!r} is not a valid {kind.__name__}") from None


def load_settings(
    path: str | Path | None = None, env: Mapping[str, str] | None = None, **flags: object
) -> Settings:
    """Merge the sources; unknown keys are an error, so a typo never passes silently."""
    env = os.environ if env is None else env
    merged: dict[str, object] = {}
    if path is not None:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        merged.update(doc.get("voxgate", doc))
    for name in [*_SCALARS, *_LIMITS]:
        key = "VOXGATE_" + name.upper()
        if key in env:
            merged[name] = env[key]
    merged.update({k: v for k, v in flags.items() if v is not None})

    scalars: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in merged.items():
        if name in _SCALARS:
            scalars[name] = _coerce(name, value, int if name == "port" else str)
        elif name in _LIMITS:
            limits[name] = _coerce(name, value, type(_LIMITS[name].default))
        elif name in ("engine_options", "voice_aliases"):
            if not isinstance(value, dict):
                raise ValueError(f"setting {name} must be a table")
            extra[name] = dict(value)
        else:
            raise ValueError(f"unknown setting {name!r}")
    return Settings(**scalars, **extra, limits=Limits(**limits))
