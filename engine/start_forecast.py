"""Admission's forecast: when a waiting stream would start and be heard, from what admission measured.

The policy (engine/fair_queue.py, `FairQueue`) decides who starts and who is refused; this is only the
arithmetic it decides with, kept apart so each can be read alone:
- the measurements: how long an admitted stream holds its slot (`Holds`: a running mean of start to
  end, the rate slots turn over at, and the latest holds themselves, from which a stream in flight's end
  is predicted from how long it has held so far: `end_of`; every stream's, `hold_s`, and per tenant,
  `holds_of`: a stream ends as its own tenant's streams did, since tenants differ in what they send —
  one speaks sentence by sentence, another whole replies), an admitted stream's usual cost, and the
  measured start-to-first-audio times of the streams the first-audio SLO applies to: how long *this
  box* takes to make a stream's first audio, now;
- a stream's own time to first audio (`own_s`) at a given load of the engine: the measured time alone
  (`alone_s`, each measurement divided by the slowdown of the load it started beside, so measurements
  at every load are one number) times that load's slowdown, 1 + `first_audio_load_slowdown` × the
  share of the capacity in flight. `alone_s` is a tail (`first_audio_quantile`) of the recent
  measurements (`first_audio_memory_s`), with the prior counted as `first_audio_prior_weight`
  measurements, and never the single worst of them: a fresh server starts at the prior, one slow
  outlier does not close the door, and the box slowing down (two slow in a row) does;
- all of it per class of voice (`voice`: the engine's `Capacity.voice_class`, "" where it tells none):
  where an engine's voices differ in speed (Piper and Kokoro), one's measurements say nothing of
  another's. A class's prior is the engine's own word on it (`Capacity.first_audio_s`, from its cost
  model, told at each look: `estimates`), else `default_first_audio_s`. The classes measured are
  remembered the latest used first, `first_audio_voices` of them: one forgotten starts at its prior;
- the prediction of a waiting stream's start (`start_at`), and a newcomer's `retry_after_s`.

Pure: no clock of its own (times are passed in), bounded memory (`first_audio_samples` per class,
`first_audio_voices` classes, `hold_samples` holds per `Holds`).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from engine.fair_queue_records import FairQueueConfig

_EPS = 1e-9  # costs are sums of floats: what fits exactly must not be refused by a rounding error


class Holds:
    """How long streams held their slots (start to end, s): a running mean (`default_hold_s` before any
    ended) and the latest `hold_samples` holds, from which a stream in flight's end is predicted."""

    def __init__(self, config: FairQueueConfig) -> None:
        self.config = config
        self.mean_s = config.default_hold_s
        self._latest: deque[float] = deque(maxlen=config.hold_samples)  # in the order seen
        self._sorted: list[float] = []  # the same, sorted (`end_of` bisects it)

    def ended(self, held_s: float) -> None:
        """A stream ended, having held its slot `held_s`. O(hold_samples): per stream end."""
        self.mean_s += self.config.smoothing * (held_s - self.mean_s)
        if len(self._latest) == self._latest.maxlen:  # the oldest leaves both
            del self._sorted[bisect.bisect_left(self._sorted, self._latest[0])]
        self._latest.append(held_s)
        bisect.insort(self._sorted, held_s)

    def end_of(self, started: float, now: float) -> float:
        """When a stream in flight since `started` is predicted to end (not before `now`): as the streams
        that held longer than it has so far did, at their `hold_quantile` (the median: as likely before as
        after). A fresh stream ends as streams usually do; one that has run long is one of the long ones,
        not "any moment now". Before any hold is remembered, the running mean (`default_hold_s` at first)
        after its start; past every hold remembered, any moment now. O(log `hold_samples`)."""
        holds = self._sorted
        if not holds:
            return max(now, started + self.mean_s)
        longer = bisect.bisect_right(holds, now - started)  # the first hold longer than its own so far
        if longer == len(holds):
            return now
        rank = longer + math.ceil(self.config.hold_quantile * (len(holds) - longer)) - 1
        return max(now, started + holds[max(longer, rank)])


# A stream in flight, as a start is predicted behind it: when it started, its cost, and the holds its
# end is predicted from (its tenant's: `StartForecast.holds_of`).
InFlight = tuple[float, float, Holds]


class StartForecast:
    """The running measurements admission predicts with (unit: seconds, and the capacity's cost units)."""

    def __init__(self, config: FairQueueConfig) -> None:
        self.config = config
        self.holds = Holds(config)  # every stream's: the rate slots turn over at
        # Per tenant (key), its own streams' holds, the least lately ended first: bounded by `hold_keys`.
        # A key none of whose streams ended yet has the prior (`default_hold_s`), not another tenant's
        # holds (one speaking short sentences made a burst of another's whole replies look due any
        # moment, and its callers wait, then be refused: tests/gateway/test_overload_slo.py).
        self._by_key: OrderedDict[str, Holds] = OrderedDict()
        self._unmeasured = Holds(config)  # never fed: the prior
        self.cost = 1.0  # a running mean of admitted streams' costs (how many a capacity holds)
        # per class of voice, the latest used last: (when heard, its time to first audio alone), bounded
        self._first_audio: OrderedDict[str, deque[tuple[float, float]]] = OrderedDict()
        self._priors: dict[str, float] = {}  # the engine's word per class (`estimates`), bounded

    # -- measurements -----------------------------------------------------------------------------

    def started(self, cost: float) -> None:
        """A stream of `cost` was admitted."""
        self.cost += self.config.smoothing * (cost - self.cost)

    @property
    def hold_s(self) -> float:
        """A running mean of how long an admitted stream (of any tenant) holds its slot."""
        return self.holds.mean_s

    def ended(self, held_s: float, key: str | None = None) -> None:
        """An admitted stream (of tenant `key`) ended, having held its slot `held_s`."""
        self.holds.ended(held_s)
        if key is None or self.config.hold_keys <= 0:
            return
        holds = self._by_key.pop(key, None)
        if holds is None:
            holds = Holds(self.config)
            while len(self._by_key) >= self.config.hold_keys:
                self._by_key.popitem(last=False)
        holds.ended(held_s)
        self._by_key[key] = holds

    def holds_of(self, key: str) -> Holds:
        """Tenant `key`'s holds: its streams' in flight end as its streams did (none ended: the prior)."""
        return self._by_key.get(key, self._unmeasured)

    def estimates(self, first_audio_s: Iterable[tuple[str, float]]) -> None:
        """The engine's word now on each class's time to first audio alone (`Capacity.first_audio_s`):
        those classes' priors from now on, in place of the last word (the first `first_audio_voices`;
        a value not a positive number of seconds is not believed: `default_first_audio_s`)."""
        priors: dict[str, float] = {}
        for voice, s in first_audio_s:
            if len(priors) >= self.config.first_audio_voices:
                break
            if s > 0 and math.isfinite(s):
                priors[voice] = s
        self._priors = priors

    def heard(self, voice: str, first_audio_s: float, busy: float, now: float) -> None:
        """A stream of class `voice` the SLO applies to was heard `first_audio_s` after it started, at
        `now`, having started beside `busy` (the share of the capacity in flight then, 0 to 1)."""
        samples = self._first_audio.pop(voice, None)
        if samples is None:
            samples = deque(maxlen=self.config.first_audio_samples)
            while len(self._first_audio) >= self.config.first_audio_voices:
                self._first_audio.popitem(last=False)  # the class heard least lately: back to its prior
        samples.append((now, first_audio_s / self.slowdown(busy)))
        self._first_audio[voice] = samples

    @property
    def voices(self) -> list[str]:
        """The classes with a word or a measurement (what /metrics shows), bounded by
        2 × `first_audio_voices`."""
        return sorted({*self._priors, *self._first_audio})

    def samples(self, voice: str = "") -> int:
        """How many start-to-first-audio times of class `voice` are remembered now (recent or not)."""
        return len(self._first_audio.get(voice, ()))

    def prior_s(self, voice: str = "") -> float:
        """Class `voice`'s time to first audio alone before it is measured: the engine's word, or the default."""
        return self._priors.get(voice, self.config.default_first_audio_s)

    def slowdown(self, busy: float) -> float:
        """How much longer than alone a stream takes to its first audio, started beside `busy` of the
        capacity (0 to 1): its first piece shares the workers with the streams in flight."""
        return 1.0 + self.config.first_audio_load_slowdown * min(1.0, max(0.0, busy))

    def alone_s(self, voice: str, now: float) -> float:
        """A stream of class `voice`'s start-to-first-audio time alone on this box, at the tail (the
        module doc)."""
        memory, prior = self.config.first_audio_memory_s, self.prior_s(voice)
        recent = [s for at, s in self._first_audio.get(voice, ()) if now - at <= memory]
        values = sorted(recent + [prior] * self.config.first_audio_prior_weight)
        if not values:
            return prior
        rank = math.ceil(self.config.first_audio_quantile * len(values)) - 1
        return values[max(0, min(rank, len(values) - 2))]  # never the single worst: one outlier is not the box

    def own_s(self, voice: str, busy: float, now: float) -> float:
        """A stream of class `voice`'s start-to-first-audio time, started beside `busy` of the capacity
        (0 to 1)."""
        return self.alone_s(voice, now) * self.slowdown(busy)

    def busy_within(self, voice: str, budget_s: float, now: float) -> float:
        """The most of the capacity (0 to 1, or less than 0: not even alone) that may be in flight as a
        stream of class `voice` starts for it to be heard within `budget_s` of its start."""
        alone, k = self.alone_s(voice, now), self.config.first_audio_load_slowdown
        if budget_s >= alone * (1.0 + k) - _EPS:
            return 1.0
        if alone <= _EPS or k <= 0:  # past the budget alone (or a budget below zero): not even alone
            return -1.0
        return (budget_s / alone - 1.0) / k  # k > 0 here: below the budget at full load, so k is not 0

    # -- predictions ------------------------------------------------------------------------------

    def retry_after_s(self, waiting: int, capacity: float, longest_s: float) -> float:
        """About when a slot is free for a newcomer behind `waiting` streams, at the measured rate at
        which slots free (as many at once as the capacity holds streams of the usual cost). At least
        1 s, at most `longest_s` (the longest wait)."""
        estimate = (waiting + 1) * self.hold_s / max(1.0, capacity / self.cost)
        return min(max(1.0, estimate), longest_s)

    def start_at(self, now: float, need: float, in_flight: Sequence[InFlight]) -> float:
        """When a waiting stream starts that needs `need` more of the capacity than is free now (zero or
        less: now), given the streams in flight (`InFlight`: started at, cost, its tenant's holds).

        Each stream in flight is expected to free its cost when it is predicted to end (`Holds.end_of`:
        from how long it has held already, as its own tenant's streams did), and the streams started in
        its place to free it again a (mean, every stream's) hold later. So a burst admitted together frees
        nothing for a whole hold, and a line of staggered streams frees a slot as each ends: the start is
        the end whose freed cost first covers `need`."""
        if need <= _EPS or not in_flight:
            return now
        ends = sorted((holds.end_of(started, now), cost) for started, cost, holds in in_flight)
        load = sum(cost for _, cost in ends)
        if load <= _EPS:  # free streams in flight: count them instead (each frees one of `need`'s units)
            ends, load = [(end, 1.0) for end, _ in ends], float(len(ends))
        rounds = max(0, math.ceil(need / load - _EPS) - 1)  # whole turnovers of the cost in flight first
        left, freed = need - rounds * load, 0.0
        for end, cost in ends:  # bounded by the streams in flight
            freed += cost
            if freed >= left - _EPS:
                return end + rounds * self.hold_s
        return ends[-1][0] + rounds * self.hold_s
