"""The records admission's policy (engine/fair_queue.py) keeps and answers with: its knobs
(`FairQueueConfig`), one stream asking to start (`Waiter`), a refusal (`Refused`), and its own bookkeeping of
a tenant's streams (`KeyState`) and a listener's (`ListenerState`). Plain data; the rules that move them are
all in the policy.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from engine.listening import ListenerTimeline

Bound = Literal["tenant", "model", "wait", "slo"]
State = Literal["waiting", "admitted", "finished", "withdrawn", "expired"]


@dataclass(frozen=True, slots=True)
class FairQueueConfig:
    """Every knob of the policy, with its unit and why it has its value."""

    max_waiting_per_key: int = 64  # streams: one tenant's burst cannot fill the line
    max_waiting: int = 256  # streams: the line's memory and the work of a look stay bounded
    max_wait_s: float = 10.0  # s: past this a waiter is refused rather than started late
    # s: a continuation goes first in its key once its listener runs dry within this: about a stream's
    # time from admission to first audio on a busy engine, with a margin.
    continuation_lead_s: float = 2.0
    max_in_flight: int | None = None  # streams admitted at once whatever they cost (None: the cost bounds)
    # s: a stream leading its listener must be heard within this of asking, or is refused (None: off).
    first_audio_slo_s: float | None = None
    # s: until streams were seen to end, how long one holds its slot (Retry-After, the prediction).
    default_hold_s: float = 2.0
    default_stream_s: float = 2.0  # audio s: a stream's expected length until some ended (its charge)
    # streams: the latest holds (start to end) remembered, to predict when a stream in flight ends from
    # how long it has held already (`Holds.end_of`): a few dozen, so the tail is seen; bounded.
    hold_samples: int = 64
    # The quantile of the holds longer than a stream's so far that predicts its end. 0.5: as likely
    # before as after, so a line is neither refused for ends that come sooner nor let wait for ends that
    # come later (the mean alone said "any moment now" of every stream past it, and a stream let wait
    # behind one running long was refused after a wait, not at once: admission_sweep_s26.md).
    hold_quantile: float = 0.5
    # tenants: whose own holds are remembered (a stream in flight ends as its tenant's streams did; the
    # least lately ended forgotten first, and predicted by `default_hold_s` again, as a tenant none of
    # whose streams ended). Bounds the memory: `hold_samples` each.
    hold_keys: int = 256
    # s: the prior of a stream's start-to-first-audio time alone where the engine tells none for its
    # voice (`Capacity.first_audio_s`; a CPU box's first sentence): a fresh server's word until it
    # measured its own, and weighed with its measurements after (below).
    default_first_audio_s: float = 0.5
    # classes of voice (`Capacity.voice_class`) whose first audio is measured apart: an engine's voices
    # differ in speed by class (the CPU voices have two: Piper, Kokoro), so a few; bounded, so no engine
    # can grow the memory. The one heard least lately is forgotten first (back to its prior).
    first_audio_voices: int = 16
    first_audio_quantile: float = 0.95  # the tail of start-to-first-audio the SLO is kept at
    first_audio_samples: int = 64  # the latest measurements that tail is read from: recent, bounded
    # s: measurements older than this are forgotten: the box's speed now (other work on it comes and
    # goes), not an hour ago. A busy server hears a leader every few seconds, so this holds dozens.
    first_audio_memory_s: float = 60.0
    # measurements: the prior counts as this many, so one fast or slow stream does not move a fresh
    # server's forecast by itself, and a few dozen of its own outweigh it.
    first_audio_prior_weight: int = 2
    # ×: how much longer than alone a stream takes to its first audio with the capacity full (1 + this,
    # linear in between): its first piece shares the workers with the pieces of the streams in flight.
    # 1.0: about one other piece ahead of it at full load (the engine runs first pieces first); measured
    # on the loaded box, admitted first audio grew about twofold from one stream to a full engine
    # (bench/results/admission_sweep_s23.md, run 2). 0: first audio does not depend on the load.
    first_audio_load_slowdown: float = 1.0
    max_idle_keys: int = 4096  # idle keys whose service is remembered (keys are configured tenants: few)
    smoothing: float = 0.2  # the newest value's weight in the running means (about the last 5 count)
    # s: while anyone waits, how often the caller looks again (capacity moves as the engine measures its
    # cost; waits expire and SLO refusals come within this of being decided).
    recheck_s: float = 0.1

    def __post_init__(self) -> None:
        if self.max_waiting_per_key < 0 or self.max_waiting < 0 or not self.max_wait_s > 0:
            raise ValueError("waiting bounds must be ≥ 0 and the maximum wait > 0")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("max_in_flight must be ≥ 1")
        if self.first_audio_slo_s is not None and not self.first_audio_slo_s > 0:
            raise ValueError("first_audio_slo_s must be > 0 (None: off)")
        if not 0 < self.first_audio_quantile <= 1 or self.first_audio_samples < 1 or not 0 < self.smoothing <= 1:
            raise ValueError("first_audio_quantile and smoothing must be in (0, 1], first_audio_samples ≥ 1")
        if self.first_audio_voices < 1:
            raise ValueError("first_audio_voices must be ≥ 1")
        if self.hold_samples < 1 or self.hold_keys < 0 or not 0 < self.hold_quantile <= 1:
            raise ValueError("hold_samples must be ≥ 1, hold_keys ≥ 0 and hold_quantile in (0, 1]")
        if not (self.default_first_audio_s > 0 and self.first_audio_memory_s > 0 and self.first_audio_prior_weight >= 0
                and self.first_audio_load_slowdown >= 0):  # fmt: skip
            raise ValueError("default_first_audio_s and first_audio_memory_s must be > 0, the prior's weight and "
                             "the load's slowdown ≥ 0")
        if not self.recheck_s > 0:
            raise ValueError("recheck_s must be > 0")


class Refused(Exception):
    """A waiter not taken: `bound` says which bound refused it; `retry_after_s`: when to try again;
    `predicted_s` (bound "slo"): when it would have been heard, from its asking."""

    def __init__(self, bound: Bound, retry_after_s: float, predicted_s: float | None = None) -> None:
        super().__init__(f"refused by the {bound} bound; retry after {retry_after_s:.1f} s")
        self.bound: Bound = bound
        self.retry_after_s = retry_after_s
        self.predicted_s = predicted_s


@dataclass(eq=False)
class Waiter:
    """One stream asking to start, then (admitted) holding a slot until `finish`."""

    key: str
    enqueued_at: float
    seq: int  # arrival order, across keys
    state: State = "waiting"
    started_at: float | None = None
    served_s: float = 0.0  # audio seconds served so far
    charged_s: float = 0.0  # audio seconds its key's service counts for it (≥ served_s while admitted)
    # A continuation: its listener's timeline (on the policy's clock) as last looked at (None: the
    # listener hears nothing, so this stream leads it).
    timeline: ListenerTimeline | None = None
    cost: float = 1.0  # what it holds of the capacity while admitted (the module doc, costs)
    kind: object = None  # what its cost is re-read by (`recost`)
    voice: str = ""  # its class of voice: whose first audio its own is forecast by (`Capacity.voice_class`)
    listener: object = None  # whose streams it is one of (by identity; None: its own)
    # Admitted beside another stream of its listener (`admit_beside`): it rides that one's slot, until
    # that one ends and it holds the slot itself. `rider` is the reverse link.
    rides: Waiter | None = field(default=None, repr=False)
    rider: Waiter | None = field(default=None, repr=False)
    passed: bool = False  # admitted past the next in fair order, in the room it leaves (`_pass`)
    leads: bool = False  # the first-audio SLO applied to it as it started (the module doc)
    busy: float = 0.0  # the share of the capacity in flight as it started: what slowed its first audio
    heard: bool = False  # its first audio was reported (`heard`)
    refused: Refused | None = None  # why it expired

    @property
    def dry_at(self) -> float | None:
        """When its listener runs out of audio (a continuation is due then); None: it hears none."""
        return None if self.timeline is None else self.timeline.dry_at

    @property
    def waited_s(self) -> float:
        return 0.0 if self.started_at is None else self.started_at - self.enqueued_at


@dataclass(eq=False)
class KeyState:
    """One tenant's (one key's) standing in the queue: its weight, its service so far, its streams."""

    weight: float
    service: float  # audio seconds served / weight
    mean_s: float  # the audio seconds a stream of this key is expected to be served
    waiting: deque[Waiter] = field(default_factory=deque)
    admitted: dict[Waiter, None] = field(default_factory=dict)  # in flight, in order (bounded by the capacity)

    @property
    def in_flight(self) -> int:
        return len(self.admitted)

    def due(self, horizon: float) -> Waiter | None:
        """Its waiting continuation whose listener runs dry soonest, if that is before `horizon`."""
        due = [w for w in self.waiting if w.dry_at is not None and w.dry_at <= horizon]
        return min(due, key=lambda w: (w.dry_at, w.seq)) if due else None

    @property
    def held(self) -> float:
        """The cost of its admitted streams, less those riding another of their listener: a listener's
        two streams hold one slot (a rider's cost is the slot's once it holds it). Summed when asked, so
        a cost re-read or a slot passed on needs no bookkeeping."""
        return sum(w.cost for w in self.admitted if w.rides is None)


@dataclass(eq=False)
class ListenerState:
    """A listener's open streams: admitted (at most two where they ride) and waiting, in arrival order."""

    token: object  # kept, so its id() names it while it is here
    held: list[Waiter] = field(default_factory=list)
    waiting: list[Waiter] = field(default_factory=list)


def check_cost(cost: float) -> float:
    """`cost`, a stream's hold on the capacity: finite and ≥ 0, or ValueError."""
    if not (cost >= 0 and math.isfinite(cost)):
        raise ValueError(f"a cost must be finite and ≥ 0, not {cost!r}")
    return cost
