"""The server's view of the client's player: how much audio it has been sent and not yet played.

Nothing here touches the socket; it is bookkeeping the backlog bound (`max_audio_ahead_s`) and the
underrun metric read.
"""

from __future__ import annotations

import time
import uuid

from engine.listening import ListenerTimeline
from gateway import metrics


class Playback:
    """A simulated client player that starts at the first audio: counts the times it would run dry
    (the server's view of underruns; a real player with a jitter buffer does better)."""

    def __init__(self, count_underruns: bool = True) -> None:
        self.started: float | None = None
        self.queued = 0.0  # seconds of audio sent
        self._count = count_underruns
        # Its name to an engine (StreamRequest.listener): streams opened under one name are heard one after
        # another. A barge-in starts a new one, as the player starts again.
        self.name = uuid.uuid4().hex

    def add(self, seconds: float) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        elif now - self.started > self.queued + 0.02:  # played past what was sent: a gap
            if self._count:
                metrics.UNDERRUNS.inc()
            self.started = now - self.queued  # playback resumes with this chunk
        self.queued += seconds

    def stop(self) -> None:
        """The client stopped playing (a barge-in): it hears nothing now, and starts again at the next audio."""
        self.started = None
        self.queued = 0.0
        self.name = uuid.uuid4().hex

    def timeline(self) -> ListenerTimeline | None:
        """The listener's timeline (time.monotonic): when the audio sent runs out; None while it hears
        none (not started, or played out)."""
        if self.started is None or (at := self.started + self.queued) <= time.monotonic():
            return None
        return ListenerTimeline(at)

    def ahead_s(self) -> float:
        """Seconds of audio sent that the listener has not played yet."""
        heard = self.timeline()
        return 0.0 if heard is None else heard.ahead_s(time.monotonic())
