"""The listener's timeline, and the one first-audio hold rule every engine applies to it.

A listener hears the audio sent to it until it runs out; behind that, audio is queued (made or still
to make). Every scheduling decision is a deadline on this timeline: a piece must come before its
listener runs dry. `ListenerTimeline` is that quantity, on one monotonic clock, for both engines
(engine/qwen3/serving/scheduler.py's Qwen3 streams, engine/cpu/'s CPU voices).

The first-audio hold (`holds_first`): a listener who has started must keep hearing, so a stream's
first audio waits while the rest is predicted to come after its listener needs it: a later start
instead of a gap. Bounded by a cap from when the first audio was ready, and, for a continuation whose
listener still hears the audio before it, by that audio's end: held past it, it makes a gap heard now
for one that may come later. Pure, no clock of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ListenerTimeline:
    """When the audio sent to a listener runs out, and what is queued behind it (monotonic seconds)."""

    runs_out_at: float  # the end of the audio sent (at or before now: it hears nothing now)
    queued_s: float = 0.0  # seconds of audio queued behind it, not sent yet (made, or estimated)

    @classmethod
    def from_buffer(cls, now: float, buffer_s: float | None) -> ListenerTimeline | None:
        """From seconds of audio a listener still has to hear at `now` (None: it hears nothing)."""
        return None if buffer_s is None else cls(now + buffer_s)

    @property
    def dry_at(self) -> float:
        """When the listener runs out if nothing more comes: the audio sent, then the queue."""
        return self.runs_out_at + self.queued_s

    def ahead_s(self, now: float) -> float:
        """Seconds of audio the listener has ahead of `now`, the queue included."""
        return max(0.0, self.dry_at - now)

    def then(self, seconds: float) -> ListenerTimeline:
        """The timeline with `seconds` more queued."""
        return ListenerTimeline(self.runs_out_at, self.queued_s + seconds)

    def start_by(self, run_s: float) -> float:
        """How late a piece that runs `run_s` may start and still come before its listener runs dry."""
        return self.dry_at - run_s

    def after(self, other: ListenerTimeline | None) -> ListenerTimeline:
        """This timeline, played no sooner than `other` has run dry (a continuation plays after the
        audio before it)."""
        if other is None or other.dry_at <= self.runs_out_at:
            return self
        return ListenerTimeline(other.dry_at, self.queued_s)


@dataclass(frozen=True, slots=True)
class HoldRule:
    """The first-audio hold's bounds (each engine sets its own numbers in its config)."""

    cap_s: float  # seconds at most past the first audio being ready
    margin_s: float  # a continuation goes once its listener has less than this left
    tolerance_s: float  # predicted lateness accepted (negative: must be early by that much)


def holds_first(now: float, ready_at: float, late_s: float, before: ListenerTimeline | None, rule: HoldRule) -> bool:
    """Whether a stream's first audio, ready since `ready_at`, stays held at `now`: the rest is predicted
    `late_s` late against its listener's need (past `tolerance_s`), it has not waited `cap_s`, and a
    continuation's listener (hearing the audio before it, `before`, until that runs dry) has more than
    `margin_s` left."""
    if now - ready_at >= rule.cap_s:
        return False
    if before is not None and before.dry_at - now <= rule.margin_s:
        return False
    return late_s > rule.tolerance_s
