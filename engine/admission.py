"""Which waiting stream starts next when an engine has room: weighted fairness between keys (tenants).

Pure policy, no asyncio and no clock of its own (the caller injects one), so every rule is tested with
a fake clock (tests/engine/test_admission.py); gateway/admission.py puts it on the event loop.

The rules (tts-pool's design):
- one FIFO queue per key; a key's `service` is the audio seconds its streams were served, divided by its
  weight: the key with the least service goes first, so under saturation keys are served in proportion
  to their weights. A stream is charged its key's mean stream length when it starts, and the account is
  corrected as its audio is served and when it ends: otherwise several slots freeing at once would all
  go to whichever key looked cheapest before any of them had made a sound;
- a key that enters (nothing waiting or in flight) starts at the current minimum service of the keys
  already active: idle time banks no credit, and a newcomer cannot starve the others by starting at 0.
  A key coming back keeps its own service when that is higher: a burst of service is not forgiven by
  a moment of idleness (as in weighted fair queueing: max(own, minimum));
- a soft in-flight preference: a key holding its weighted share of the capacity in flight yields to
  keys below theirs (service is only counted as audio is served, so a key whose long streams have just
  started would otherwise look cheap), but takes a free slot that nobody below their share wants —
  capacity is never left idle while anyone waits;
- continuations: a stream that continues a listener already hearing speech (the next utterance of
  a session whose audio still plays) waits in its key's line like any other until its listener is about
  to run dry (`continue_by` within `continuation_lead_s`); then it goes before the rest of its key's
  line, and its key before the other keys in the same place of the order (below or at their share). A
  listener who has started hearing speech must keep hearing it (issue 14), but not past the weights: a
  tenant whose own listeners need more than its share hears its newcomers wait, or be refused, first;
- a listener's next stream starts beside its current one (`admit_beside`): a client sending sentence
  by sentence has its next sentence waiting while the one before is made, and a listener, however
  many of its utterances are open, hears one at a time: its slot covers the one it hears and the
  next, even past the capacity. The gateway asks it only of an engine that makes the next one due
  when the one before will have played (`Capacity.follows_listener`, `StreamRequest.listener`: the
  CPU voices), not of one that would run both at once (the Qwen3 core). Given a slot only when
  the stream before ended, a short sentence's successor had that sentence's fraction of a second to
  make its first audio on a busy engine: a gap (issue 14). A listener has at most two streams
  admitted so; its key's share counts the two as one slot, and past that share while another key waits the next
  stream waits in fair order. When a stream ends while the next of its listener still waits, that one
  takes the slot (`hand_over`) on the same terms. And a listener whose streams have all ended while
  their audio still plays (a Piper sentence is made in a tenth of the time it plays) takes the slot
  back for its next stream as that asks (`take_back`), on the same terms. Given only the room left in
  fair order, an English sentence waited 3 s behind a Mandarin listener's two streams, a second past
  its listener running dry; started only once due (2 s ahead), its first audio still came 0.16 s late
  on a busy engine (issue 14, `sentence` mode at 0.5 replies/s). The engine makes it due when the
  audio before will have played, so starting it early costs newcomers only the room it holds;
- costs: a stream costs what the engine spends to keep it ahead of its listener, in the capacity's
  units (`Waiter.cost`; 1 each where the engine counts streams). A waiter starts while the cost in flight
  and its own fit the capacity (one always starts when nothing is in flight), and shares are shares of
  that cost. The CPU voices' Kokoro costs about ten Piper streams: counted as streams at their mixed
  real-time factor, an English sentence waited out a whole Mandarin stream beside which it fitted many
  times over (issue 14). The next in fair order waits for its room, and a cheaper one behind it
  passes it only in the room it leaves (backfilling with a reservation): the streams that passed it
  and the newcomer, with its own cost, must fit the capacity. So it starts once the streams it waited
  for have ended, however many cheap ones keep coming (passing it freely would starve costly
  streams), and meanwhile an English reply is not held behind a Mandarin one it fits beside: on
  `cpu` at 1 reply/s, English replies had waited 9 s (p50) in a mixed line. A key at its share passes
  nobody while another key waits. A waiter's `kind` says what it is (the gateway: its
  language and voice), and `recost` re-reads every waiter's cost by it, those in flight too: a cost is
  measured and moves (a busier box slows every voice), and a stream held at what it cost when it was
  admitted would let newcomers in on top of it. `max_in_flight` bounds the count beside the cost;
- bounds: waiters per key, waiters in all (the model), and a maximum wait past which a waiter is
  refused (bound "wait") rather than started late.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Bound = Literal["tenant", "model", "wait"]
State = Literal["waiting", "admitted", "finished", "withdrawn", "expired"]

# Until streams have been seen to finish: the expected hold of a slot (for Retry-After) and the audio
# a stream is expected to be served (its charge when it starts).
DEFAULT_HOLD_S = 2.0
DEFAULT_STREAM_S = 2.0
MAX_IDLE_KEYS = 4096  # idle keys whose service is remembered (keys are configured tenants: few)
SMOOTHING = 0.2  # weight of the newest value in the running means
EPS = 1e-9  # costs are sums of floats: what fits exactly must not be refused by a rounding error
# A continuation is due once its listener would run dry within this long (the default of the
# `continuation_lead_s` setting): about what a stream takes from admission to its first audio on a busy
# engine, with a margin.
CONTINUATION_LEAD_S = 2.0


class Refused(Exception):
    """A waiter not taken: `bound` says which bound refused it; `retry_after_s`: when to try again."""

    def __init__(self, bound: Bound, retry_after_s: float) -> None:
        super().__init__(f"refused by the {bound} bound; retry after {retry_after_s:.1f} s")
        self.bound: Bound = bound
        self.retry_after_s = retry_after_s


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
    continue_by: float | None = None  # a continuation: when its listener runs out of audio (clock time)
    cost: float = 1.0  # what it holds of the capacity while admitted (the module doc, costs)
    kind: object = None  # what its cost is re-read by (`recost`)
    # Admitted beside another stream of its listener (`admit_beside`): it rides that one's slot, until
    # that one ends and it holds the slot itself. `rider` is the reverse link.
    rides: Waiter | None = field(default=None, repr=False)
    rider: Waiter | None = field(default=None, repr=False)
    passed: bool = False  # admitted past the next in fair order, in the room it leaves (`_pass`)

    @property
    def waited_s(self) -> float:
        return 0.0 if self.started_at is None else self.started_at - self.enqueued_at


@dataclass(eq=False)
class _Key:
    weight: float
    service: float  # audio seconds served / weight
    mean_s: float  # the audio seconds a stream of this key is expected to be served
    waiting: deque[Waiter] = field(default_factory=deque)
    admitted: dict[Waiter, None] = field(default_factory=dict)  # in flight, in order (bounded by the capacity)

    @property
    def in_flight(self) -> int:
        return len(self.admitted)

    @property
    def held(self) -> float:
        """The cost of its admitted streams, less those riding another of their listener: a listener's
        two streams hold one slot, the one it hears (a rider's cost is the slot's once it holds it).
        Summed when asked, so a cost re-read (`recost`) or a slot passed on needs no bookkeeping."""
        return sum(w.cost for w in self.admitted if w.rides is None)


class FairQueue:
    def __init__(
        self,
        *,
        max_waiting_per_key: int,
        max_waiting: int,
        max_wait_s: float,
        clock: Callable[[], float],
        continuation_lead_s: float = CONTINUATION_LEAD_S,
        max_in_flight: int | None = None,
    ) -> None:
        """`max_in_flight`: the most streams admitted at once whatever they cost (None: the capacity's
        cost alone bounds them)."""
        if max_waiting_per_key < 0 or max_waiting < 0 or not max_wait_s > 0:
            raise ValueError("waiting bounds must be ≥ 0 and the maximum wait > 0")
        if max_in_flight is not None and max_in_flight < 1:
            raise ValueError("max_in_flight must be ≥ 1")
        self.max_waiting_per_key = max_waiting_per_key
        self.max_waiting = max_waiting
        self.max_wait_s = max_wait_s
        self.continuation_lead_s = continuation_lead_s
        self.max_in_flight = max_in_flight
        self._clock = clock
        self._keys: dict[str, _Key] = {}  # active keys only (waiting or in flight): bounded by the tenants
        self._idle: OrderedDict[str, float] = OrderedDict()  # an idle key's service, oldest first
        self._floor = 0.0  # the minimum service when no key is active
        self._seq = itertools.count()
        self._waiting = 0
        self._in_flight = 0
        self._cost = 1.0  # a running mean of admitted streams' costs (how many a capacity holds)
        self._hold_s = DEFAULT_HOLD_S
        self._stream_s = DEFAULT_STREAM_S  # every key's streams: a newcomer's first estimate

    # -- state ------------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def load(self) -> float:
        """The cost of the streams in flight, in the capacity's units (summed: bounded by the streams)."""
        return sum(w.cost for k in self._keys.values() for w in k.admitted)

    def fits(self, cost: float, capacity: float) -> bool:
        """Whether a stream of `cost` has room now: it fits the capacity beside the cost in flight, or
        nothing is in flight (one stream always has room: never a deadlock), within `max_in_flight`."""
        if self._in_flight == 0:
            return True
        if self.max_in_flight is not None and self._in_flight >= self.max_in_flight:
            return False
        return self.load + cost <= capacity + EPS

    def service(self, key: str) -> float | None:
        """The key's weighted service, while it is active (None: idle)."""
        k = self._keys.get(key)
        return None if k is None else k.service

    def ahead(self, waiter: Waiter) -> int:
        """Waiters that arrived before this one (an estimate of who goes first: fairness may reorder)."""
        return sum(1 for k in self._keys.values() for w in k.waiting if w.seq < waiter.seq)

    def retry_after(self, capacity: float) -> float:
        """About when a slot is free for a newcomer: everyone waiting, then it, at the measured rate at
        which slots free (as many at once as the capacity holds streams of the usual cost). At least
        1 s, at most the maximum wait."""
        estimate = (self._waiting + 1) * self._hold_s / max(1.0, capacity / self._cost)
        return min(max(1.0, estimate), self.max_wait_s)

    # -- transitions ------------------------------------------------------------------------------

    def push(self, key: str, weight: float, capacity: float, *, continue_by: float | None = None,
             cost: float = 1.0, kind: object = None) -> Waiter:
        """A stream for `key` asks to start: admitted at once while there is room and nobody waits,
        else queued; raises Refused("tenant" | "model") when it would wait past a bound. `continue_by`:
        it continues a listener already hearing speech, whose audio runs out then (the module doc);
        `cost`: what it holds of `capacity`, and `kind` what `recost` re-reads it by (the module doc)."""
        if not weight > 0:
            raise ValueError("a weight must be > 0")
        _check_cost(cost)
        k = self._keys.get(key)
        room = self.fits(cost, capacity) and not self._waiting
        if not room and k is not None and len(k.waiting) >= self.max_waiting_per_key:
            raise Refused("tenant", self.retry_after(capacity))
        if not room and self._waiting >= self.max_waiting:
            raise Refused("model", self.retry_after(capacity))
        if k is None:
            # A key entering starts level with the least-served active key: no credit for idle time.
            floor = min((a.service for a in self._keys.values()), default=self._floor)
            k = self._keys[key] = _Key(weight, max(floor, self._idle.pop(key, floor)), self._stream_s)
        k.weight = weight  # the configuration's latest word
        now = self._clock()
        waiter = Waiter(key, now, next(self._seq), continue_by=continue_by, cost=cost, kind=kind)
        k.waiting.append(waiter)
        self._waiting += 1
        if room:
            self._start(capacity, now)  # it alone waits: it starts, having waited 0 s
        return waiter

    def recost(self, cost_of: Callable[[object], float]) -> None:
        """Every waiter's cost as it is now, by its `kind`: waiting, and in flight (a key's share and the
        load follow). Bounded by the waiters and the streams in flight."""
        for k in self._keys.values():
            for w in itertools.chain(k.waiting, k.admitted):
                w.cost = _check_cost(cost_of(w.kind))

    def grant(self, capacity: float) -> list[Waiter]:
        """Start waiters while they fit the capacity, in fair order; returns them."""
        return self._start(capacity, self._clock())

    def _start(self, capacity: float, now: float) -> list[Waiter]:
        started: list[Waiter] = []
        while self._waiting:
            k, waiter = self._next(capacity, now)
            # The next in fair order waits for its room; others pass it only in the room it leaves.
            if not self.fits((head := waiter or k.waiting[0]).cost, capacity):
                started += self._pass(head, capacity, now)
                break
            if waiter is None:
                waiter = k.waiting.popleft()
            else:  # its listener is about to run dry: before the rest of its key's line
                k.waiting.remove(waiter)  # bounded by the per-key bound
            self._admit(k, waiter, now)
            started.append(waiter)
        return started

    def _pass(self, head: Waiter, capacity: float, now: float) -> list[Waiter]:
        """While `head` (the next in fair order) waits for its room: admit those behind it, in fair order
        (a key's line in its order), that fit now and in what `head` leaves of the capacity beside the
        streams that passed before (the module doc, costs). One pass: bounded by the waiters."""
        room = capacity - head.cost - sum(w.cost for k in self._keys.values() for w in k.admitted if w.passed)
        if room <= EPS:
            return []
        total = self._total_weight()
        waiting = [(self._at_share(k.held, k, capacity, total), k) for k in self._keys.values() if k.waiting]
        passed: list[Waiter] = []
        for at_share, k in sorted(waiting, key=lambda e: (e[0], e[1].service, e[1].waiting[0].seq)):
            if at_share and len(waiting) > 1:
                continue  # at its share while another key waits: it takes no room ahead of anyone
            line, k.waiting = k.waiting, deque()
            for w in line:
                if w is not head and w.cost <= room + EPS and self.fits(w.cost, capacity):
                    self._admit(k, w, now)
                    w.passed, room = True, room - w.cost
                    passed.append(w)
                else:
                    k.waiting.append(w)
        return passed

    def _admit(self, k: _Key, waiter: Waiter, now: float) -> None:
        """`waiter`, out of its key's line, takes a slot."""
        self._waiting -= 1
        k.admitted[waiter] = None
        self._in_flight += 1
        self._cost += SMOOTHING * (waiter.cost - self._cost)
        waiter.state, waiter.started_at = "admitted", now
        waiter.charged_s = k.mean_s
        k.service += k.mean_s / k.weight

    def admit_beside(self, holder: Waiter, successor: Waiter, capacity: float) -> bool:
        """The next stream of a listener whose one stream `holder` is admitted starts at once beside it,
        riding its slot, past `capacity` if need be (the module doc, a listener's next stream), unless its
        key holds its weighted share with other slots while another key waits. False, and nothing
        changes, when it may not, or unless `holder` is admitted alone (no rider, riding none) and
        `successor` waits in its key."""
        if not self._passes(holder, successor, capacity) or holder.rides is not None or holder.rider is not None:
            return False
        k = self._keys[holder.key]
        k.waiting.remove(successor)  # bounded by the per-key bound
        self._admit(k, successor, self._clock())
        successor.rides, holder.rider = holder, successor
        successor.passed = holder.passed  # its slot's: room a waiter ahead left stays counted so
        return True

    def hand_over(self, waiter: Waiter, successor: Waiter, capacity: float) -> bool:
        """An admitted waiter's stream ended while the next stream of the same listener waits: that one
        takes its slot at once, due or not (the module doc, continuations), on `admit_beside`'s terms."""
        if not self._passes(waiter, successor, capacity):
            return False
        k = self._keys[waiter.key]
        k.waiting.remove(successor)  # bounded by the per-key bound
        self._admit(k, successor, self._clock())  # before the finish, which would forget an idle key
        successor.passed = waiter.passed
        self.finish(waiter)
        return True

    def take_back(self, waiter: Waiter, capacity: float) -> bool:
        """A waiting continuation (its listener hears speech, or has heard it and run dry) whose listener
        holds no stream (the caller knows) starts at once, past `capacity` if need be: the slot its
        listener's streams left as their audio was made, not as it was heard (the module doc), on
        `admit_beside`'s terms. False, and nothing changes, when it may not."""
        k = self._keys.get(waiter.key)
        if waiter.state != "waiting" or waiter.continue_by is None or k is None or self._yields(k, 0.0, capacity):
            return False
        k.waiting.remove(waiter)  # bounded by the per-key bound
        self._admit(k, waiter, self._clock())
        return True

    def _passes(self, holder: Waiter, successor: Waiter, capacity: float) -> bool:
        """Whether `holder`'s slot may serve `successor` too (the same key; `holder` admitted, `successor`
        waiting): not while its key holds its share with its other slots and another key waits."""
        if holder.state != "admitted" or successor.state != "waiting" or successor.key != holder.key:
            return False
        return not self._yields(self._keys[holder.key], holder.cost, capacity)

    def _yields(self, k: _Key, riding: float, capacity: float) -> bool:
        """Whether `k` holds its share with its slots but the one being passed on (`riding`, of its held
        cost) while another key waits: then a listener's slot serves its next stream only in fair order."""
        others_wait = any(o.waiting for o in self._keys.values() if o is not k)
        return others_wait and self._at_share(k.held - riding, k, capacity)

    def _total_weight(self) -> float:
        return sum(k.weight for k in self._keys.values())

    def _at_share(self, held: float, k: _Key, capacity: float, total: float | None = None) -> bool:
        """Whether holding `held` of the capacity, `k` holds its share while other keys want room: its
        weighted share of the capacity among the active keys. Counted in streams of one each, a share of
        3.3 lets a key hold 4 (or the heavier key would lose the fraction): it is below its share while
        it holds less."""
        total = self._total_weight() if total is None else total
        return held >= capacity * k.weight / total - EPS

    def _next(self, capacity: float, now: float) -> tuple[_Key, Waiter | None]:
        """The key that starts a stream next, and its due continuation (None: its line's head goes)."""
        total = self._total_weight()
        due = {name: _due(k, now + self.continuation_lead_s) for name, k in self._keys.items() if k.waiting}

        def order(name: str) -> tuple[bool, bool, float, int]:
            k = self._keys[name]
            return (self._at_share(k.held, k, capacity, total), due[name] is None, k.service, k.waiting[0].seq)

        name = min(due, key=order)
        return self._keys[name], due[name]

    def expire(self) -> list[Waiter]:
        """Remove and return the waiters past the maximum wait: they are refused with bound "wait"."""
        now, gone = self._clock(), []
        for name, k in list(self._keys.items()):
            while k.waiting and now - k.waiting[0].enqueued_at > self.max_wait_s:  # FIFO: the oldest first
                waiter = k.waiting.popleft()
                waiter.state = "expired"
                self._waiting -= 1
                gone.append(waiter)
            self._drop_if_idle(name, k)
        return gone

    def relisten(self, waiter: Waiter, continue_by: float | None) -> None:
        """Where a waiter's listener is now: it began hearing speech (a continuation from now on), or
        runs dry at another time. A listener that has run dry (None) leaves a continuation one, due at
        once: its gap has begun. Only a waiting one changes."""
        if waiter.state == "waiting" and continue_by is not None:
            waiter.continue_by = continue_by

    def withdraw(self, waiter: Waiter) -> None:
        """A waiter that gave up (its client cancelled). An admitted one is finished instead."""
        if waiter.state == "admitted":
            self.finish(waiter)
            return
        if waiter.state != "waiting":
            return
        k = self._keys[waiter.key]
        k.waiting.remove(waiter)  # bounded by the per-key bound
        waiter.state = "withdrawn"
        self._waiting -= 1
        self._drop_if_idle(waiter.key, k)

    def served(self, waiter: Waiter, audio_s: float) -> None:
        """Audio seconds sent for an admitted waiter's stream: the fairness account."""
        if waiter.state != "admitted" or audio_s <= 0:
            return
        k = self._keys[waiter.key]
        waiter.served_s += audio_s
        if waiter.served_s > waiter.charged_s:  # longer than expected: the rest is counted as it comes
            k.service += (waiter.served_s - waiter.charged_s) / k.weight
            waiter.charged_s = waiter.served_s

    def finish(self, waiter: Waiter) -> None:
        """An admitted waiter's stream has ended: its slot is free. Idempotent."""
        if waiter.state != "admitted":
            return
        waiter.state = "finished"
        k = self._keys[waiter.key]
        del k.admitted[waiter]
        self._in_flight -= 1
        if waiter.rides is not None:  # ended before the stream whose slot it rode
            waiter.rides.rider = None
        elif waiter.rider is not None:  # its rider holds the slot now
            waiter.rider.rides = None
        waiter.rides = waiter.rider = None
        k.service -= (waiter.charged_s - waiter.served_s) / k.weight  # shorter than expected: refunded
        k.mean_s += SMOOTHING * (waiter.served_s - k.mean_s)
        self._stream_s += SMOOTHING * (waiter.served_s - self._stream_s)
        assert waiter.started_at is not None
        self._hold_s += SMOOTHING * (self._clock() - waiter.started_at - self._hold_s)
        self._drop_if_idle(waiter.key, k)

    def _drop_if_idle(self, name: str, k: _Key) -> None:
        # An idle key is forgotten: when it comes back it enters at the minimum, as any newcomer.
        if not k.waiting and not k.in_flight:
            del self._keys[name]
            self._idle[name] = k.service
            if len(self._idle) > MAX_IDLE_KEYS:
                self._idle.popitem(last=False)
            if not self._keys:
                self._floor = k.service  # the last active key's service: the minimum until one comes


def _check_cost(cost: float) -> float:
    if not (cost >= 0 and math.isfinite(cost)):
        raise ValueError(f"a cost must be finite and ≥ 0, not {cost!r}")
    return cost


def _due(k: _Key, horizon: float) -> Waiter | None:
    """The key's waiting continuation whose listener runs dry soonest, if that is before `horizon`."""
    due = [w for w in k.waiting if w.continue_by is not None and w.continue_by <= horizon]
    return min(due, key=lambda w: (w.continue_by, w.seq)) if due else None
