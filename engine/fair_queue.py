"""Admission's policy: which waiting stream starts next when an engine has room, whose slot a listener's
next stream takes, and which stream is refused because it would be heard too late.

Pure: no asyncio, no clock of its own (`clock` is injected), every knob in `FairQueueConfig`; every rule
is tested on a fake clock (tests/engine/test_fair_queue_policy.py, test_fair_queue_first_audio.py).
gateway/admission.py puts it on the event loop and prices streams by the engine's cost model (`Capacity`).

The rules:
- fairness: one FIFO line per key (tenant); a key's `service` is the audio seconds its streams were
  served, divided by its weight, and the key with the least goes first, so under saturation keys are
  served in proportion to their weights. A stream is charged its key's mean stream length when it
  starts and the account is corrected as its audio is served and when it ends (slots freeing at once
  must not all go to whichever key looked cheapest before any made a sound);
- entry: a key that enters (nothing waiting or in flight) starts at the least service of the active
  keys: idle time banks no credit, and a newcomer cannot starve the others. A key coming back keeps its
  own service where that is higher (weighted fair queueing's max(own, minimum));
- shares: a key holding its weighted share of the capacity yields to keys below theirs, but takes a
  free slot nobody below their share wants: capacity is never idle while anyone waits;
- costs: a stream holds what the engine spends to keep it ahead of its listener, in the capacity's
  units (1 each where the engine counts streams). A waiter starts while the cost in flight and its own
  fit the capacity (one always starts when nothing is in flight: never a deadlock). The next in fair
  order waits for its room and those behind it pass it only in the room it leaves (backfilling with a
  reservation), so cheap streams never starve a costly one and are not held behind one they fit beside.
  Costs are measured and move: `recost` re-reads every waiter's, in flight too;
- continuations: a stream whose listener already hears speech waits in its key's line until that
  listener is about to run dry (`continuation_lead_s`), then goes before the rest of its key's line and
  its key before the others in the same place of the order — within the weights;
- a listener's streams (`listener`, compared by identity): its slot is its own. When its stream ends
  while its next waits, that one takes the slot (`hand_over`). Where the engine makes a listener's next
  stream due only when the one before has played (`follows`: the CPU voices), the next starts beside
  the one heard, riding its slot (`admit_beside`: two at most, counted as one slot of the key's share),
  and a listener whose streams ended while their audio still plays takes the slot back for its next
  continuation (`take_back`). All of it yields to fairness: past its key's share while another key
  waits, the next stream waits in fair order;
- bounds: waiters per key, waiters in all, and the longest wait (bound "wait");
- the first-audio SLO (`first_audio_slo_s`): a stream that leads its listener (no earlier stream of its
  listener open, none of its audio playing) must be heard by `enqueued_at + SLO`. Its forecast
  (engine/start_forecast.py) is its wait for room (the cost ahead of it in fair order) plus its own
  time to first audio as this box measured it lately for its class of voice (from the engine's word on
  that class before it is measured), slower the fuller the engine it starts beside.
  So the SLO bounds a leader's room too (`slo_capacity`): it starts only beside as much load as still
  lets it be heard in time — a box running slow admits fewer — and one always starts alone (it is how
  the box's speed is measured again). Continuations keep the engine's whole capacity: they are what
  keeps the replies already admitted gap-free. One predicted to miss is refused at once (bound "slo", with
  when a newcomer would make it); a waiting one as soon as its prediction says it will miss.
This module is the policy; engine/start_forecast.py is the arithmetic it predicts with.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator

from engine import fair_queue_records as records
from engine.fair_queue_records import Bound, FairQueueConfig, KeyState, ListenerState, Refused, State, Waiter
from engine.listening import ListenerTimeline
from engine.start_forecast import InFlight, StartForecast

__all__ = ["Bound", "FairQueue", "FairQueueConfig", "Refused", "State", "Waiter"]

_EPS = 1e-9  # costs are sums of floats: what fits exactly must not be refused by a rounding error


class FairQueue:
    def __init__(self, config: FairQueueConfig, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._keys: dict[str, KeyState] = {}  # active keys only (waiting or in flight): bounded by the tenants
        self._idle: OrderedDict[str, float] = OrderedDict()  # an idle key's service, oldest first
        self._listeners: dict[int, ListenerState] = {}  # by the token's id(): identity, not equality
        self._floor = 0.0  # the minimum service when no key is active
        self._seq = itertools.count()
        self._waiting = 0
        self._in_flight = 0
        self._stream_s = config.default_stream_s  # every key's streams: a newcomer's first estimate
        self.forecast = StartForecast(config)
        self._capacity: float | None = None  # the engine's capacity at the last call: how full it is
        self._behind_until = -math.inf  # the engine starts no newcomer before this (`engine_behind`)
        # `load` as last summed (None: a start, an end or a cost moved since): a start asks it four times.
        self._load: float | None = None

    # -- state ------------------------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def listeners(self) -> int:
        """Listeners with a stream open here (forgotten as their last ends: bounded by the streams)."""
        return len(self._listeners)

    @property
    def load(self) -> float:
        """The cost of the streams in flight, in the capacity's units (summed once per change: bounded by
        the streams)."""
        if self._load is None:
            self._load = sum(w.cost for k in self._keys.values() for w in k.admitted)
        return self._load

    def engine_behind(self, seconds: float) -> None:
        """The engine's word that it is catching up with its urgent work for `seconds` more (0: it is not;
        `Capacity.behind_s`): no stream starts beside the ones in flight before then, and no start is
        predicted sooner. Room it has: a moment's strain, not a stream's whole length, to wait out."""
        self._behind_until = self._clock() + seconds if seconds > 0 else -math.inf

    def fits(self, cost: float, capacity: float) -> bool:
        """Whether a stream of `cost` has room now: it fits the capacity beside the cost in flight, or
        nothing is in flight (one stream always has room: never a deadlock), within `max_in_flight`,
        and the engine is not catching up (`engine_behind`)."""
        if self._in_flight == 0:
            return True
        if self._clock() < self._behind_until:
            return False
        if self.config.max_in_flight is not None and self._in_flight >= self.config.max_in_flight:
            return False
        return self.load + cost <= capacity + _EPS

    def service(self, key: str) -> float | None:
        """The key's weighted service, while it is active (None: idle)."""
        k = self._keys.get(key)
        return None if k is None else k.service

    def ahead(self, waiter: Waiter) -> int:
        """Waiters that arrived before this one (an estimate of who goes first: fairness may reorder)."""
        return sum(1 for w in self._all_waiting() if w.seq < waiter.seq)

    def retry_after(self, capacity: float) -> float:
        """About when a slot is free for a newcomer (`StartForecast.retry_after_s`)."""
        return self.forecast.retry_after_s(self._waiting, capacity, self.config.max_wait_s)

    def first_audio_tail_s(self, voice: str = "") -> float:
        """A stream of class `voice`'s measured start-to-first-audio time alone, at the tail
        (`StartForecast.alone_s`)."""
        return self.forecast.alone_s(voice, self._clock())

    def slo_room(self, voice: str = "") -> float:
        """The room the SLO leaves a leader of class `voice` of the capacity last seen (`slo_capacity`;
        inf before any)."""
        return math.inf if self._capacity is None else self._slo_room(self._capacity, voice)

    def slo_capacity(self, capacity: float, voice: str = "") -> float:
        """The room the SLO leaves a leader of class `voice` of `capacity` (the engine's word; remembered,
        so a start knows how full the engine was)."""
        self._capacity = capacity
        return self._slo_room(capacity, voice)

    def _slo_room(self, capacity: float, voice: str) -> float:
        """A stream of the usual cost and of class `voice` starts only beside as much load as lets it be
        heard within the SLO (`StartForecast.busy_within`): all of `capacity` without an SLO or while
        that class is fast; room for one alone where not even that one would make it (`fits`: one
        always starts alone). Each class its own: a slow voice's speed does not close the door to a
        fast one."""
        slo = self.config.first_audio_slo_s
        busy = 1.0 if slo is None else self.forecast.busy_within(voice, slo, self._clock())
        return capacity if busy >= 1.0 else min(capacity, max(0.0, busy) * capacity + self.forecast.cost)

    def _room(self, w: Waiter, capacity: float) -> float:
        """The capacity `w` may start in: what the SLO leaves where it leads its listener, else all of it."""
        return self._slo_room(capacity, w.voice) if self._leads(w) else capacity

    def _busy(self, load: float) -> float:
        """The share of the engine's capacity `load` is (0 to 1): what slows a stream's first audio."""
        capacity = self._capacity
        if capacity is None or capacity <= _EPS:  # unknown, or none left (a strained engine): full if any
            return 1.0 if load > _EPS and capacity is not None else 0.0
        return min(1.0, max(0.0, load / capacity))

    def predicted_start(self, cost_ahead: float, cost: float, capacity: float) -> float:
        """When a stream of `cost` behind `cost_ahead` of waiting streams starts (clock time): once the
        streams in flight have freed what it needs beyond the free room (`StartForecast.start_at`). The
        room is negative where those in flight hold more than the capacity now, and counted in slots
        where `max_in_flight` binds. One always starts alone: it needs at most everything to drain."""
        load, count = self.load, self._in_flight
        free = capacity - load
        if self.config.max_in_flight is not None and count:
            free = min(free, (self.config.max_in_flight - count) * load / count)  # slots, at their mean cost
        need = min(cost_ahead + cost - free, cost_ahead + load)
        in_flight: list[InFlight] = [(w.started_at or 0.0, w.cost, self.forecast.holds_of(n))  # its tenant's holds
                                     for n, k in self._keys.items() for w in k.admitted]  # fmt: skip
        start = self.forecast.start_at(self._clock(), need, in_flight)
        return start if not in_flight else max(start, self._behind_until)

    # -- transitions ------------------------------------------------------------------------------

    def push(self, key: str, weight: float, capacity: float, *, timeline: ListenerTimeline | None = None,
             cost: float = 1.0, kind: object = None, listener: object = None, follows: bool = False,
             voice: str = "") -> Waiter:
        """A stream for `key` asks to start: admitted at once while there is room and nobody waits (or
        beside its listener's, the module doc), else queued; raises Refused when it would wait past a
        bound or be heard past the SLO. `timeline`: its listener's, while it hears speech (a continuation);
        `cost`: what it holds of `capacity`, `kind` what `recost` re-reads it by; `listener`: whose stream
        it is; `follows`: the engine makes a listener's next stream due after the one before; `voice`:
        its class of voice (`Capacity.voice_class`: whose first audio its own is forecast by)."""
        if not weight > 0:
            raise ValueError("a weight must be > 0")
        records.check_cost(cost)
        leader_room = self.slo_capacity(capacity, voice)
        k = self._keys.get(key)
        lst = self._listeners.get(id(listener)) if listener is not None else None
        leads = timeline is None and (lst is None or not (lst.held or lst.waiting))  # `_leads`, as it asks
        room = self.fits(cost, leader_room if leads else capacity) and not self._waiting
        if not room and k is not None and len(k.waiting) >= self.config.max_waiting_per_key:
            raise Refused("tenant", self.retry_after(capacity))
        if not room and self._waiting >= self.config.max_waiting:
            raise Refused("model", self.retry_after(capacity))
        if k is None:
            # A key entering starts level with the least-served active key: no credit for idle time.
            floor = min((a.service for a in self._keys.values()), default=self._floor)
            k = self._keys[key] = KeyState(weight, max(floor, self._idle.pop(key, floor)), self._stream_s)
        k.weight = weight  # the configuration's latest word
        now = self._clock()
        waiter = Waiter(key, now, next(self._seq), timeline=timeline, cost=cost, kind=kind, listener=listener,
                        voice=voice)
        k.waiting.append(waiter)
        self._waiting += 1
        if listener is not None:
            lst = self._listeners.get(id(listener))
            if lst is None:
                lst = self._listeners[id(listener)] = ListenerState(listener)
            lst.waiting.append(waiter)
            if lst.waiting[0] is waiter:  # only it may start here: the caller hears of no other
                self._follow(lst, capacity, follows)
        if room:
            self._start(capacity, now)  # it alone waits: it starts, having waited 0 s
        # One that fits may pass those ahead in the room they leave: the caller's `look` decides it.
        elif waiter.state == "waiting" and not self.fits(cost, self._room(waiter, capacity)) and (
            miss := self._misses(waiter, capacity, now)
        ) is not None:
            self._drop(waiter, "withdrawn")
            raise miss
        return waiter

    def recost(self, cost_of: Callable[[object], float]) -> None:
        """Every waiter's cost as it is now, by its `kind`: waiting, and in flight (a key's share and the
        load follow). Bounded by the waiters and the streams in flight."""
        for k in self._keys.values():
            for w in itertools.chain(k.waiting, k.admitted):
                w.cost = records.check_cost(cost_of(w.kind))
        self._load = None

    def rekind(self, waiter: Waiter, kind: object, cost: float) -> None:
        """A stream, waiting or admitted, now speaks as `kind`, costing `cost` (as `recost` would have it)."""
        waiter.kind, waiter.cost = kind, records.check_cost(cost)
        self._load = None

    def grant(self, capacity: float) -> list[Waiter]:
        """Start waiters while they fit the capacity (what the SLO leaves of it), in fair order; returns them."""
        self._capacity = capacity  # how full the engine is, for the starts decided here
        return self._start(capacity, self._clock())

    def look(self, capacity: float, *, follows: bool = False,
             timeline_of: Callable[[object], ListenerTimeline | None] | None = None) -> list[Waiter]:
        """A look at the line: where each waiting stream's listener is now (`timeline_of(listener)`, on
        the policy's clock; None while it hears none), the waiters past a bound or the SLO
        refused (returned, expired), a listener holding no slot taking it back (`take_back`), then room
        granted in fair order. Bounded by the waiters."""
        self._capacity = capacity  # how full the engine is, for the starts decided here
        if timeline_of is not None:
            for lst in [x for x in self._listeners.values() if x.waiting]:  # most hold their one stream only
                heard = timeline_of(lst.token)
                for w in lst.waiting:
                    self.relisten(w, heard)
        gone = self._expire_waits(capacity)
        for before in (True, False):  # a slot taken back before the grant; a next one beside those it started
            for lst in list(self._listeners.values()) if follows else ():
                if not lst.held or not before:
                    self._follow(lst, capacity, follows)
            if before:
                self._start(capacity, self._clock())
        return gone + self._expire_slo(capacity)

    def release(self, waiter: Waiter, capacity: float, *, follows: bool = False) -> None:
        """A place given up or a slot freed (idempotent). A freed slot stays its listener's: the stream
        riding it holds it now, or the listener's next waiting stream takes it (`hand_over`), before
        anyone else looks; the caller looks next (`look`)."""
        self._capacity = capacity  # how full the engine is, for the starts decided here
        lst = self._listener(waiter.listener)
        alone = lst is not None and lst.held == [waiter]
        if not (alone and lst is not None and lst.waiting and self.hand_over(waiter, lst.waiting[0], capacity)):
            self.withdraw(waiter)
        if lst is not None:
            self._follow(lst, capacity, follows)

    def _follow(self, lst: ListenerState, capacity: float, follows: bool) -> None:
        """Where the engine follows listeners: while `lst` holds one admitted stream, its next waiting
        one starts beside it (`admit_beside`); while it holds none, its next continuation takes the slot
        back (`take_back`). At most two held: the one heard and the next."""
        while follows and lst.waiting and len(lst.held) <= 1:
            nxt = lst.waiting[0]
            took = self.admit_beside(lst.held[0], nxt, capacity) if lst.held else self.take_back(nxt, capacity)
            if not took:
                return

    def _start(self, capacity: float, now: float) -> list[Waiter]:
        started: list[Waiter] = []
        while self._waiting:
            k, waiter = self._next(capacity, now)
            # The next in fair order waits for its room; others pass it only in the room it leaves.
            if not self.fits((head := waiter or k.waiting[0]).cost, self._room(head, capacity)):
                started += self._pass(head, capacity, now)
                break
            if waiter is None:
                waiter = k.waiting[0]
            self._admit(k, waiter, now)
            started.append(waiter)
        return started

    def _pass(self, head: Waiter, capacity: float, now: float) -> list[Waiter]:
        """While `head` (the next in fair order) waits for its room: admit those behind it, in fair order
        (a key's line in its order), that fit now and in what `head` leaves of the capacity beside the
        streams that passed before (the module doc, costs). One pass: bounded by the waiters."""
        room = capacity - head.cost - sum(w.cost for k in self._keys.values() for w in k.admitted if w.passed)
        if room <= _EPS:
            return []
        total = self._total_weight()
        waiting = [(self._at_share(k.held, k, capacity, total), k) for k in self._keys.values() if k.waiting]
        passed: list[Waiter] = []
        for at_share, k in sorted(waiting, key=lambda e: (e[0], e[1].service, e[1].waiting[0].seq)):
            if at_share and len(waiting) > 1:
                continue  # at its share while another key waits: it takes no room ahead of anyone
            for w in list(k.waiting):
                if w is not head and w.cost <= room + _EPS and self.fits(w.cost, self._room(w, capacity)):
                    self._admit(k, w, now)
                    w.passed, room = True, room - w.cost
                    passed.append(w)
        return passed

    def _admit(self, k: KeyState, waiter: Waiter, now: float) -> None:
        """`waiter`, out of its key's line (bounded by the per-key bound), takes a slot."""
        waiter.busy = self._busy(self.load)  # before it is counted: what it starts beside
        k.waiting.remove(waiter)
        self._waiting -= 1
        k.admitted[waiter] = None
        self._in_flight += 1
        self._load = None
        self.forecast.started(waiter.cost)
        waiter.state, waiter.started_at = "admitted", now
        waiter.charged_s = k.mean_s
        k.service += k.mean_s / k.weight
        waiter.leads = self._leads(waiter)
        if (lst := self._listener(waiter.listener)) is not None:
            lst.waiting.remove(waiter)
            lst.held.append(waiter)

    def admit_beside(self, holder: Waiter, successor: Waiter, capacity: float) -> bool:
        """The next stream of a listener whose one stream `holder` is admitted starts at once beside it,
        riding its slot, past `capacity` if need be (the module doc), unless its key holds its weighted
        share with other slots while another key waits. False, and nothing changes, when it may not, or
        unless `holder` is admitted alone (no rider, riding none) and `successor` waits in its key."""
        if not self._passes(holder, successor, capacity) or holder.rides is not None or holder.rider is not None:
            return False
        self._admit(self._keys[holder.key], successor, self._clock())
        successor.rides, holder.rider = holder, successor
        successor.passed = holder.passed  # its slot's: room a waiter ahead left stays counted so
        return True

    def hand_over(self, waiter: Waiter, successor: Waiter, capacity: float) -> bool:
        """An admitted waiter's stream ended while the next stream of the same listener waits: that one
        takes its slot at once, due or not (the module doc), on `admit_beside`'s terms."""
        if not self._passes(waiter, successor, capacity):
            return False
        self._admit(self._keys[waiter.key], successor, self._clock())  # before the finish: the key stays
        successor.passed = waiter.passed
        self.finish(waiter)
        return True

    def take_back(self, waiter: Waiter, capacity: float) -> bool:
        """A waiting continuation whose listener holds no stream (its streams ended as their audio was
        made, not as it was heard) starts at once, past `capacity` if need be, on `admit_beside`'s terms.
        False, and nothing changes, when it may not."""
        k = self._keys.get(waiter.key)
        if waiter.state != "waiting" or waiter.timeline is None or k is None or self._yields(k, 0.0, capacity):
            return False
        self._admit(k, waiter, self._clock())
        return True

    def _passes(self, holder: Waiter, successor: Waiter, capacity: float) -> bool:
        """Whether `holder`'s slot may serve `successor` too (the same key; `holder` admitted, `successor`
        waiting): not while its key holds its share with its other slots and another key waits."""
        if holder.state != "admitted" or successor.state != "waiting" or successor.key != holder.key:
            return False
        return not self._yields(self._keys[holder.key], holder.cost, capacity)

    def _yields(self, k: KeyState, riding: float, capacity: float) -> bool:
        """Whether `k` holds its share with its slots but the one being passed on (`riding`) while another
        key waits: then a listener's slot serves its next stream only in fair order."""
        others_wait = any(o.waiting for o in self._keys.values() if o is not k)
        return others_wait and self._at_share(k.held - riding, k, capacity)

    def _total_weight(self) -> float:
        return sum(k.weight for k in self._keys.values())

    def _at_share(self, held: float, k: KeyState, capacity: float, total: float | None = None) -> bool:
        """Whether holding `held` of the capacity, `k` holds its weighted share among the active keys.
        Counted in streams of one each, a share of 3.3 lets a key hold 4 (or the heavier key would lose
        the fraction): it is below its share while it holds less."""
        total = self._total_weight() if total is None else total
        return held >= capacity * k.weight / total - _EPS

    def _next(self, capacity: float, now: float) -> tuple[KeyState, Waiter | None]:
        """The key that starts a stream next, and its due continuation (None: its line's head goes)."""
        total = self._total_weight()
        lead = now + self.config.continuation_lead_s
        due = {name: k.due(lead) for name, k in self._keys.items() if k.waiting}

        def order(name: str) -> tuple[bool, bool, float, int]:
            k = self._keys[name]
            return (self._at_share(k.held, k, capacity, total), due[name] is None, k.service, k.waiting[0].seq)

        name = min(due, key=order)
        return self._keys[name], due[name]

    def expire(self, capacity: float | None = None) -> list[Waiter]:
        """Remove and return the waiters refused while waiting (`Waiter.refused`): past the maximum wait
        (bound "wait"), or, given the `capacity`, predicted to be heard past the SLO (bound "slo")."""
        if capacity is not None:
            self._capacity = capacity  # how full the engine is, for the starts decided here
        return self._expire_waits(capacity) + ([] if capacity is None else self._expire_slo(capacity))

    def _expire_waits(self, capacity: float | None) -> list[Waiter]:
        now, gone = self._clock(), []
        retry = self.retry_after(capacity) if capacity is not None else self.config.max_wait_s
        for k in list(self._keys.values()):
            while k.waiting and now - k.waiting[0].enqueued_at > self.config.max_wait_s:  # FIFO: the oldest first
                gone.append(k.waiting[0])
                self._drop(k.waiting[0], "expired", Refused("wait", retry))
        return gone

    def _expire_slo(self, capacity: float) -> list[Waiter]:
        if self.config.first_audio_slo_s is None:
            return []
        now, gone = self._clock(), []
        for w in sorted(self._all_waiting(), key=lambda w: w.seq):  # bounded by the line (a look: ≤ 256²)
            if (miss := self._misses(w, capacity, now)) is not None:
                gone.append(w)
                self._drop(w, "expired", miss)  # those behind it move up: they see the line without it
        return gone

    def cost_ahead(self, waiter: Waiter) -> float:
        """The cost that starts before `waiter`, as weighted fair queueing would serve it: its own key's
        line ahead of it, and of every other key as much as that key is served meanwhile (its weight's
        worth of the same, at most its line). A tenant's burst so delays its own streams, not another's."""
        k = self._keys[waiter.key]
        own = 0.0
        for w in k.waiting:  # in its key's order (bounded by the per-key bound)
            if w is waiter:
                break
            own += w.cost
        mine = own + waiter.cost
        others = sum(min(sum(w.cost for w in o.waiting), mine * o.weight / k.weight)
                     for o in self._keys.values() if o is not k)  # fmt: skip
        return own + others

    def start_of(self, waiter: Waiter, capacity: float) -> float:
        """When `waiter` is predicted to start (clock time): behind the cost ahead of it in fair order
        (`cost_ahead`) and the continuations behind it in its key's line that fall due before it starts
        (a due continuation goes first in its key: counting only those ahead of it in the line predicted
        starts that they then overtook). Bounded by its key's line."""
        ahead = self.cost_ahead(waiter)
        start = self.predicted_start(ahead, waiter.cost, capacity)
        line = self._keys[waiter.key].waiting
        behind = sorted((w for w in itertools.islice(line, line.index(waiter) + 1, None) if w.dry_at is not None),
                        key=lambda w: (w.dry_at, w.seq))  # fmt: skip
        for w in behind:  # in the order they fall due; each one counted moves the start later
            assert w.dry_at is not None
            if w.dry_at - self.config.continuation_lead_s > start:
                break
            ahead += w.cost
            start = self.predicted_start(ahead, waiter.cost, capacity)
        return start

    def _misses(self, w: Waiter, capacity: float, now: float) -> Refused | None:
        """The SLO's refusal of a waiter that leads its listener and will be heard too late (None: it will
        make it, or the SLO does not apply)."""
        slo = self.config.first_audio_slo_s
        if slo is None or not self._leads(w):
            return None
        capacity = self._room(w, capacity)  # a leader starts in what the SLO leaves
        wait = self.start_of(w, capacity) - now
        # It starts beside the load now, or, having waited, at most as much as its cost fits beside.
        load = self.load
        own = self.forecast.own_s(w.voice, self._busy(load if wait <= _EPS else min(load, capacity - w.cost)), now)
        heard = now - w.enqueued_at + wait + own
        if heard <= slo + _EPS:
            return None
        # A newcomer would make it once the line has drained what this one would wait beyond its budget.
        retry = min(max(wait - max(0.0, slo - own), 0.0), self.config.max_wait_s)
        return Refused("slo", retry, predicted_s=heard)

    def relisten(self, waiter: Waiter, timeline: ListenerTimeline | None) -> None:
        """Where a waiter's listener is now: it began hearing speech (a continuation from now on), or
        runs dry at another time. A listener that has run dry (None) leaves a continuation one, due at
        once: its gap has begun. Only a waiting one changes."""
        if waiter.state == "waiting" and timeline is not None:
            waiter.timeline = timeline

    def withdraw(self, waiter: Waiter) -> None:
        """A waiter that gave up (its client cancelled). An admitted one is finished instead."""
        if waiter.state == "admitted":
            self.finish(waiter)
        elif waiter.state == "waiting":
            self._drop(waiter, "withdrawn")

    def _drop(self, waiter: Waiter, state: State, refused: Refused | None = None) -> None:
        """A waiting waiter leaves the line unadmitted."""
        k = self._keys[waiter.key]
        k.waiting.remove(waiter)  # bounded by the per-key bound
        waiter.state, waiter.refused = state, refused
        self._waiting -= 1
        self._unlisten(waiter)
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

    def heard(self, waiter: Waiter) -> bool:
        """An admitted waiter's first audio came, or was made and is held for pacing (the engine's
        `Waiting("pacing")`: that hold waits on its client's text as much as on this box, and admission
        cannot shorten it): the time since it started is measured for the SLO's tail (of the streams the
        SLO applies to: a continuation's audio is made due later, on purpose). True when that moved the
        measurements (the waiters' predictions)."""
        if waiter.state != "admitted" or waiter.heard or waiter.started_at is None:
            return False
        waiter.heard = True
        if waiter.leads:
            now = self._clock()
            self.forecast.heard(waiter.voice, now - waiter.started_at, waiter.busy, now)
        return waiter.leads

    def finish(self, waiter: Waiter) -> None:
        """An admitted waiter's stream has ended: its slot is free. Idempotent."""
        if waiter.state != "admitted":
            return
        waiter.state = "finished"
        k = self._keys[waiter.key]
        del k.admitted[waiter]
        self._in_flight -= 1
        self._load = None
        if waiter.rides is not None:  # ended before the stream whose slot it rode
            waiter.rides.rider = None
        elif waiter.rider is not None:  # its rider holds the slot now
            waiter.rider.rides = None
        waiter.rides = waiter.rider = None
        self._unlisten(waiter)
        smoothing = self.config.smoothing
        k.service -= (waiter.charged_s - waiter.served_s) / k.weight  # shorter than expected: refunded
        k.mean_s += smoothing * (waiter.served_s - k.mean_s)
        self._stream_s += smoothing * (waiter.served_s - self._stream_s)
        assert waiter.started_at is not None
        self.forecast.ended(self._clock() - waiter.started_at, waiter.key)
        self._drop_if_idle(waiter.key, k)

    def _listener(self, token: object) -> ListenerState | None:
        """`token`'s open streams (None: a stream of no listener, or none open)."""
        return None if token is None else self._listeners.get(id(token))

    def _leads(self, w: Waiter) -> bool:
        """Whether the SLO applies to `w`: no audio of its listener plays (not a continuation) and no
        earlier stream of its listener is open (its first audio is its listener's next first audio)."""
        lst = self._listener(w.listener)
        return w.timeline is None and (lst is None or (not lst.held and lst.waiting[:1] == [w]))

    def _unlisten(self, waiter: Waiter) -> None:
        """`waiter` is no longer one of its listener's open streams; a listener with none is forgotten."""
        lst = self._listeners.get(id(waiter.listener)) if waiter.listener is not None else None
        if lst is None:
            return
        for line in (lst.held, lst.waiting):
            if waiter in line:
                line.remove(waiter)
        if not lst.held and not lst.waiting:
            del self._listeners[id(waiter.listener)]

    def _all_waiting(self) -> Iterator[Waiter]:
        return (w for k in self._keys.values() for w in k.waiting)

    def _drop_if_idle(self, name: str, k: KeyState) -> None:
        # An idle key is forgotten: when it comes back it enters at the minimum, as any newcomer.
        if not k.waiting and not k.in_flight:
            del self._keys[name]
            self._idle[name] = k.service
            if len(self._idle) > self.config.max_idle_keys:
                self._idle.popitem(last=False)
            if not self._keys:
                self._floor = k.service  # the last active key's service: the minimum until one comes

