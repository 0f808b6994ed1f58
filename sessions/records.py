"""Plain records the store reads and writes (msgspec Structs: typed, cheap to build and compare). In
Redis: JSON for structured fields (its exact text for the spoken log, which the scripts match by prefix),
raw bytes for audio."""

from __future__ import annotations

import json
import struct
import time
from typing import Any, Literal

import msgspec

ControlKind = Literal["cancel", "takeover"]
VoiceKind = Literal["preset", "clone"]


class SpokenEntry(msgspec.Struct, frozen=True):
    """One utterance in the session's capped spoken-text log: started (``finished`` False, no text yet:
    its audio was going out when the entry was made) or finished/cancelled with what was spoken. A
    started entry left behind names an utterance its replica never finished (killed mid-utterance)."""

    utterance_index: int
    text: str
    cancelled: bool
    at_ms: int
    finished: bool = True

    @staticmethod
    def prefix(utterance_index: int) -> str:
        """How every entry of that utterance begins in JSON: the scripts find an entry by it."""
        return f'{{"u": {utterance_index:d}, "f": '

    def to_json(self) -> str:
        # Key order is part of the format: "u" then "f" first (see ``prefix``).
        return json.dumps(
            {"u": self.utterance_index, "f": int(self.finished), "t": self.text, "c": self.cancelled,
             "at": self.at_ms},
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> SpokenEntry:
        d = json.loads(raw)
        return cls(int(d["u"]), d["t"], bool(d["c"]), int(d["at"]), bool(d.get("f", 1)))


class SessionRecord(msgspec.Struct):
    tenant: str
    session_id: str
    config: dict[str, Any]
    voice: str | None
    created_ms: int
    last_seen_ms: int
    next_utterance: int = 0  # the index the next utterance gets, so a resumed session keeps counting
    completed: int = 0
    cancelled: int = 0
    owner_replica: str | None = None
    spoken: list[SpokenEntry] = msgspec.field(default_factory=list)

    def to_fields(self) -> dict[str, str]:
        return {
            "tenant": self.tenant,
            "session_id": self.session_id,
            "config": json.dumps(self.config, ensure_ascii=False),
            "voice": self.voice or "",
            "created_ms": str(self.created_ms),
            "last_seen_ms": str(self.last_seen_ms),
            "next_utterance": str(self.next_utterance),
            "completed": str(self.completed),
            "cancelled": str(self.cancelled),
        }

    @classmethod
    def from_fields(cls, f: dict[bytes, bytes], spoken: list[bytes]) -> SessionRecord:
        s = {k.decode(): v.decode() for k, v in f.items()}
        return cls(
            tenant=s["tenant"],
            session_id=s["session_id"],
            config=json.loads(s.get("config") or "{}"),
            voice=s.get("voice") or None,
            created_ms=int(s.get("created_ms", 0)),
            last_seen_ms=int(s.get("last_seen_ms", 0)),
            next_utterance=int(s.get("next_utterance", 0)),
            completed=int(s.get("completed", 0)),
            cancelled=int(s.get("cancelled", 0)),
            owner_replica=s.get("owner_replica") or None,
            spoken=[SpokenEntry.from_json(e) for e in spoken],
        )


def now_ms() -> int:
    """Wall-clock milliseconds, as records are stamped."""
    return time.time_ns() // 1_000_000


def pack_embedding(values: tuple[float, ...]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def unpack_embedding(raw: bytes) -> tuple[float, ...]:
    return struct.unpack(f"<{len(raw) // 4}f", raw)


class VoiceInfo(msgspec.Struct, frozen=True):
    """What a listing shows: everything but the (possibly large) reference audio and embedding."""

    voice_id: str
    kind: VoiceKind
    name: str
    ref_text: str | None
    metadata: dict[str, Any]
    created_ms: int
    ref_audio_bytes: int
    embedding_dim: int


class Voice(msgspec.Struct, frozen=True):
    """A preset (an engine voice plus settings in ``metadata``) or a cloned voice, which carries reference
    audio (encoded file bytes; format in ``metadata``) and/or a float32 speaker embedding."""

    voice_id: str
    kind: VoiceKind = "clone"
    name: str = ""
    ref_audio: bytes | None = None
    speaker_embedding: tuple[float, ...] | None = None
    ref_text: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    created_ms: int = 0  # set by the store when 0

    def to_fields(self) -> dict[str, bytes | str]:
        return {
            "voice_id": self.voice_id,
            "kind": self.kind,
            "name": self.name or self.voice_id,
            "ref_audio": self.ref_audio or b"",
            "embedding": pack_embedding(self.speaker_embedding) if self.speaker_embedding else b"",
            "ref_text": json.dumps(self.ref_text),
            "metadata": json.dumps(self.metadata, ensure_ascii=False),
            "created_ms": str(self.created_ms),
        }

    @classmethod
    def from_fields(cls, f: dict[bytes, bytes]) -> Voice:
        emb = f.get(b"embedding") or b""
        return cls(
            voice_id=f[b"voice_id"].decode(),
            kind=f[b"kind"].decode(),  # type: ignore[arg-type]
            name=f[b"name"].decode(),
            ref_audio=f.get(b"ref_audio") or None,
            speaker_embedding=unpack_embedding(emb) if emb else None,
            ref_text=json.loads(f.get(b"ref_text") or b"null"),
            metadata=json.loads(f.get(b"metadata") or b"{}"),
            created_ms=int(f.get(b"created_ms") or 0),
        )

    def info(self) -> VoiceInfo:
        return VoiceInfo(
            self.voice_id, self.kind, self.name or self.voice_id, self.ref_text, self.metadata,
            self.created_ms, len(self.ref_audio or b""), len(self.speaker_embedding or ()),
        )


class ControlMessage(msgspec.Struct, frozen=True):
    """A message on a session's control channel. ``target`` is the lease token a takeover is aimed at."""

    kind: ControlKind
    session_id: str
    sender: str  # replica id of the publisher
    sent_ms: int
    target: str | None = None
    utterance_index: int | None = None  # cancel: only this utterance (None: whatever is playing)
    played_ms: float | None = None  # cancel: how much of the playing utterance the client played

    def to_json(self) -> str:
        return json.dumps(
            {"k": self.kind, "s": self.session_id, "from": self.sender, "at": self.sent_ms,
             "target": self.target, "u": self.utterance_index, "p": self.played_ms}
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> ControlMessage:
        d = json.loads(raw)
        played = d.get("p")
        return cls(d["k"], d["s"], d["from"], int(d["at"]), d.get("target"), d.get("u"),
                   float(played) if isinstance(played, int | float) and played >= 0 else None)
