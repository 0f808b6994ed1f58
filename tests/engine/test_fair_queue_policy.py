"""Admission's policy (engine/fair_queue.py) on a fake clock: fairness, entry, bounds, waits, a listener's
streams and the first-audio SLO; each test is named by the behaviour it protects."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.fair_queue import FairQueue, FairQueueConfig, Refused, Waiter
from engine.listening import ListenerTimeline
from engine.start_forecast import InFlight, StartForecast
from tests.support.clocks import ManualClock


def queue(clock: ManualClock, *, per_key: int = 100, total: int = 1000, max_wait_s: float = 1e9) -> FairQueue:
    return FairQueue(FairQueueConfig(max_waiting_per_key=per_key, max_waiting=total, max_wait_s=max_wait_s), clock)


def saturate(
    q: FairQueue,
    clock: ManualClock,
    weights: dict[str, float],
    lengths: dict[str, float | list[float]],
    capacity: int,
    seconds: float,
    dt: float = 0.05,
    continue_in_s: float | None = None,
) -> dict[str, float]:
    """Every key keeps more streams waiting than the capacity (saturation); each admitted stream is
    served audio in real time for its length (`lengths[key]`, or the next of its list), then ends.
    `continue_in_s`: every stream asks as a continuation whose listener runs dry that long after.
    Returns the audio seconds served per key."""
    served = dict.fromkeys(weights, 0.0)
    cycles = {k: itertools.cycle(v if isinstance(v, list) else [v]) for k, v in lengths.items()}
    running: list[tuple[Waiter, float]] = []  # (waiter, audio left)
    started: list[Waiter] = []
    for _ in range(int(seconds / dt)):
        for key, weight in weights.items():
            while _waiting(q, key) < capacity + 1:
                heard = None if continue_in_s is None else ListenerTimeline(clock.now + continue_in_s)
                started.append(q.push(key, weight, capacity, timeline=heard))  # at once when there is room
        running += [(w, next(cycles[w.key])) for w in q.grant(capacity) + started if w.state == "admitted"]
        started.clear()
        clock.now += dt
        still = []
        for w, left in running:
            step = min(dt, left)
            q.served(w, step)
            served[w.key] += step
            if left - step <= 1e-9:
                q.finish(w)
            else:
                still.append((w, left - step))
        running = still
    return served


def _waiting(q: FairQueue, key: str) -> int:
    k = q._keys.get(key)  # the test's view of one key's queue
    return 0 if k is None else len(k.waiting)


_rng = random.Random(7)
MIXED = {"a": [_rng.uniform(0.3, 8.0) for _ in range(50)], "b": [_rng.uniform(0.3, 8.0) for _ in range(37)]}


@pytest.mark.parametrize("lengths", [{"a": 3.0, "b": 3.0}, {"a": 1.5, "b": 6.0}, {"a": 6.0, "b": 1.0}, MIXED])
@pytest.mark.parametrize("capacity", [1, 2, 5])
def test_weights_2_to_1_give_service_2_to_1(lengths: dict[str, float | list[float]], capacity: int) -> None:
    clock = ManualClock()
    q = queue(clock)
    served = saturate(q, clock, {"a": 2.0, "b": 1.0}, lengths, capacity, seconds=1200)
    ratio = served["a"] / served["b"]
    assert ratio == pytest.approx(2.0, rel=0.05), served
    assert sum(served.values()) == pytest.approx(capacity * 1200, rel=0.02)  # never idle


def test_equal_weights_share_equally_between_three_keys() -> None:
    clock = ManualClock()
    q = queue(clock)
    served = saturate(q, clock, dict.fromkeys("abc", 1.0), {"a": 2.0, "b": 4.0, "c": 1.0}, 3, seconds=900)
    for key in "abc":
        assert served[key] / 900 == pytest.approx(1.0, rel=0.05), served


def test_a_lone_key_gets_all_capacity() -> None:
    clock = ManualClock()
    q = queue(clock)
    waiters = [q.push("a", 0.5, 4) for _ in range(10)]
    assert [w.state for w in waiters[:4]] == ["admitted"] * 4  # room: started at once, past its share
    assert q.in_flight == 4 and q.waiting == 6
    served = saturate(queue(clock), clock, {"a": 1.0}, {"a": 2.0}, 4, seconds=100)
    assert served["a"] == pytest.approx(400, rel=0.02)


def test_a_key_at_its_share_takes_capacity_nobody_else_wants() -> None:
    clock = ManualClock()
    q = queue(clock)
    q.push("big", 9.0, 4)  # in flight, and active with a huge share
    small = [q.push("small", 1.0, 4) for _ in range(5)]
    # small's share is 0.4 of a slot: it is over it from its first stream, yet no slot stays idle.
    assert sum(w.state == "admitted" for w in small) == 3
    assert q.in_flight == 4


def test_a_key_below_its_share_goes_first() -> None:
    clock = ManualClock()
    q = queue(clock)
    a = [q.push("a", 1.0, 2) for _ in range(2)]  # both slots
    b = q.push("b", 1.0, 2)
    a3 = q.push("a", 1.0, 2)
    q.finish(a[0])
    q.served(a[1], 0.0)
    # a holds its share (one slot of two) and b none: b goes first, though both served nothing yet.
    assert q.grant(2) == [b] and a3.state == "waiting"


def test_fifo_within_a_key() -> None:
    clock = ManualClock()
    q = queue(clock)
    first = q.push("a", 1.0, 1)
    rest = [q.push("a", 1.0, 1) for _ in range(3)]
    order = []
    current = first
    for _ in rest:
        q.finish(current)
        (current,) = q.grant(1)
        order.append(current)
    assert order == rest


def test_a_new_key_enters_at_the_current_minimum() -> None:
    clock = ManualClock()
    q = queue(clock)
    running = q.push("a", 1.0, 1)
    q.served(running, 100.0)  # a long history
    q.push("a", 1.0, 1)
    q.push("b", 1.0, 1)
    assert q.service("b") == q.service("a") == 100.0  # not 0: it cannot starve a for 100 s
    # From there on they alternate, each stream serving a second of audio.
    starts = []
    for _ in range(8):
        q.finish(running)
        (running,) = q.grant(1)
        starts.append(running.key)
        q.served(running, 1.0)
        q.push(running.key, 1.0, 1)
    assert starts.count("a") == starts.count("b") == 4, starts


def test_an_idle_key_banks_no_credit() -> None:
    clock = ManualClock()
    q = queue(clock)
    b = q.push("b", 1.0, 2)
    q.served(b, 5.0)
    q.finish(b)  # b goes idle
    assert q.service("b") is None
    a = q.push("a", 1.0, 2)
    q.served(a, 500.0)
    level = q.service("a")
    b2 = q.push("b", 1.0, 2)
    assert b2.state == "admitted"
    assert q.service("b") == pytest.approx(level + b2.charged_s)  # a's level (the minimum), plus its new charge


def test_a_key_back_from_a_moment_idle_keeps_a_lead_it_had() -> None:
    clock = ManualClock()
    q = queue(clock)
    a = q.push("a", 1.0, 2)
    b = q.push("b", 1.0, 2)
    q.served(b, 50.0)  # a long stream of b
    q.finish(b)  # b idle a moment, a still in flight
    ahead = q.service("a")
    q.push("b", 1.0, 2)
    assert q.service("b") is not None and q.service("b") > ahead + 40  # not forgiven back to a's level
    q.finish(a)


def test_the_per_key_bound_refuses_with_bound_tenant() -> None:
    clock = ManualClock()
    q = queue(clock, per_key=2, total=10)
    q.push("a", 1.0, 1)  # in flight
    q.push("a", 1.0, 1)
    q.push("a", 1.0, 1)
    with pytest.raises(Refused) as e:
        q.push("a", 1.0, 1)
    assert e.value.bound == "tenant" and e.value.retry_after_s >= 1.0
    assert q.push("b", 1.0, 1).state == "waiting"  # another key still waits
    assert q.waiting == 3


def test_the_model_bound_refuses_with_bound_model() -> None:
    clock = ManualClock()
    q = queue(clock, per_key=5, total=3)
    q.push("a", 1.0, 1)
    for key in "abc":
        q.push(key, 1.0, 1)
    with pytest.raises(Refused) as e:
        q.push("d", 1.0, 1)
    assert e.value.bound == "model"


def test_a_zero_bound_still_starts_a_stream_that_has_room() -> None:
    clock = ManualClock()
    q = queue(clock, per_key=0, total=0)
    assert q.push("a", 1.0, 2).state == "admitted"
    assert q.push("a", 1.0, 2).state == "admitted"
    with pytest.raises(Refused):
        q.push("a", 1.0, 2)


def test_past_the_maximum_wait_a_waiter_is_refused_not_started_late() -> None:
    clock = ManualClock()
    q = queue(clock, max_wait_s=5.0)
    running = q.push("a", 1.0, 1)
    old = q.push("a", 1.0, 1)
    clock.now += 3
    young = q.push("b", 1.0, 1)
    clock.now += 2.5
    assert q.expire() == [old] and old.state == "expired"
    assert q.waiting == 1
    q.finish(running)
    assert q.grant(1) == [young]
    assert young.waited_s == pytest.approx(2.5)
    assert q.service("a") is None  # a is idle now: forgotten


def test_a_withdrawn_waiter_frees_its_place_and_an_admitted_one_its_slot() -> None:
    clock = ManualClock()
    q = queue(clock, per_key=1)
    running = q.push("a", 1.0, 1)
    waiting = q.push("a", 1.0, 1)
    q.withdraw(waiting)
    assert waiting.state == "withdrawn" and q.waiting == 0
    again = q.push("a", 1.0, 1)  # the per-key bound has room again
    q.withdraw(running)  # a cancel after admission: the slot comes back
    assert q.in_flight == 0
    assert q.grant(1) == [again]
    q.withdraw(again)
    q.withdraw(again)  # idempotent
    assert q.in_flight == 0 and q.waiting == 0 and q.service("a") is None


def test_finish_is_idempotent_and_served_after_it_is_ignored() -> None:
    clock = ManualClock()
    q = queue(clock)
    a = q.push("a", 1.0, 1)
    q.push("a", 1.0, 1)
    q.finish(a)
    q.finish(a)
    q.served(a, 50.0)
    assert q.in_flight == 0 and q.service("a") == 0.0


def test_retry_after_follows_the_measured_hold_within_bounds() -> None:
    clock = ManualClock()
    q = queue(clock, max_wait_s=30.0)
    for _ in range(20):
        w = q.push("a", 1.0, 1)
        clock.now += 4.0
        q.finish(w)
    for _ in range(3):
        q.push("a", 1.0, 1)  # one in flight, two waiting
    assert q.retry_after(1) == pytest.approx(3 * 4.0, rel=0.1)
    assert q.retry_after(100) == 1.0  # never under a second
    assert queue(clock, max_wait_s=2.0).retry_after(1) <= 2.0


def test_bad_weights_and_bounds_are_refused() -> None:
    clock = ManualClock()
    with pytest.raises(ValueError):
        queue(clock).push("a", 0.0, 1)
    with pytest.raises(ValueError):
        queue(clock, max_wait_s=0.0)


# -- continuations: a listener already hearing speech goes first once its audio runs low --------------


def test_a_due_continuation_goes_first_in_its_key_and_its_key_first_among_equals() -> None:
    clock = ManualClock()
    q = queue(clock)
    holder = q.push("a", 1.0, 2)
    q.push("b", 1.0, 2)
    own = q.push("a", 1.0, 2)  # the same tenant's newcomer, waiting first
    other = q.push("c", 1.0, 2)  # another tenant's, also below its share
    clock.now += 1
    cont = q.push("a", 1.0, 2, timeline=ListenerTimeline(clock.now + 0.5))  # its listener runs dry in half a second
    assert cont.state == "waiting"  # no room: it takes no more than the capacity
    q.finish(holder)
    assert q.grant(2) == [cont] and cont.waited_s == 0.0  # granted at the same fake instant
    assert own.state == other.state == "waiting"
    assert q.service("a") is not None and q.service("a") > 0  # charged its key's mean stream


def test_a_continuation_with_time_to_spare_waits_its_fair_turn_until_it_is_due() -> None:
    clock = ManualClock()
    q = queue(clock)
    holder = q.push("a", 1.0, 1)
    early = q.push("a", 1.0, 1)
    cont = q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 10.0))  # ten seconds of audio still to play
    q.finish(holder)
    assert q.grant(1) == [early]  # not due: its key's line in order
    clock.now += 8.5  # now its listener runs dry within the lead
    late = q.push("a", 1.0, 1)
    q.finish(early)
    assert q.grant(1) == [cont] and late.state == "waiting"


def test_a_slot_passes_to_the_next_stream_of_its_listener_due_or_not() -> None:
    # Sentence by sentence: a sentence's stream ends (its audio is made) while its listener still plays
    # it for seconds, and the next sentence already waits. Given to whoever came first, the slot left
    # the continuation none when its listener ran low. It passes on instead, at any capacity.
    clock = ManualClock()
    q = queue(clock)
    holder = q.push("a", 1.0, 1)
    newcomer = q.push("b", 1.0, 1)  # waiting first, another tenant
    nxt = q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 10.0))  # not due: ten seconds still to play
    clock.now += 1
    assert q.hand_over(holder, nxt, 1)
    assert holder.state == "finished" and nxt.state == "admitted" and nxt.waited_s == 1.0
    assert newcomer.state == "waiting" and q.in_flight == 1 and q.waiting == 1
    assert q.grant(1) == []  # nothing else starts: the slot was passed, not freed
    assert not q.hand_over(nxt, newcomer, 1)  # only within a key (a listener is one tenant's)
    assert not q.hand_over(holder, newcomer, 1)  # only from an admitted waiter
    assert nxt.state == "admitted" and newcomer.state == "waiting"
    q.finish(nxt)
    assert q.grant(1) == [newcomer]


def test_a_handed_over_slot_keeps_the_key_active_and_its_account() -> None:
    clock = ManualClock()
    q = queue(clock)
    holder = q.push("a", 1.0, 1)
    nxt = q.push("a", 1.0, 1)
    q.served(holder, 3.0)
    before = q.service("a")
    assert before is not None
    assert q.hand_over(holder, nxt, 1)  # the key's only waiter and its only stream: it stays active
    after = q.service("a")
    assert after is not None and after >= before  # the next stream is charged as any start is
    q.finish(nxt)
    assert q.service("a") is None and q.in_flight == 0 and q.waiting == 0


def test_a_waiter_whose_listener_begins_hearing_becomes_a_continuation_and_stays_one() -> None:
    clock = ManualClock()
    q = queue(clock)
    holder = q.push("a", 1.0, 1)
    early = q.push("a", 1.0, 1)
    second = q.push("a", 1.0, 1)  # its listener hears nothing yet: a newcomer
    q.relisten(second, None)
    q.relisten(second, ListenerTimeline(clock.now + 0.5))  # the audio before it plays now
    q.relisten(second, None)  # and has run out: its gap has begun, it is still due
    assert second.dry_at == clock.now + 0.5
    q.finish(holder)
    assert q.grant(1) == [second] and early.state == "waiting"
    q.relisten(second, ListenerTimeline(clock.now + 9.0))  # admitted: nothing moves
    assert second.dry_at == clock.now + 0.5


def test_a_due_continuation_does_not_take_a_slot_past_its_keys_share() -> None:
    # Nor is a slot passed on to it (`hand_over`) past that share while another key waits; it is at any
    # capacity once nobody else waits (the listener keeps hearing: newcomers wait for the capacity).
    clock = ManualClock()
    q = queue(clock)
    a1, a2 = q.push("a", 1.0, 2), q.push("a", 1.0, 2)  # "a" holds both slots: past its share of one
    b = q.push("b", 1.0, 2)
    cont = q.push("a", 1.0, 2, timeline=ListenerTimeline(clock.now + 0.5))
    assert not q.hand_over(a1, cont, 2) and a1.state == "admitted" and cont.state == "waiting"
    q.finish(a1)
    assert q.grant(2) == [b]  # the other tenant, below its share, goes first
    assert q.hand_over(a2, cont, 1)  # the capacity shrank to one: the listener keeps its slot all the same
    assert a2.state == "finished" and cont.state == "admitted" and q.in_flight == 2
    late = q.push("b", 1.0, 1)
    q.finish(cont)
    assert q.grant(1) == [] and late.state == "waiting"  # the newcomer waits until the capacity has room
    q.finish(b)
    assert q.grant(1) == [late]


def test_a_listeners_next_stream_starts_beside_the_one_it_hears_within_its_keys_share() -> None:
    # A client sending sentence by sentence: the next sentence waits while the one before is made. It
    # starts at once beside it, past the capacity: the two are one listener's, heard one after the other.
    clock = ManualClock()
    q = queue(clock)
    heard = q.push("a", 1.0, 1)
    newcomer = q.push("b", 1.0, 1)
    nxt = q.push("a", 1.0, 1)
    clock.now += 0.5
    assert q.admit_beside(heard, nxt, 1)  # the two count as one slot: within "a"'s share while "b" waits
    assert heard.state == nxt.state == "admitted" and q.in_flight == 2 and nxt.waited_s == 0.5
    assert not q.admit_beside(heard, nxt, 1)  # only a waiting one
    assert not q.admit_beside(heard, newcomer, 1)  # only within a key
    third = q.push("a", 1.0, 1)
    assert not q.admit_beside(nxt, third, 1) and not q.admit_beside(heard, third, 1)  # two at most
    q.finish(heard)
    assert q.grant(1) == []  # the slot stays the listener's: its next stream holds it ...
    assert q.admit_beside(nxt, third, 1)  # ... and the one after may ride it
    q.finish(third)  # a rider may end first: its stream still holds the slot
    assert nxt.state == "admitted" and q.in_flight == 1 and q.grant(1) == []
    q.finish(nxt)
    assert q.grant(1) == [newcomer]


def test_a_listeners_next_stream_waits_in_fair_order_past_its_keys_share() -> None:
    clock = ManualClock()
    q = queue(clock)
    heard, elsewhere = q.push("a", 1.0, 2), q.push("a", 1.0, 2)  # "a" holds both slots: its share is one
    newcomer = q.push("b", 1.0, 2)
    nxt = q.push("a", 1.0, 2)
    assert not q.admit_beside(heard, nxt, 2) and nxt.state == "waiting"
    q.withdraw(newcomer)  # nobody else waits now
    assert q.admit_beside(heard, nxt, 2) and q.in_flight == 3
    q.finish(elsewhere)


def test_a_listener_whose_streams_ended_takes_its_slot_back_for_its_next() -> None:
    # Sentence by sentence on the CPU voices: a Piper sentence is made in a tenth of the time it plays, so
    # its stream ends long before its listener has heard it. The next sentence then found no slot of its
    # listener's to ride, and waited for room behind a costly stream past the capacity: a gap (issue 14).
    clock = ManualClock()
    q = queue(clock)
    mandarin = q.push("a", 1.0, BUDGET, cost=2.0)  # costlier than the whole capacity: it starts alone
    # its listener hears 5 s more
    nxt = q.push("a", 1.0, BUDGET, timeline=ListenerTimeline(clock.now + 5.0), cost=PIPER)
    newcomer = q.push("a", 1.0, BUDGET, cost=PIPER)  # nobody hears it: room in fair order only
    assert nxt.state == newcomer.state == "waiting"
    assert not q.take_back(newcomer, BUDGET) and q.grant(BUDGET) == []
    clock.now += 0.5
    assert q.take_back(nxt, BUDGET) and nxt.state == "admitted" and q.in_flight == 2  # past the capacity
    assert q.load == pytest.approx(2.0 + PIPER) and nxt.waited_s == 0.5
    assert not q.take_back(nxt, BUDGET)  # only a waiting one
    q.finish(mandarin)
    q.finish(nxt)
    assert q.grant(BUDGET) == [newcomer]


def test_a_listener_takes_no_slot_back_past_its_keys_share() -> None:
    clock = ManualClock()
    q = queue(clock)
    held = q.push("a", 1.0, 2)
    other = q.push("b", 1.0, 2)
    nxt = q.push("a", 1.0, 2, timeline=ListenerTimeline(clock.now))  # its listener runs dry now
    newcomer = q.push("b", 1.0, 2)
    assert held.state == other.state == "admitted" and newcomer.state == "waiting"
    assert not q.take_back(nxt, 2)  # "a" holds its share (one of two) while "b" waits
    q.withdraw(newcomer)  # nobody else waits now
    assert q.take_back(nxt, 2) and q.in_flight == 3


def test_due_continuations_start_most_urgent_first_and_expire_like_others() -> None:
    clock = ManualClock()
    q = queue(clock, max_wait_s=5.0)
    holder = q.push("a", 1.0, 1)
    later = q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 1.5))
    sooner = q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 0.5))
    gone = q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 0.1))
    q.withdraw(gone)
    q.finish(holder)
    assert q.grant(1) == [sooner]
    clock.now += 10
    assert q.expire() == [later] and later.state == "expired"
    assert q.waiting == 0 and q.grant(1) == []


def test_continuations_count_against_the_per_key_bound() -> None:
    clock = ManualClock()
    q = queue(clock, per_key=1)
    q.push("x", 1.0, 1)
    q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 1.0))
    with pytest.raises(Refused) as e:
        q.push("a", 1.0, 1)
    assert e.value.bound == "tenant"


@pytest.mark.parametrize("capacity", [2, 4, 7])
def test_back_to_back_continuations_keep_the_weights(capacity: int) -> None:
    """Sessions that send their next response while the last still plays (every one a continuation,
    due by the time it could start) are still served 2:1 by weight under saturation."""
    clock = ManualClock()
    served = saturate(queue(clock), clock, {"a": 2.0, "b": 1.0}, {"a": 3.0, "b": 3.0}, capacity, seconds=600,
                      continue_in_s=1.0)
    assert served["a"] / served["b"] == pytest.approx(2.0, rel=0.05), served


# -- costs: streams that cost the engine differently (the CPU voices' Kokoro and Piper) ----------------

# Worker-seconds per audio second on two workers promising 0.8 of their time: a Mandarin (Kokoro) stream
# fills most of it, an English (Piper) one a sliver.
KOKORO, PIPER, BUDGET = 1.2, 0.1, 1.6


def test_a_cheap_stream_starts_beside_a_costly_one_where_a_second_costly_one_waits() -> None:
    q = queue(ManualClock())
    mandarin = q.push("a", 1.0, BUDGET, cost=KOKORO)
    english = q.push("b", 1.0, BUDGET, cost=PIPER)
    assert mandarin.state == english.state == "admitted" and q.load == pytest.approx(KOKORO + PIPER)
    another = q.push("c", 1.0, BUDGET, cost=KOKORO)  # 2.5 of 1.6: it waits ...
    assert another.state == "waiting" and q.grant(BUDGET) == []
    q.finish(english)
    assert q.grant(BUDGET) == []  # ... until the costly one's cost is free, not any stream's
    q.finish(mandarin)
    assert q.grant(BUDGET) == [another] and q.load == pytest.approx(KOKORO)


def test_a_cheaper_stream_passes_the_next_in_fair_order_only_in_the_room_it_leaves() -> None:
    # 1.1 of the capacity is free now, but the waiting stream will need 1.5 of it: one 0.1 may pass.
    q = queue(ManualClock())
    held = q.push("a", 1.0, BUDGET, cost=0.5)
    costly = q.push("b", 1.0, BUDGET, cost=1.5)
    cheap = [q.push("c", 1.0, BUDGET, cost=PIPER) for _ in range(3)]
    assert costly.state == "waiting" and q.grant(BUDGET) == [cheap[0]] and cheap[0].passed
    assert q.grant(BUDGET) == []
    q.finish(held)  # what it waited for has ended: it starts, the one that passed it still running
    assert q.grant(BUDGET) == [costly] and q.load == pytest.approx(1.5 + PIPER)
    q.finish(cheap[0])
    assert q.grant(BUDGET) == [cheap[1]]


def test_cheap_streams_passing_without_end_never_starve_the_costly_one() -> None:
    # Passing freely, replies of 0.1 would fill each 0.6 the two held streams free as they end, and hold
    # the Mandarin one (1.2) back for as long as they came. In the room it leaves, they take 0.4 in all.
    q = queue(ManualClock())
    held = [q.push("a", 1.0, BUDGET, cost=0.6) for _ in range(2)]
    costly = q.push("b", 1.0, BUDGET, cost=KOKORO)
    running: list[Waiter] = []
    for i in range(60):
        if i in (20, 40):
            q.finish(held[i // 20 - 1])
        q.push("c", 1.0, BUDGET, cost=PIPER)
        started = q.grant(BUDGET)
        if costly in started:
            break
        running += started
        while len(running) > 8:  # each cheap reply speaks a while, then ends
            q.finish(running.pop(0))
    assert i == 40 and costly.state == "admitted"  # as the last stream it waited for ended
    assert running  # and cheap ones went by all along


def test_a_key_at_its_share_passes_nobody_while_another_key_waits() -> None:
    q = queue(ManualClock())
    q.push("a", 1.0, BUDGET, cost=KOKORO)  # "a" holds more than half: its share of two keys
    costly = q.push("b", 1.0, BUDGET, cost=KOKORO)
    mine = q.push("a", 1.0, BUDGET, cost=PIPER)
    assert q.grant(BUDGET) == [] and costly.state == mine.state == "waiting"
    newcomer = q.push("c", 1.0, BUDGET, cost=PIPER)  # a third key, below its share, goes by
    assert q.grant(BUDGET) == [newcomer]


def test_the_room_a_passer_took_stays_counted_when_its_slot_is_handed_on() -> None:
    q = queue(ManualClock())
    q.push("a", 1.0, BUDGET, cost=0.6)
    q.push("b", 1.0, BUDGET, cost=KOKORO)  # it leaves 0.4
    passer = q.push("c", 1.0, BUDGET, cost=0.4)
    assert q.grant(BUDGET) == [passer]
    successor = q.push("c", 1.0, BUDGET, cost=0.4)
    assert q.hand_over(passer, successor, BUDGET) and successor.passed
    late = q.push("d", 1.0, BUDGET, cost=PIPER)  # it would fit now (1.1 of 1.6), not in the room left
    assert q.grant(BUDGET) == [] and late.state == "waiting"


def test_a_stream_costlier_than_the_whole_capacity_starts_alone() -> None:
    # One stream always has room: an engine measured slower than real time still speaks, one at a time.
    q = queue(ManualClock())
    alone = q.push("a", 1.0, 0.5, cost=KOKORO)
    after = q.push("a", 1.0, 0.5, cost=PIPER)
    assert alone.state == "admitted" and after.state == "waiting"
    q.finish(alone)
    assert q.grant(0.5) == [after]
    assert q.grant(0.0) == [] and q.push("b", 1.0, 0.0, cost=PIPER).state == "waiting"  # a strained engine


def test_max_in_flight_bounds_the_count_whatever_the_streams_cost() -> None:
    config = FairQueueConfig(max_waiting_per_key=10, max_waiting=10, max_wait_s=60, max_in_flight=2)
    q = FairQueue(config, ManualClock())
    streams = [q.push("a", 1.0, BUDGET, cost=0.01) for _ in range(3)]
    assert [w.state for w in streams] == ["admitted", "admitted", "waiting"]
    q.finish(streams[0])
    assert q.grant(BUDGET) == [streams[2]]
    with pytest.raises(ValueError):
        FairQueueConfig(max_waiting_per_key=1, max_waiting=1, max_wait_s=1, max_in_flight=0)
    with pytest.raises(ValueError):
        q.push("a", 1.0, BUDGET, cost=float("nan"))


def test_a_share_is_a_share_of_the_cost() -> None:
    # Counted in streams, a key holding one Mandarin stream is below a half share of two; it holds most of
    # the engine, so the other key's stream goes first although it came later.
    q = queue(ManualClock())
    q.push("a", 1.0, BUDGET, cost=KOKORO)
    blocker = q.push("b", 1.0, BUDGET, cost=KOKORO)
    a_next = q.push("a", 1.0, BUDGET, cost=PIPER)
    b_next = q.push("b", 1.0, BUDGET, cost=PIPER)
    q.withdraw(blocker)
    assert q.grant(BUDGET) == [b_next, a_next]


def test_a_slot_handed_on_holds_the_cost_of_the_stream_that_holds_it() -> None:
    q = queue(ManualClock())
    heard = q.push("a", 1.0, BUDGET, cost=KOKORO)
    other = q.push("b", 1.0, BUDGET, cost=KOKORO)
    rider = q.push("a", 1.0, BUDGET, cost=PIPER)
    assert q.admit_beside(heard, rider, BUDGET) and q.load == pytest.approx(KOKORO + PIPER)
    q.finish(heard)  # the rider holds the slot now, at its own cost
    assert q.load == pytest.approx(PIPER) and q.grant(BUDGET) == [other]
    then = q.push("a", 1.0, BUDGET, cost=KOKORO)
    assert q.hand_over(rider, then, BUDGET) and q.load == pytest.approx(2 * KOKORO)
    for w in (other, then):
        q.finish(w)
    assert q.load == 0.0 and q.in_flight == 0


def test_costs_are_reread_for_the_streams_in_flight_too() -> None:
    # A cost is measured and moves: held at what it cost when admitted, a Mandarin stream whose voice got
    # slower on a busier box would let an English one in on top of it that no longer fits.
    q = queue(ManualClock())
    cost = {"zh": KOKORO, "en": PIPER}
    mandarin = q.push("a", 1.0, BUDGET, cost=cost["zh"], kind="zh")
    waiting = q.push("b", 1.0, BUDGET, cost=cost["zh"], kind="zh")
    cost["zh"] = 1.55  # the box got busier
    q.recost(cost.__getitem__)
    assert mandarin.cost == waiting.cost == 1.55 and q.load == pytest.approx(1.55)
    assert not q.fits(cost["en"], BUDGET)
    cost["zh"] = KOKORO
    q.recost(cost.__getitem__)
    assert q.fits(cost["en"], BUDGET) and q.load == pytest.approx(KOKORO)
    with pytest.raises(ValueError):
        q.recost(lambda kind: -1.0)


# -- a listener's streams, by identity: `push`, `release` and `look` as the gateway calls them ---------


class Equal:
    """A listener that equals every other (as two bound methods of equal objects do): only identity names it."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0


def test_a_listener_is_known_by_identity_not_by_equality() -> None:
    clock = ManualClock()
    q = queue(clock)
    one, other = Equal(), Equal()
    held = q.push("a", 1.0, 1, listener=one, follows=True)
    stranger = q.push("a", 1.0, 1, listener=other, follows=True)
    assert held.state == "admitted" and stranger.state == "waiting"  # an equal listener rides no slot
    nxt = q.push("a", 1.0, 1, listener=one, follows=True)
    assert nxt.state == "admitted" and nxt.rides is held  # its own does
    assert q.listeners == 2


def test_a_listeners_next_stream_rides_its_slot_as_it_asks_where_the_engine_follows_listeners() -> None:
    clock = ManualClock()
    q = queue(clock)
    player = object()
    held = q.push("a", 1.0, 1, listener=player, follows=True)
    newcomer = q.push("b", 1.0, 1)
    nxt = q.push("a", 1.0, 1, listener=player, follows=True)
    assert nxt.state == "admitted" and q.in_flight == 2 and newcomer.state == "waiting"  # past the capacity
    third = q.push("a", 1.0, 1, listener=player, follows=True)
    assert third.state == "waiting"  # the one heard and the next: two at most
    q.release(held, 1, follows=True)
    assert third.state == "admitted" and third.rides is nxt and newcomer.state == "waiting"


def test_where_the_engine_does_not_follow_listeners_the_next_stream_takes_the_slot_when_the_one_before_ends() -> None:
    clock = ManualClock()
    q = queue(clock)
    player = object()
    held = q.push("a", 1.0, 1, listener=player)
    newcomer = q.push("b", 1.0, 1)
    nxt = q.push("a", 1.0, 1, listener=player)
    assert nxt.state == "waiting"  # not beside: the engine would run both at once
    q.release(held, 1)
    assert nxt.state == "admitted" and newcomer.state == "waiting"  # before anyone else looks
    q.release(nxt, 1)
    q.look(1)
    assert newcomer.state == "admitted" and q.listeners == 0  # a listener with nothing open is forgotten


def test_a_listener_whose_streams_ended_while_it_hears_them_takes_the_slot_back_at_the_next_look() -> None:
    clock = ManualClock()
    q = queue(clock)
    player = object()
    first = q.push("a", 1.0, 1, listener=player, follows=True)
    q.release(first, 1, follows=True)  # made in a tenth of its audio: its stream ended, its audio plays
    costly = q.push("b", 1.0, 1)
    nxt = q.push("a", 1.0, 1, listener=player, follows=True)
    assert costly.state == "admitted" and nxt.state == "waiting"  # not yet known to be heard
    q.look(1, follows=True, timeline_of=lambda who: ListenerTimeline(clock.now + 3.0) if who is player else None)
    assert nxt.state == "admitted" and q.in_flight == 2  # its listener's slot, past the capacity


def test_a_listeners_slot_yields_to_fairness_past_its_keys_share() -> None:
    clock = ManualClock()
    q = queue(clock)
    player = object()
    held = q.push("a", 1.0, 2, listener=player, follows=True)
    q.push("a", 1.0, 2)  # "a" holds both slots: its share and more
    other = q.push("b", 1.0, 2)
    nxt = q.push("a", 1.0, 2, listener=player, follows=True)
    assert nxt.state == "waiting" and other.state == "waiting"
    q.release(held, 2, follows=True)
    assert other.state == "admitted" or nxt.state == "waiting"  # "b" below its share goes first


# -- the first-audio SLO ------------------------------------------------------------------------------


def slo_queue(clock: ManualClock, slo: float | None = 1.5, **knobs: float) -> FairQueue:
    """A queue whose streams are heard the prior 0.5 s after they start whatever the load (slowdown 0):
    the tests of the wait's arithmetic. The load's slowdown has its own tests (`slow_box`)."""
    knobs = {"first_audio_load_slowdown": 0.0, **knobs}
    return FairQueue(FairQueueConfig(max_wait_s=10.0, first_audio_slo_s=slo, **knobs), clock)  # type: ignore[arg-type]


def staggered(q: FairQueue, clock: ManualClock, capacity: float, n: int = 4, every_s: float = 0.5, cost: float = 1.0,
              key: str = "x") -> list[Waiter]:  # fmt: skip
    """`n` streams admitted `every_s` apart (the last now): with the default 2 s hold they end 2 s after
    each started, so the first slot frees in 2 - (n - 1) * every_s."""
    started = []
    for i in range(n):
        if i:
            clock.now += every_s
        started.append(q.push(key, 1.0, capacity, cost=cost))
        assert started[-1].state == "admitted"
    return started


def test_without_an_slo_a_stream_waits_its_turn_up_to_the_longest_wait() -> None:
    clock = ManualClock()
    q = slo_queue(clock, slo=None)
    q.push("a", 1.0, 1)
    waiter = q.push("a", 1.0, 1)  # 2 s of hold ahead: late, but waits (today's rule)
    clock.now += 9.0
    assert q.look(1) == [] and waiter.state == "waiting"
    clock.now += 1.1
    assert q.look(1) == [waiter] and waiter.refused is not None and waiter.refused.bound == "wait"


def test_a_stream_predicted_to_be_heard_past_the_slo_is_refused_at_once_with_its_prediction() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    q.push("a", 1.0, 1)  # holds the one slot: slots free every 2 s (the default hold)
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 1)
    assert e.value.bound == "slo" and e.value.predicted_s == pytest.approx(2.0 + 0.5)  # its wait + the tail
    assert e.value.retry_after_s == pytest.approx(2.0 - (1.5 - 0.5))  # once a newcomer would make it
    assert q.waiting == 0  # it took no place


def test_a_stream_predicted_to_make_the_slo_waits_for_its_room() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    staggered(q, clock, 4)  # one of four slots frees every 0.5 s, the first in 0.5 s
    waiter = q.push("b", 1.0, 4)  # heard in 0.5 s + the 0.5 s tail
    assert waiter.state == "waiting"
    assert q.push("c", 1.0, 4).state == "waiting"  # one ahead: 1.0 + 0.5 s, just within
    with pytest.raises(Refused):  # two ahead of it: 1.5 + 0.5 s, past the SLO
        q.push("c", 1.0, 4)


def test_streams_admitted_together_free_nothing_until_they_end() -> None:
    # A burst's four streams started at once: no slot frees for a whole hold (2 s), so a fifth cannot be
    # heard within 1.5 s. Spread evenly over the hold, a slot would seem to free every 0.5 s: that
    # prediction admitted streams to the line that were refused a second later.
    clock = ManualClock()
    q = slo_queue(clock)
    for _ in range(4):
        q.push("a", 1.0, 4)
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 4)
    assert e.value.predicted_s == pytest.approx(2.0 + 0.5)


def test_the_prediction_counts_the_cost_waiting_ahead_not_the_number_of_streams() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    staggered(q, clock, 1.0, cost=0.25)  # a quarter of the capacity frees every 0.5 s, the first in 0.5 s
    cheap = [q.push("b", 1.0, 1.0, cost=0.05) for _ in range(4)]  # 0.2 ahead: in the first quarter freed
    assert all(w.state == "waiting" for w in cheap)
    with pytest.raises(Refused):
        q.push("c", 1.0, 1.0, cost=1.0)  # needs all of it, after the cheap ones: 2.5 s, plus the tail


def test_a_waiting_stream_is_refused_as_soon_as_its_wait_alone_means_it_will_miss() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    staggered(q, clock, 4)
    waiter = q.push("b", 1.0, 4)  # heard in 1.0 s, had the first slot freed in 0.5 s
    clock.now += 1.0
    assert q.look(4) == []  # nothing freed, but the first slot may free any moment: 1.0 + 0.5 s
    clock.now += 0.01  # 1.01 s waited + the 0.5 s tail is past 1.5 s
    assert q.look(4) == [waiter]
    assert waiter.state == "expired" and waiter.refused is not None and waiter.refused.bound == "slo"


def test_a_waiting_stream_is_refused_as_soon_as_the_capacity_it_was_promised_shrinks() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    staggered(q, clock, 4)
    waiter = q.push("b", 1.0, 4)
    assert q.look(4) == []
    assert q.look(1) == [waiter]  # the engine measured it keeps one ahead, not four: all four must end


def test_the_tail_of_first_audio_not_its_mean_sets_the_wait_allowed() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    for i in range(20):  # eighteen heard in 0.1 s, two in 1.2 s: mean 0.21 s, the 95th percentile 1.2 s
        w = q.push("a", 1.0, 100)
        heard_after = 1.2 if i < 2 else 0.1
        clock.now += heard_after
        q.heard(w)
        clock.now += 2.0 - heard_after  # each holds its slot the default 2 s: this test is of the tail alone
        q.finish(w)
    assert q.first_audio_tail_s() == pytest.approx(1.2)
    staggered(q, clock, 4)
    with pytest.raises(Refused):  # its wait, about 0.5 s, plus the tail is past 1.5 s (plus the mean is not)
        q.push("b", 1.0, 4)


def test_only_first_audio_the_slo_applies_to_is_measured() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    player = object()
    first = q.push("a", 1.0, 2, listener=player, follows=True)
    nxt = q.push("a", 1.0, 2, listener=player, follows=True)  # made due when the first has played
    clock.now += 4.0
    q.heard(first)
    q.heard(nxt)
    q.heard(first)  # once each
    assert q.forecast.samples() == 1


def test_a_stream_with_room_is_admitted_whatever_the_slo_says() -> None:
    clock = ManualClock()
    q = slo_queue(clock, slo=0.1)  # shorter than the engine's own time to first audio
    assert q.push("a", 1.0, 1).state == "admitted"


def test_continuations_and_a_listeners_later_streams_are_not_refused_by_the_slo() -> None:
    # Their first audio is not a reply's: refused, a reply would lose its middle. They wait, within
    # the longest wait, and go first when their listener is about to run dry.
    clock = ManualClock()
    q = slo_queue(clock)
    player = object()
    q.push("x", 1.0, 1)
    continuation = q.push("a", 1.0, 1, timeline=ListenerTimeline(clock.now + 5.0))
    assert continuation.state == "waiting"
    with pytest.raises(Refused):
        q.push("b", 1.0, 1, listener=player)  # the listener's first: the SLO applies
    q.push("b", 1.0, 1, listener=player, timeline=ListenerTimeline(clock.now + 1.0))  # hears speech: it does not
    clock.now += 3.0
    assert [w.refused for w in q.look(1)] == []


def test_a_refused_leader_leaves_the_listeners_next_stream_to_lead() -> None:
    clock = ManualClock()
    q = slo_queue(clock)
    player = object()
    staggered(q, clock, 4)
    lead = q.push("a", 1.0, 4, listener=player)
    later = q.push("a", 1.0, 4, listener=player)  # not its listener's first: not yet the SLO's
    clock.now += 1.1
    gone = q.look(4)
    assert gone == [lead, later]  # the lead missed; then the next one leads, and has waited as long


def test_the_slo_and_every_other_knob_are_checked_in_the_config() -> None:
    for bad in ({"first_audio_slo_s": 0.0}, {"first_audio_quantile": 0.0}, {"first_audio_samples": 0},
                {"smoothing": 0.0}, {"recheck_s": 0.0}, {"max_in_flight": 0}, {"max_wait_s": 0.0}):
        with pytest.raises(ValueError):
            FairQueueConfig(**bad)  # type: ignore[arg-type]


def test_one_tenants_burst_refuses_its_own_streams_not_another_tenants() -> None:
    # The prediction is in fair order: a tenant below its share goes before a flooding one's line.
    clock = ManualClock()
    q = slo_queue(clock)
    staggered(q, clock, 4, key="flood")
    flood = []
    for _ in range(6):
        try:
            flood.append(q.push("flood", 1.0, 4))
        except Refused as e:
            assert e.bound == "slo"
    assert 0 < len(flood) < 6  # the flood's own line grew past the SLO
    canary = q.push("canary", 1.0, 4)  # one ahead of it in fair order (the flood's head), not six
    assert canary.state == "waiting" and q.cost_ahead(canary) == pytest.approx(1.0)
    assert canary not in q.look(4)  # (a flood stream now behind it in fair order may miss instead)


def test_the_prediction_drains_the_cost_in_flight_where_the_count_not_the_budget_binds() -> None:
    # The CPU voices: a budget far above two Piper streams, but max_in_flight 2. Slots free as the
    # streams in flight end (two per 2 s hold), not at the budget's rate: a budget-rate drain said
    # "at once" and admitted streams that then waited seconds.
    clock = ManualClock()
    q = slo_queue(clock, max_in_flight=2)
    staggered(q, clock, 100.0, n=2, every_s=1.0, cost=0.1)
    first = q.push("b", 1.0, 100.0, cost=0.1)  # the first slot frees in 1 s: heard by 1.5 s
    assert first.state == "waiting"
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 100.0, cost=0.1)  # the second slot: about 2 s
    assert e.value.predicted_s == pytest.approx(2.5) and e.value.retry_after_s <= 10.0


def test_continuations_that_fall_due_before_a_leader_starts_count_ahead_of_it() -> None:
    # A due continuation goes first in its key, though it asked later: a leader's prediction counts it,
    # and the leader is refused as the continuation arrives, not when its wait runs out.
    clock = ManualClock()
    q = slo_queue(clock)
    staggered(q, clock, 4)  # a slot frees every 0.5 s, the first in 0.5 s
    lead = q.push("a", 1.0, 4)  # heard in 0.5 + 0.5 s
    q.push("a", 1.0, 4, timeline=ListenerTimeline(clock.now + 30.0))  # hears 30 s more: not due before the lead
    assert q.look(4) == [] and q.start_of(lead, 4) == pytest.approx(clock.now + 0.5)
    q.push("a", 1.0, 4, timeline=ListenerTimeline(clock.now + 1.0))  # due now: goes first, the lead starts in 1.0 s
    assert q.look(4) == [] and q.start_of(lead, 4) == pytest.approx(clock.now + 1.0)
    q.push("a", 1.0, 4, timeline=ListenerTimeline(clock.now + 1.0))  # a second: 1.5 s + the tail is past the SLO
    assert q.look(4) == [lead] and lead.refused is not None and lead.refused.bound == "slo"


@pytest.mark.parametrize("every_s", [0.125, 0.25, 0.375])
def test_where_streams_hold_as_measured_a_stream_let_wait_is_never_refused_later(every_s: float) -> None:
    # The promise behind "refused at once": with the engine behaving as measured (each stream holds its
    # slot 2 s and is heard 0.5 s after it starts), the prediction at arrival is right, so every refusal
    # comes as the stream asks and every stream let wait is heard within the SLO. Exact binary times.
    clock = ManualClock()
    q = slo_queue(clock)
    running: list[Waiter] = []
    refused_at_once, waited = 0, []
    for step in range(int(20 / 0.0625)):
        if step * 0.0625 % every_s == 0 and step * 0.0625 < 12:
            try:
                w = q.push("a", 1.0, 4)
            except Refused:
                refused_at_once += 1
            else:
                (running if w.state == "admitted" else waited).append(w)
        for w in [w for w in running if clock.now - (w.started_at or 0.0) >= 2.0]:
            running.remove(w)
            q.release(w, 4)
        assert q.look(4) == []  # nobody refused while waiting
        running += [w for w in waited if w.state == "admitted" and w not in running]
        for w in running:
            if clock.now - (w.started_at or 0.0) >= 0.5:
                q.heard(w)
        clock.now += 0.0625
    assert all(w.state in ("admitted", "finished") for w in waited)
    assert all((w.started_at or 0.0) - w.enqueued_at + 0.5 <= 1.5 for w in waited)
    assert refused_at_once > 0 and waited  # an overload (2 streams/s served) with a line


def test_a_start_waits_for_the_ends_that_free_what_it_needs_then_for_the_streams_started_in_their_place() -> None:
    forecast = StartForecast(FairQueueConfig(default_hold_s=2.0))
    holds = forecast.holds
    in_flight: list[InFlight] = [(0.0, 1.0, holds), (0.5, 1.0, holds)]  # end at 2.0 and 2.5
    assert [forecast.start_at(1.0, need, in_flight) for need in (0.0, 1.0, 2.0, 3.0, 4.0)] == [1.0, 2.0, 2.5, 4.0, 4.5]
    assert forecast.start_at(1.0, 0.75, [(0.0, 0.25, holds), (0.5, 0.25, holds)]) == 4.0  # the cost, not the count
    assert forecast.start_at(10.0, 1.0, in_flight) == 10.0  # past their hold: any moment now, not in the past
    assert forecast.start_at(1.0, 1.0, [(0.0, 0.0, holds), (0.5, 0.0, holds)]) == 2.0  # free streams: one each


def test_a_stream_in_flight_is_predicted_to_end_as_the_streams_that_held_as_long_as_it_did() -> None:
    forecast = StartForecast(FairQueueConfig())
    for held in [1.0] * 6 + [5.0] * 4:  # most replies hold 1 s, some 5 s (their mean: about 2.6 s)
        forecast.ended(held)
    assert forecast.holds.end_of(10.0, 10.2) == 11.0  # fresh: as streams usually end (the median of all, 1 s)
    assert forecast.holds.end_of(10.0, 11.5) == 15.0  # past 1 s it is one of the long ones: not "any moment now"
    assert forecast.holds.end_of(10.0, 16.0) == 16.0  # past every hold remembered: any moment now
    assert StartForecast(FairQueueConfig(default_hold_s=2.0)).holds.end_of(10.0, 10.5) == 12.0  # none yet: the prior


def test_the_holds_remembered_are_the_latest_and_bounded() -> None:
    forecast = StartForecast(FairQueueConfig(hold_samples=4))
    for held in [9.0, 9.0, 9.0, 9.0, 1.0, 1.0, 1.0]:  # the 9 s ones age out as newer ones come
        forecast.ended(held)
    assert forecast.holds.end_of(0.0, 0.5) == 1.0  # three of 1 s and one of 9 s: the median is 1 s
    forecast.ended(1.0)
    assert forecast.holds.end_of(0.0, 1.5) == 1.5  # the last 9 s one left: past every hold remembered


def test_a_newcomer_behind_a_stream_running_long_is_refused_at_once_not_after_a_wait() -> None:
    # The late refusal this prevents (bench/results/admission_sweep_s26.md): replies of mixed lengths, a
    # stream in flight past the usual hold. Predicted to end "any moment now", it let a newcomer wait, and
    # ran on: the newcomer was refused once its wait alone was past the SLO, half a second after it asked.
    clock = ManualClock()
    q = slo_queue(clock)
    for held in [5.0] * 4 + [1.0] * 6:  # learn the holds: most streams 1 s, some 5 s (their mean: ~1.7 s)
        w = q.push("a", 1.0, 1)
        clock.now += held
        q.release(w, 1)
    running = q.push("a", 1.0, 1)
    clock.now += 0.25
    fresh = q.push("b", 1.0, 1)  # behind a stream in flight 0.25 s: it ends in 0.75 s, heard 0.5 s after
    assert fresh.state == "waiting"
    q.withdraw(fresh)
    clock.now += 1.25  # 1.5 s in flight: one of the long ones, ending 5 s after it started
    with pytest.raises(Refused) as e:
        q.push("c", 1.0, 1)
    assert e.value.predicted_s == pytest.approx(3.5 + 0.5)
    clock.now += 3.5
    q.release(running, 1)  # it ended as predicted
    assert q.push("d", 1.0, 1).state == "admitted"


def test_a_stream_in_flight_ends_as_its_own_tenants_streams_did_not_as_anothers() -> None:
    # The overload burst's late refusals (tests/gateway/test_overload_slo.py): a canary tenant's short
    # sentences were the holds remembered, so another tenant's whole replies in flight were past every
    # one of them, due "any moment now"; its callers waited, then were refused near the SLO itself.
    clock = ManualClock()
    q = slo_queue(clock, hold_samples=8)
    for tenant, held in [("short", 0.5)] * 8 + [("long", 4.0)] * 2:  # each tenant's own kind of stream
        w = q.push(tenant, 1.0, 1)
        clock.now += held
        q.release(w, 1)
    for tenant, held in [("short", 0.5)] * 8:  # the latest holds of every stream: all short ones
        w = q.push(tenant, 1.0, 1)
        clock.now += held
        q.release(w, 1)
    running = q.push("long", 1.0, 1)
    clock.now += 1.0  # past every short hold: only its own tenant's say it runs 3 s more
    with pytest.raises(Refused) as e:
        q.push("newcomer", 1.0, 1)  # a tenant none of whose streams ended: it starts when "long"'s ends
    assert e.value.predicted_s == pytest.approx(3.0 + 0.5)
    q.release(running, 1)


def test_a_tenant_none_of_whose_streams_ended_is_predicted_by_the_prior_not_by_another_tenants() -> None:
    clock = ManualClock()
    q = slo_queue(clock)  # default_hold_s 2.0
    for _ in range(8):  # another tenant's short streams
        w = q.push("short", 1.0, 1)
        clock.now += 0.25
        q.release(w, 1)
    running = q.push("burst", 1.0, 1)
    clock.now += 0.5
    with pytest.raises(Refused) as e:  # "burst"'s stream ends at its start + 2 s (the prior): 1.5 s more
        q.push("burst", 1.0, 1)
    assert e.value.predicted_s == pytest.approx(1.5 + 0.5)
    q.release(running, 1)


def test_the_tenants_whose_holds_are_remembered_are_bounded() -> None:
    clock = ManualClock()
    q = slo_queue(clock, hold_keys=2)
    for tenant in ("a", "b", "c"):  # each ends one 4 s stream; "a" least lately: forgotten
        w = q.push(tenant, 1.0, 1)
        clock.now += 4.0
        q.release(w, 1)
    for tenant, end_s in (("a", 2.0), ("c", 4.0)):  # "a" by the prior (default_hold_s), "c" by its own
        running = q.push(tenant, 1.0, 1)
        clock.now += 0.5
        with pytest.raises(Refused) as e:
            q.push("newcomer", 1.0, 1)
        assert e.value.predicted_s == pytest.approx(end_s - 0.5 + 0.5), tenant
        q.release(running, 1)
