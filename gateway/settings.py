"""Gateway settings: defaults, then a TOML file, then `VOXGATE_*` environment, then flags.

    [voxgate]                     # voxgate.toml
    host = "127.0.0.1"
    port = 8000
    model = "cpu"
    idle_timeout = 300
    [voxgate.voice_aliases]       # a client's names → served ones (gateway/aliases.py: the order)
    alloy = "joe"
    [voxgate.model_aliases]
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice" = "qwen"

    [[models]]                    # several models: `model` lists names (default: every [[models]])
    name = "qwen"
    path = "/models/Qwen3-TTS-12Hz-0.6B-CustomVoice"
    options = { max_streams = 16 }
    [[models]]
    name = "fast"
    kind = "piper"
    preload = false               # registered; loaded by POST /v1/admin/models/fast/load

Environment: `VOXGATE_HOST`, `VOXGATE_PORT`, `VOXGATE_MODEL`, `VOXGATE_REDIS_URL`, `VOXGATE_API_KEYS`,
`VOXGATE_INSECURE`, `VOXGATE_TAKEOVER`, `VOXGATE_IDLE_TIMEOUT`, `VOXGATE_ADMIN_SOCKET`, … (a field's name,
upper-cased; booleans true/false/1/0; lists such as `allowed_origins` comma-separated). Flags win over both.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from sessions import ApiKeys


@dataclass(frozen=True, slots=True)
class Limits:
    """A WebSocket connection's bounds and timeouts (docs/protocol.md names what each one does)."""

    config_timeout: float = 10.0
    idle_timeout: float = 300.0
    outbox_frames: int = 256
    send_timeout: float = 10.0
    max_open_utterances: int = 8
    max_contexts: int = 5  # named contexts open at once on one socket (ElevenLabs allows 5)
    poll_interval: float = 0.1  # seconds between idle commits' checks while an utterance is open
    # An open utterance (text, no input.done) quiet this long is finished: its text is spoken and the
    # engine capacity it holds comes back.
    utterance_idle_timeout: float = 30.0
    # ... and quiet this long while other streams wait for admission, if it holds engine capacity.
    utterance_idle_under_pressure: float = 2.0
    max_utterance_chars: int = 256 * 1024  # input.text of one utterance
    # The backlog ahead of the listener: committed text whose audio has not begun, and audio sent but
    # not yet played (at real time). Past either, input.text is refused with `backlog_full`.
    max_backlog_chars: int = 65536  # the `none` mode segmenter holds this much before a forced cut
    max_audio_ahead_s: float = 600.0
    # A lexicon's respellings may make the text spoken at most this many times as long as the text sent,
    # plus respelling_slack_chars (so a short input of abbreviations is still respelled), counted per
    # WebSocket utterance and per HTTP request or batch item: every bound on input text then bounds the
    # text spoken. Past it the text is refused (`respelling_too_long`), never spoken as hours of audio.
    max_respelling_growth: float = 2.0  # respelled characters per character sent
    respelling_slack_chars: int = 64
    # `stream_audio: false` (one file per utterance): the audio an utterance's file may hold before it is
    # sent, made faster than real time and held whole (int16 at 48 kHz: 96 kB/s, 29 MB for 300 s). Past
    # it the rest of the utterance is not made (`file_too_long`), and input.text is refused meanwhile.
    max_file_audio_s: float = 300.0
    # Leading-silence trim of each response's first audio (gateway/timing.py): at most trim_max_ms, and
    # never closer than trim_preroll_ms to the first sample above trim_threshold_dbfs (peak).
    trim_leading_silence: bool = True
    trim_max_ms: int = 300
    trim_threshold_dbfs: float = -45.0
    trim_preroll_ms: int = 15


class ModelSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One `[[models]]` entry: `name`, what to load (`kind`: a backend such as piper or tiny, or `path`:
    a checkpoint directory), the engine's `options`, and whether it loads at start-up (`preload`)."""

    name: str
    kind: str = ""
    path: str = ""
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    preload: bool = True

    @property
    def source(self) -> str:
        """What `load_engine` takes."""
        return self.path or self.kind


_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _model_entry(entry: str, options: dict[str, Any]) -> ModelSpec:
    """A `--model` entry that names no `[[models]]` table: a backend (its name) or a checkpoint path (the
    directory's name), with the `engine_options` table."""
    if "/" in entry or os.sep in entry:
        return ModelSpec(name=Path(entry.rstrip("/" + os.sep)).name or entry, path=entry, options=dict(options))
    return ModelSpec(name=entry, kind=entry, options=dict(options))


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    # The models served, comma-separated, the first the default: backends (cpu, piper, tiny, …), checkpoint
    # paths, or names of `[[models]]` tables (gateway/models.py).
    model: str = "cpu"
    engine_options: dict[str, Any] = field(default_factory=dict)  # for `model` entries without a table
    models: tuple[ModelSpec, ...] = ()  # the TOML file's `[[models]]`
    model_aliases: dict[str, str] = field(default_factory=dict)  # a client's model name → a served one
    # The admin plane (/v1/admin/*, /metrics; docs/models.md): its key (sha256 hex, as tenants' keys are
    # given). Without one it answers only the admin socket, or loopback callers where opted in.
    admin_key: str = ""
    # A Unix socket (mode 0600) served beside host:port that answers the admin plane without a key: only
    # its owner can connect, and no proxy or browser reaches it. Empty: none.
    admin_socket: str = ""
    # A developer's machine: keyless admin for loopback callers on host:port (never a forwarded request,
    # a foreign Origin or Host). Off by default: a proxy or service mesh on the host makes every caller
    # loopback.
    admin_open_loopback: bool = False
    # Browsers (docs/protocol.md "Browsers"): the Origins allowed besides the server's own (the request's
    # Host), comma-separated ("https://app.example.com"), or "*" for any.
    allowed_origins: str = ""
    # Host names (or host:port) answered without a credential — open mode and keyless admin — besides
    # loopback names, comma-separated, or "*": a DNS-rebound name is refused.
    allowed_hosts: str = ""
    # Each model's engine in a supervised child process of its own (engine/process); false: in this one.
    engine_processes: bool = True
    limits: Limits = field(default_factory=Limits)
    voice_aliases: dict[str, str] = field(default_factory=dict)  # a client's voice name → a voice served
    # The shipped aliases (gateway/aliases.py: OpenAI's and Qwen3-TTS's model ids and voice names → the
    # defaults), under the two tables; false: only the tables and the served names are known.
    shipped_aliases: bool = True
    redis_url: str | None = None  # None: the embedded single-process store
    # The store's connections at most (its pool is sized for them: a reconnect storm of 512 sessions needs
    # far fewer, a call holds one ~1 ms); a call waits this long for a free one before its session start
    # (or request) is refused as capacity, `queue_full` (sessions/gate.py). Redis's maxclients bounds
    # replicas × redis_max_connections.
    redis_max_connections: int = 256
    redis_pool_wait_s: float = 5.0
    api_keys: str = ""  # "tenant=<sha256hex>,…" or a JSON file of tenants; empty: open mode
    insecure: bool = False  # allow open mode on a non-loopback address
    takeover: str = "takeover"  # a second connection for a live session: "takeover" or "refuse"
    max_connections: int = 2048  # HTTP + WebSocket connections at once; past it uvicorn answers 503
    # WebSocket sessions open at once on this replica; past it a new one is refused at its handshake with
    # HTTP 503 `replica_full` + Retry-After, which a balancer retries on another replica
    # (gateway/handshake.py). Set it to what the replica was measured to carry (bench/capacity.py);
    # 0: no bound (admission still bounds the streams speaking at once).
    max_sessions: int = 0
    header_timeout: float = 10.0  # a request's headers must arrive within this (slowloris)
    keep_alive_timeout: float = 5.0  # an idle kept-alive HTTP connection is closed after this
    # The event loop: "uvloop" (libuv's, the `fast` extra), "asyncio" (the standard library's), or "auto":
    # uvloop where it is installed. Per audio second at 256 sessions uvloop took 11-18 % off the
    # gateway's CPU (bench/results/capacity_s25.md): the loop's own wake-ups and socket writes are most of
    # what a chunk costs beside the gateway's code.
    event_loop: str = "auto"
    max_voices_per_tenant: int = 1000  # registered voices a tenant may hold …
    max_voice_bytes_per_tenant: int = 64 * 1024 * 1024  # … and their bytes (a compact 30 s clip is ≤ 1.44 MB)
    # Admission (gateway/admission.py): streams start while fewer than the engine's capacity() — at most
    # max_active_streams — are admitted; the rest wait, tenants in turn by weight, within these bounds.
    max_active_streams: int = 64
    max_waiting_per_tenant: int = 64
    max_waiting_per_model: int = 256
    max_queue_wait_s: float = 10.0  # a stream still waiting after this is refused (queue_full, "wait")
    # The next utterance of a session whose listener has less audio than this left goes first in its
    # tenant's line (engine/fair_queue.py: continuations); about the engine's time to first audio.
    continuation_lead_s: float = 2.0
    # The first-audio SLO (docs/admission.md): a stream that would be heard later than this after it asked
    # is refused at once (queue_full, bound "slo"), and a waiting one as soon as it would miss; a voice
    # agent's balancer then sends the call to a replica with room. 0: off (streams wait max_queue_wait_s).
    first_audio_slo_s: float = 1.5
    # On SIGTERM, open utterances get this long to finish before their sockets close (gateway/drain.py).
    drain_grace_s: float = 30.0

    def __post_init__(self) -> None:
        self._check_choices()
        if self.max_active_streams < 1 or self.max_waiting_per_tenant < 0 or self.max_waiting_per_model < 0:
            raise ValueError("setting max_active_streams must be ≥ 1 and the max_waiting_* settings ≥ 0")
        if not 0 < self.max_queue_wait_s <= 3600:
            raise ValueError("setting max_queue_wait_s must be > 0 and at most 3600")
        if self.max_sessions < 0:
            raise ValueError("setting max_sessions must be ≥ 0 (0: no bound)")
        if not 0 <= self.continuation_lead_s <= 600:
            raise ValueError("setting continuation_lead_s must be 0…600 seconds")
        if not 0 <= self.first_audio_slo_s <= 3600:
            raise ValueError("setting first_audio_slo_s must be 0 (off) … 3600 seconds")
        lim = self.limits
        # The trim holds the start of each response up to trim_max_ms + trim_preroll_ms: keep it short.
        if not 0 <= lim.trim_max_ms <= 1000 or not 0 <= lim.trim_preroll_ms <= 100:
            raise ValueError("settings trim_max_ms must be 0…1000 and trim_preroll_ms 0…100")
        if not -120.0 <= lim.trim_threshold_dbfs <= 0.0:
            raise ValueError("setting trim_threshold_dbfs must be -120…0 (dB full scale)")
        digest = self.admin_key.strip().lower().removeprefix("sha256:")
        if digest and not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError("setting admin_key must be the key's sha256 hex digest (64 characters)")
        self._check_browser_lists()
        self.model_specs()  # names, sources and duplicates are checked here, at start-up

    def _check_choices(self) -> None:
        if self.takeover not in ("takeover", "refuse"):
            raise ValueError("setting takeover must be 'takeover' or 'refuse'")
        if self.event_loop not in ("auto", "asyncio", "uvloop"):
            raise ValueError("setting event_loop must be 'auto', 'asyncio' or 'uvloop'")

    def _check_browser_lists(self) -> None:
        for origin in self.origin_list:
            if origin != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s]+", origin):
                raise ValueError(f"setting allowed_origins: {origin[:80]!r} is not scheme://host[:port] or *")
        for host in self.host_list:
            if "/" in host or " " in host:
                raise ValueError(f"setting allowed_hosts: {host[:80]!r} is not a host[:port] or *")

    def model_specs(self) -> list[ModelSpec]:
        """The models to serve, in order (the first is the default)."""
        tables = {m.name: m for m in self.models}
        entries = [e.strip() for e in self.model.split(",") if e.strip()]
        specs = [tables.get(e) or _model_entry(e, self.engine_options) for e in entries]
        if not specs:
            raise ValueError("setting model names no model")
        names = [s.name for s in specs]
        for spec in specs:
            if not _MODEL_NAME.fullmatch(spec.name):
                raise ValueError(f"model name {spec.name[:80]!r}: letters, digits, '.', '_' and '-', at most 64")
            if bool(spec.kind) == bool(spec.path):
                raise ValueError(f"model {spec.name!r}: give one of kind (a backend) or path (a checkpoint)")
            if names.count(spec.name) > 1:
                raise ValueError(f"model {spec.name!r} is named twice")
        return specs

    @property
    def admin_digest(self) -> str:
        return self.admin_key.strip().lower().removeprefix("sha256:")

    @property
    def origin_list(self) -> tuple[str, ...]:
        """`allowed_origins`, lower-cased, without a trailing slash."""
        return tuple(o.strip().lower().rstrip("/") for o in self.allowed_origins.split(",") if o.strip())

    @property
    def host_list(self) -> tuple[str, ...]:
        """`allowed_hosts`, lower-cased."""
        return tuple(h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip())

    def keys(self) -> ApiKeys:
        spec = self.api_keys.strip()
        if spec and Path(spec).is_file():
            return ApiKeys.from_file(spec)
        return ApiKeys.from_spec(spec)


_TABLES = ("engine_options", "voice_aliases", "model_aliases")  # TOML tables only, never from the environment
_LISTS = ("models",)  # TOML arrays of tables ([[models]]), likewise
_COMMA_LISTS = ("allowed_origins", "allowed_hosts")  # strings of comma-separated items, or TOML arrays
_SCALARS = tuple(f.name for f in dataclasses.fields(Settings) if f.name not in (*_TABLES, *_LISTS, "limits"))
_LIMITS = tuple(f.name for f in dataclasses.fields(Limits))


def load_settings(
    path: str | Path | None = None, env: Mapping[str, str] | None = None, **flags: object
) -> Settings:
    """Merge the sources; unknown keys are an error, so a typo never passes silently. Values are
    converted by msgspec (lax: the environment's strings become numbers; booleans are true/false/1/0)
    and checked by the dataclasses' own rules."""
    merged = _merged(path, os.environ if env is None else env, flags)
    _check_shapes(merged)
    if merged.get("models") and "model" not in merged:  # the file's [[models]], all of them, unless told
        merged["model"] = ",".join(str(m.get("name", "")) for m in merged["models"])
    limits = {k: merged.pop(k) for k in _LIMITS if k in merged}
    try:
        return msgspec.convert({**merged, "limits": limits}, Settings, strict=False)
    except msgspec.ValidationError as e:
        message, _, where = str(e).rpartition(" - at `$.")
        if not message:  # a dataclass's own check (__post_init__): its message names the setting
            raise ValueError(str(e)) from None
        name = where.rstrip("`").split(".")[-1]
        raise ValueError(f"setting {name}: {message} (got {merged.get(name, limits.get(name))!r})") from None


def _merged(path: str | Path | None, env: Mapping[str, str], flags: Mapping[str, object]) -> dict[str, object]:
    """The file, then the environment, then the flags (a later source wins)."""
    merged: dict[str, object] = {}
    if path is not None:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        merged.update(doc.get("voxgate", doc))
        if "voxgate" in doc and "models" in doc:  # [[models]] beside a [voxgate] table
            merged.setdefault("models", doc["models"])
    for name in [*_SCALARS, *_LIMITS]:
        key = "VOXGATE_" + name.upper()
        if key in env:
            merged[name] = env[key]
    merged.update({k: v for k, v in flags.items() if v is not None})
    for name in _COMMA_LISTS:  # a TOML array is the same list as the environment's commas
        if isinstance(merged.get(name), list):
            merged[name] = ",".join(str(v) for v in merged[name])  # type: ignore[union-attr]
    return merged


def _check_shapes(merged: Mapping[str, object]) -> None:
    """Every key is a setting, and tables and arrays of tables are what they claim."""
    for name, value in merged.items():
        if name not in (*_SCALARS, *_LIMITS, *_TABLES, *_LISTS):
            raise ValueError(f"unknown setting {name!r}")
        if name in _TABLES and not isinstance(value, dict):
            raise ValueError(f"setting {name} must be a table")
        if name in _LISTS and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
            raise ValueError(f"setting {name} must be an array of tables ([[{name}]])")
