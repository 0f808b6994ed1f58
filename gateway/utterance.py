"""One utterance of a connection: the text between its first `input.text` and `input.done`, its engine
stream, and what of it has been committed, sent and heard."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine import Stream
from gateway.playback import Playback
from gateway.words import UtteranceWords
from segmentation import Segment, StreamSegmenter, UtteranceLanguage
from sessions import StreamSlot

if TYPE_CHECKING:
    from gateway.lexicons import Respelled


@dataclass
class Utterance:
    index: int
    segmenter: StreamSegmenter
    stream: Stream | None = None
    segments: list[Segment] = field(default_factory=list)
    engine_segments: list[int] = field(default_factory=list)  # engine append index → our segment
    unheard: dict[int, int] = field(default_factory=dict)  # segment index → characters, until its audio begins
    chars: int = 0  # characters of input.text received
    queue_wait_s: float = 0.0  # how long admission held the utterance before its stream opened
    last_input: float = field(default_factory=time.monotonic)
    sent_bytes: int = 0
    file_s: float = 0.0  # stream_audio false: seconds of audio made and held for its file, not yet sent
    marked: set[int] = field(default_factory=set)
    cancelled: bool = False
    finished: bool = False
    opened_at: float = field(default_factory=time.monotonic)
    engine_at: float | None = None  # when its first text went to the engine (the timing record's start)
    pump: asyncio.Task[None] | None = None
    slot: StreamSlot | None = None  # the tenant's stream slot, when limited
    codec_seq: int = 0  # codec_tokens mode: the next binary message's sequence number
    codec_frames: int = 0
    context_id: str | None = None  # its context (gateway/contexts.py); None: the session's default one
    # Who hears it: the session's player, or its context's own where contexts interleave (set when it is made;
    # None: the session's).
    listener: Playback | None = None
    # Its place in the playing order (gateway/playout.py): `after` is the turn of the utterance begun before
    # it, `turn` its own, done once its audio is all sent (or it is cancelled) and `after` is done.
    after: asyncio.Future[None] | None = None
    turn: asyncio.Future[None] | None = None
    words: UtteranceWords = field(default_factory=UtteranceWords)  # its words on its audio clock
    played_ms: float | None = None  # a cancel's playback position in it (0: queued behind the one playing)
    # The language its segments are read in under `auto`: a segment with no letters ("12.5%。") takes it.
    reading: UtteranceLanguage = field(default_factory=UtteranceLanguage)
    respelled: Respelled | None = None  # its lexicon's growth of its text so far (gateway/lexicons.py)

    def segment_of(self, engine_index: int) -> int | None:
        """Our segment index of the engine's append `engine_index` (None: not one of ours)."""
        return self.engine_segments[engine_index] if engine_index < len(self.engine_segments) else None

    @property
    def text(self) -> str:
        """Every committed segment's text."""
        return "".join(s.text for s in self.segments)

    def heard_fields(self) -> dict[str, object]:
        """audio.cancelled's `heard_text` and `heard_estimated`, when the cancel said how much was played."""
        if self.played_ms is None:
            return {}
        if self.played_ms <= 0:
            return {"heard_text": "", "heard_estimated": False}
        text, estimated = self.words.heard(self.played_ms, [s.text for s in self.segments])
        return {"heard_text": text, "heard_estimated": estimated}

    @property
    def spoken_text(self) -> str:
        """The text of the segments whose audio has begun."""
        return "".join(self.segments[i].text for i in sorted(self.marked))
