"""What the gateway and an engine process say to each other over their zmq socket pair.

Every message is a msgpack header (one of the tagged Structs below) and one raw payload frame right
after it: int16 samples / codes (native order: both ends are one machine) for audio and codec frames,
empty for the rest. So PCM is never packed into msgpack nor pickled, and the frames always come in
(header, payload) pairs: a header that does not decode cannot hide the messages after it. A zmq
multipart message carries one or more pairs in order: the child sends what one turn of its loop made in
one message (at most `MAX_BATCH`), the parent sends one command per message (a header alone). Both
directions are bounded: a stream's audio by its credit window (the child sends at most `WINDOW` audio
events the parent has not yet handed to its consumer), commands by the gateway's own bounds on text and
streams, and the sockets by their high-water marks.

The child's first message, `Hello`, carries `VERSION`; a parent of another version gives the child up
(a child restarted after the code on disk changed under a running gateway speaks another wire).
"""

from __future__ import annotations

import msgspec

from engine.types import StreamRequest

VERSION = 3  # of this wire: raised whenever a message changes shape or meaning
EXIT_UNREADABLE = 3  # the child's exit status when a command from the gateway could not be read
WINDOW = 16  # audio events in flight per stream (child → parent, not yet consumed): ≤ 4 s of CPU audio
CREDIT_BATCH = WINDOW // 2  # the parent gives credit back in batches: one message per 8 events
MAX_BATCH = 256  # messages in one zmq message from the child
HWM = 100_000  # zmq high-water mark, messages, both sockets: far above streams × WINDOW + commands
BEAT_S = 0.1  # the child's heartbeat (capacity, telemetry) period
MEMORY_EVERY_S = 1.0  # the engine's memory() is asked this often (sizes: they change at a load, not a cycle)

Costs = tuple[tuple[str, float], ...]  # engine.types.Capacity's costs, voice_costs and first_audio_s
Classes = tuple[tuple[str, str], ...]  # engine.types.Capacity's language_classes and voice_classes


class _Msg(msgspec.Struct, tag_field="t", array_like=True, frozen=True):
    pass


# ---- parent → child ----


class Open(_Msg, tag="open"):
    sid: int
    request: StreamRequest


class Append(_Msg, tag="append"):
    sid: int
    text: str


class Finish(_Msg, tag="finish"):
    sid: int


class Cancel(_Msg, tag="cancel"):
    sid: int


class Credit(_Msg, tag="credit"):
    sid: int
    n: int


class Check(_Msg, tag="check"):
    rid: int
    request: StreamRequest


class Close(_Msg, tag="close"):
    pass


Command = Open | Append | Finish | Cancel | Credit | Check | Close


# ---- child → parent ----


class Voice(msgspec.Struct, array_like=True, frozen=True):
    name: str
    languages: tuple[str, ...]
    kind: str
    description: str
    extra: dict[str, str]


class Info(msgspec.Struct, frozen=True):
    """What the engine declares once warm (static for the life of the process)."""

    pid: int
    sample_rate: int
    supports_cloning: bool
    voices: list[Voice]
    languages: list[str]
    codec_info: dict[str, str | int | float | bool] | None
    max_pending_chars: int | None
    has_capacity: bool
    warmup_s: float


class Hello(_Msg, tag="hello"):
    version: int  # the child's VERSION, checked by the parent
    pid: int


class Ready(_Msg, tag="ready"):
    info: Info


class Failed(_Msg, tag="failed"):
    """The engine could not be loaded: restarting would not help (a missing model, a bad option)."""

    code: str
    message: str


class Memory(msgspec.Struct, frozen=True, omit_defaults=True):
    """Bytes, None where unknown: the child process's (RSS, torch's CUDA memory on a GPU) and what its engine
    says it holds (`engine.memory()`: weights, KV and slot state). Fixed fields: a report stays bounded."""

    rss_bytes: int | None = None
    torch_allocated_bytes: int | None = None
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    weights_bytes: int | None = None
    kv_bytes: int | None = None
    slot_bytes: int | None = None


class Telemetry(msgspec.Struct, frozen=True, omit_defaults=True):
    """The engine's own measures (`engine.telemetry()`), None where it has none (gateway/engine_report.py)."""

    cycle_seconds: float | None = None
    batch_size: float | None = None
    queue_depth: float | None = None
    slots_in_use: float | None = None
    slots_total: float | None = None


class Beat(_Msg, tag="beat"):
    """Alive, with the engine's capacity (None: it cannot tell), memory and telemetry, every `BEAT_S`."""

    # engine.types.Capacity's fields, in order: streams, active, busy_s, workers, follows_listener, budget,
    # costs, voice_costs, behind_s, first_audio_s, language_classes, voice_classes
    capacity: (
        tuple[int, int, float | None, int, bool, float | None, Costs, Costs, float, Costs, Classes, Classes] | None
    )
    memory: Memory
    telemetry: Telemetry


class Audio(_Msg, tag="audio"):
    sid: int
    sample_rate: int
    first_frame: int
    segment: int  # payload: int16 PCM


class Codec(_Msg, tag="codec"):
    sid: int
    first_frame: int
    segment: int
    prime: bool
    codebooks: int  # payload: int16 codes, [n, codebooks]


class WordsMsg(_Msg, tag="words"):
    sid: int
    segment: int
    sample_rate: int
    words: list[tuple[str, int, int]]  # word, start, end
    estimated: bool


class Wait(_Msg, tag="wait"):
    sid: int
    reason: str
    ahead: int | None


class End(_Msg, tag="end"):
    sid: int
    reason: str
    message: str
    code: str


class Refused(_Msg, tag="refused"):
    """The child's engine refused an append (or the open) the parent had let through."""

    sid: int
    code: str
    message: str


class Checked(_Msg, tag="checked"):
    rid: int
    code: str  # "": the request is fine
    message: str


Event = Hello | Ready | Failed | Beat | Audio | Codec | WordsMsg | Wait | End | Refused | Checked

command_encoder = msgspec.msgpack.Encoder()
command_decoder = msgspec.msgpack.Decoder(Command)
event_encoder = command_encoder
event_decoder = msgspec.msgpack.Decoder(Event)
NO_PAYLOAD = b""  # the payload frame of a message that carries none
