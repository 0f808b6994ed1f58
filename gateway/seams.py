"""What a connection's collaborators (gateway/contexts.py, intake.py, playout.py, pump.py) may see of it.

Each gets these Protocols, never the `Connection` (gateway/connection.py implements them), so this module
imports none of the five and a test builds any collaborator over a small fake. The rule: a collaborator
reaches the client through an `Emitter`, the session through a `SessionView` (the store through its
`Binding`), and the playing order through a `PlayOrder`; anything else is handed to it as a callable.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from engine import Engine, Stream
from gateway.admission import Admission
from gateway.backlog import Backlog
from gateway.outbox import Outbox
from gateway.playback import Playback
from gateway.protocol import ServerEvent, SessionConfig
from gateway.settings import Limits
from gateway.utterance import Utterance
from segmentation.lexicon import Pronunciations
from sessions import StreamSlot, Tenant

Voice = tuple[str | None, dict[str, Any]]  # the engine voice a voice name resolves to, and its stream options


class Emitter(Protocol):
    """The way to the client: typed events (stamped with their utterance's context on the way out) and
    the bounded outbox the audio goes into."""

    outbox: Outbox

    async def emit(self, ev: ServerEvent, audio_of: int | None = None) -> None:
        """Queue `ev`; `audio_of`: the utterance whose audio it carries (a cancel purges it as audio)."""
        ...

    async def error(self, code: str, message: str, **fields: object) -> None:
        """An `error` event (counted by code)."""
        ...

    def stop(self, code: int | None = None, reason: str = "") -> None:
        """End the connection (a client that stopped reading)."""
        ...


class Binding(Protocol):
    """What the collaborators ask of the session in the store (gateway/session_state.py's `SessionBinding`)."""

    tenant: Tenant

    async def acquire_slot(self) -> StreamSlot | None: ...  # the tenant's stream slot, when it has a limit

    def begin(self, utterance: int) -> None: ...  # its audio is about to go out: logged as started

    async def record(self, utterance: int, spoken: str, *, cancelled: bool) -> None: ...  # the spoken log


class SessionView(Protocol):
    """The session as it is now: what session.config set (config, voice, model) and the parts it holds
    for the connection's life (limits, backlog, listener, store binding)."""

    limits: Limits
    backlog: Backlog
    listener: Playback  # the client's player, across utterances
    session: Binding  # the session in the store
    session_id: str
    config: SessionConfig | None  # None until the first session.config is taken
    voice: Voice
    pronunciations: Pronunciations  # the session's lexicon's respellings
    engine: Engine
    admission: Admission | None
    model: str  # the timing histograms' label
    draining: Callable[[], bool]  # the server drains: no new utterance begins

    @property
    def sample_rate(self) -> int: ...

    @property
    def codec_mode(self) -> bool: ...

    def open_stream(self, cfg: SessionConfig, voice: Voice, engine: Engine | None = None,
                    listener: Playback | None = None) -> Stream: ...

    def next_utterance_index(self) -> int: ...


class PlayOrder(Protocol):
    """The order utterances play in (gateway/playout.py's `Playout` is one), as the text intake uses it."""

    playing: deque[Utterance]  # input over, audio still to send, in order

    def reserve(self, utt: Utterance) -> None: ...

    def start(self, utt: Utterance) -> asyncio.Task[None]: ...  # the utterance's pump

    def finished(self, utt: Utterance) -> None: ...

    async def release_slot(self, utt: Utterance) -> None: ...
