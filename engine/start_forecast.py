"""Admission's forecast: when a waiting stream would start and be heard, from what admission measured.

The policy (engine/fair_queue.py, `FairQueue`) decides who starts and who is refused; this is only the
arithmetic it decides with, kept apart so each can be read alone:
- the measurements: how long an admitted stream holds its slot (`hold_s`, a running mean of start to
  end), an admitted stream's usual cost, and the measured start-to-first-audio times of the streams the
  first-audio SLO applies to, whose tail (`tail_s`) is what the SLO is kept at;
- the prediction of a waiting stream's start (`start_at`), and a newcomer's `retry_after_s`.

Pure: no clock of its own (times are passed in), bounded memory (`samples`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

_EPS = 1e-9  # costs are sums of floats: what fits exactly must not be refused by a rounding error


class StartForecast:
    """The running measurements admission predicts with (unit: seconds, and the capacity's cost units)."""

    def __init__(self, *, hold_s: float, first_audio_s: float, quantile: float, samples: int,
                 smoothing: float) -> None:  # fmt: skip
        self.hold_s = hold_s  # a running mean of how long an admitted stream holds its slot
        self.cost = 1.0  # a running mean of admitted streams' costs (how many a capacity holds)
        self._default_first_audio_s = first_audio_s
        self._quantile = quantile
        self._smoothing = smoothing
        self._first_audio: deque[float] = deque(maxlen=samples)

    # -- measurements -----------------------------------------------------------------------------

    def started(self, cost: float) -> None:
        """A stream of `cost` was admitted."""
        self.cost += self._smoothing * (cost - self.cost)

    def ended(self, held_s: float) -> None:
        """An admitted stream ended, having held its slot `held_s`."""
        self.hold_s += self._smoothing * (held_s - self.hold_s)

    def heard(self, first_audio_s: float) -> None:
        """A stream the SLO applies to was heard `first_audio_s` after it started."""
        self._first_audio.append(first_audio_s)

    @property
    def samples(self) -> int:
        """How many start-to-first-audio times the tail is read from now."""
        return len(self._first_audio)

    def tail_s(self) -> float:
        """The measured start-to-first-audio time at the quantile (the default until measured)."""
        if not self._first_audio:
            return self._default_first_audio_s
        ordered = sorted(self._first_audio)  # bounded by `samples`
        return ordered[min(len(ordered) - 1, math.ceil(self._quantile * len(ordered)) - 1)]

    # -- predictions ------------------------------------------------------------------------------

    def retry_after_s(self, waiting: int, capacity: float, longest_s: float) -> float:
        """About when a slot is free for a newcomer behind `waiting` streams, at the measured rate at
        which slots free (as many at once as the capacity holds streams of the usual cost). At least
        1 s, at most `longest_s` (the longest wait)."""
        estimate = (waiting + 1) * self.hold_s / max(1.0, capacity / self.cost)
        return min(max(1.0, estimate), longest_s)

    def start_at(self, now: float, need: float, in_flight: Sequence[tuple[float, float]]) -> float:
        """When a waiting stream starts that needs `need` more of the capacity than is free now (zero or
        less: now), given the streams in flight as (started at, cost).

        Each stream in flight is expected to free its cost a measured hold after it started (at once
        where it is past that: any moment now), and the streams started in its place to free it again a
        hold later. So a burst admitted together frees nothing for a whole hold, and a line of staggered
        streams frees a slot as each ends: the start is the end whose freed cost first covers `need`."""
        if need <= _EPS or not in_flight:
            return now
        ends = sorted((max(now, started + self.hold_s), cost) for started, cost in in_flight)
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
