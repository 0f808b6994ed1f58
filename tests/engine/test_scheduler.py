"""The engine's scheduling policy, driven with plain records and a fake clock (no torch, no threads)."""

from __future__ import annotations

import pytest

from engine.listening import ListenerTimeline
from engine.qwen3.serving.scheduler import (
    TRANSITIONS,
    RequestRecord,
    Scheduler,
    SchedulerConfig,
    Status,
    bucket_sizes,
    urgency,
)


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


def running(rid: int, *, arrival: float = 0.0, audio_s: float = 0.0, first_audio_at: float | None = None,
            pending: int = 0, chunks_sent: int = 0) -> RequestRecord:
    return RequestRecord(rid, arrival, has_text=True, status=Status.RUNNING, audio_s=audio_s,
                         first_audio_at=first_audio_at, pending_frames=pending, chunks_sent=chunks_sent)


def test_a_listener_runs_out_when_the_audio_sent_since_its_first_audio_has_played() -> None:
    clock = FakeClock()
    heard = running(1, audio_s=2.0, first_audio_at=clock.t).timeline
    assert heard == ListenerTimeline(clock.t + 2.0)
    clock.advance(0.5)
    assert heard.ahead_s(clock.t) == pytest.approx(1.5)
    clock.advance(2.0)
    assert heard.dry_at - clock.t == pytest.approx(-0.5)  # the listener has been hearing a gap
    assert heard.ahead_s(clock.t) == 0.0
    assert running(2).timeline is None  # no audio yet: nothing is playing


def test_at_most_one_prefill_per_cycle_oldest_first() -> None:
    s = Scheduler()
    recs = [RequestRecord(i, arrival=10.0 - i, has_text=True) for i in range(4)]
    plan = s.plan_talker(recs, now=20.0, free_slots=4)
    assert plan.prefill == 3  # arrived first
    assert plan.step == ()
    assert plan.bucket == 1


def test_no_prefill_without_a_free_slot_or_without_text() -> None:
    s = Scheduler()
    assert s.plan_talker([RequestRecord(1, 0.0, has_text=True)], now=1.0, free_slots=0).prefill is None
    assert s.plan_talker([RequestRecord(1, 0.0, has_text=False)], now=1.0, free_slots=3).prefill is None


def test_streams_without_audio_first_then_shortest_buffer() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(max_batch=3, buckets=(1, 2, 3)))
    start = clock.t
    recs = [
        running(1, audio_s=5.0, first_audio_at=start),  # 5 s sent
        running(2, audio_s=1.0, first_audio_at=start),  # shortest buffer
        running(3, arrival=start + 0.3),  # no audio yet, arrived later
        running(4, audio_s=3.0, first_audio_at=start),
        running(5, arrival=start + 0.1),  # no audio yet, arrived first
    ]
    clock.advance(0.5)
    plan = s.plan_talker(recs, now=clock.t, free_slots=0)
    assert plan.step == (5, 3, 2)  # the batch is full: streams 4 and 1 (comfortable buffers) wait
    assert plan.bucket == 3
    assert sorted(recs, key=urgency)[-1].rid == 1


def test_prefill_takes_one_row_of_the_batch() -> None:
    s = Scheduler(SchedulerConfig(max_batch=2, buckets=(1, 2)))
    recs = [running(1), running(2), RequestRecord(3, 0.0, has_text=True)]
    plan = s.plan_talker(recs, now=1.0, free_slots=1)
    assert plan.prefill == 3
    assert len(plan.step) == 1
    assert plan.bucket == 2


def test_parked_paused_and_finished_requests_are_skipped() -> None:
    s = Scheduler()
    parked, paused, done, ok = running(1), running(2), running(3), running(4)
    parked.to(Status.PARKED)
    paused.paused = True
    done.to(Status.DRAINING)
    plan = s.plan_talker([parked, paused, done, ok], now=1.0, free_slots=0)
    assert plan.step == (4,)
    parked.to(Status.RUNNING)  # text arrived: it resumes
    assert s.plan_talker([parked, paused, done, ok], now=1.0, free_slots=0).step == (1, 4)


def test_buckets_pad_to_static_sizes() -> None:
    s = Scheduler(SchedulerConfig(max_batch=32))
    assert [s.bucket(n) for n in (0, 1, 2, 3, 5, 8, 9, 17, 32)] == [0, 1, 2, 4, 8, 8, 16, 32, 32]
    with pytest.raises(ValueError):
        s.bucket(33)
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(6) == (1, 2, 4, 6)
    assert bucket_sizes(32, min_bucket=4) == (4, 8, 16, 32)
    assert bucket_sizes(2, min_bucket=4) == (4,)
    with pytest.raises(ValueError):
        SchedulerConfig(max_batch=8, buckets=(1, 2, 4))


def test_codec_follows_the_chunk_ramp() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2, 4, 8)))
    first = running(1, pending=1)
    assert s.plan_codec([first], now=0.0, talker_pressing=False).chunks == ()
    first.pending_frames = 3
    assert s.plan_codec([first], now=0.0, talker_pressing=False).chunks == ((1, 2),)
    later = running(2, pending=9, chunks_sent=5, audio_s=1.0, first_audio_at=0.0)  # past the ramp: 8
    assert s.plan_codec([later], now=0.0, talker_pressing=False).chunks == ((2, 8),)


def test_codec_flushes_the_remainder_when_the_talker_is_done() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2, 4, 8)))
    r = running(1, pending=3, chunks_sent=2, audio_s=1.0, first_audio_at=0.0)
    assert s.plan_codec([r], now=0.0, talker_pressing=False).chunks == ()
    r.to(Status.DRAINING)
    assert s.plan_codec([r], now=0.0, talker_pressing=False).chunks == ((1, 3),)


def test_codec_orders_by_urgency_and_groups_by_size() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2, 4), max_codec_rows=2))
    recs = [
        running(1, pending=4, chunks_sent=1, audio_s=1.0, first_audio_at=0.0),
        running(2, pending=2),  # no audio yet
        running(3, pending=4, chunks_sent=1, audio_s=0.5, first_audio_at=0.0),
    ]
    plan = s.plan_codec(recs, now=0.2, talker_pressing=False)
    assert plan.chunks == ((2, 2), (3, 4))  # stream 1 has the longest buffer; the budget is 2 × 4 frames
    assert plan.batches(2) == [(2, [2]), (4, [3])]


def test_a_cycle_decodes_up_to_the_frames_of_max_codec_rows_full_chunks() -> None:
    """Small chunks of many streams fit one cycle's budget (2 rows × 8 frames = 16), in batches of at
    most 2 rows; a chunk larger than what is left waits, but a cycle always decodes at least one."""
    s = Scheduler(SchedulerConfig(ramp=(2, 4, 8), max_codec_rows=2))
    first = [running(i, pending=2) for i in (1, 2, 3)]  # no audio yet: 2-frame chunks
    second = [running(i, pending=4, chunks_sent=1, audio_s=0.16 + i / 100, first_audio_at=0.0) for i in (4, 5, 6)]
    plan = s.plan_codec([*first, *second], now=0.1, talker_pressing=False)
    assert plan.chunks == ((1, 2), (2, 2), (3, 2), (4, 4), (5, 4))  # 18 frames would pass 16: 6 waits
    assert plan.batches(2) == [(2, [1, 2]), (2, [3]), (4, [4, 5])]
    big = SchedulerConfig(ramp=(2, 4, 8), max_codec_rows=1)
    r = running(7, pending=9, chunks_sent=2, audio_s=0.5, first_audio_at=0.0)
    assert Scheduler(big).plan_codec([r, running(8, pending=2)], now=0.1, talker_pressing=False).chunks == ((8, 2),)
    assert Scheduler(big).plan_codec([r], now=0.1, talker_pressing=False).chunks == ((7, 8),)


def test_comfortable_streams_defer_decoding_while_the_talker_has_pressing_work() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(ramp=(2,), defer_s=2.0))
    comfy = running(1, pending=2, chunks_sent=3, audio_s=5.0, first_audio_at=clock.t)
    low = running(2, pending=2, chunks_sent=3, audio_s=1.0, first_audio_at=clock.t)
    assert s.plan_codec([comfy, low], now=clock.t, talker_pressing=True).chunks == ((2, 2),)
    assert s.plan_codec([comfy, low], now=clock.t, talker_pressing=False).chunks == ((2, 2), (1, 2))
    clock.advance(3.5)  # the comfortable buffer drained below defer_s: it no longer waits
    assert [rid for rid, _ in s.plan_codec([comfy, low], now=clock.t, talker_pressing=True).chunks] == [2, 1]


def test_a_stream_without_audio_is_never_deferred() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2,), defer_s=2.0))
    assert s.plan_codec([running(1, pending=2)], now=0.0, talker_pressing=True).chunks == ((1, 2),)


def test_paused_streams_are_not_decoded() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2,)))
    r = running(1, pending=4)
    r.paused = True
    assert s.plan_codec([r], now=0.0, talker_pressing=False).chunks == ()


def test_talker_plan_reports_pressing_rows() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(low_water_s=1.0))
    comfy = running(1, audio_s=5.0, first_audio_at=clock.t)
    assert not s.plan_talker([comfy], now=clock.t, free_slots=0).pressing
    assert s.plan_talker([comfy, running(2)], now=clock.t, free_slots=0).pressing
    clock.advance(4.5)
    assert s.plan_talker([comfy], now=clock.t, free_slots=0).pressing


def test_a_partial_chunk_is_decoded_when_the_listener_would_run_dry_within_two_cycles() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(ramp=(2, 8), flush_margin_s=0.05))
    r = running(1, pending=3, chunks_sent=1, audio_s=0.16, first_audio_at=clock.t)  # next chunk: 8
    # 0.16 s of audio outlasts two 0.05 s cycles and the margin: keep collecting frames.
    assert s.plan_codec([r], now=clock.t, talker_pressing=False, cycle_s=0.05).chunks == ()
    # With 0.06 s cycles it would not: decode the 3 frames there are now.
    assert s.plan_codec([r], now=clock.t, talker_pressing=False, cycle_s=0.06).chunks == ((1, 3),)
    clock.advance(0.1)  # the buffer drained to 0.06 s: even fast cycles cannot wait
    assert s.plan_codec([r], now=clock.t, talker_pressing=False, cycle_s=0.01).chunks == ((1, 3),)


def test_a_parked_stream_speaks_what_it_has() -> None:
    s = Scheduler(SchedulerConfig(ramp=(4,)))
    r = running(1, pending=1)  # no audio yet, one frame, text ran dry
    assert s.plan_codec([r], now=0.0, talker_pressing=False).chunks == ()
    r.to(Status.PARKED)
    assert s.plan_codec([r], now=0.0, talker_pressing=False).chunks == ((1, 1),)


def parked(rid: int, since: float, **kw: object) -> RequestRecord:
    r = running(rid, **kw)  # type: ignore[arg-type]
    r.to(Status.PARKED, since)
    return r


def test_streams_with_text_and_no_free_slot_are_reported_blocked_in_line_order() -> None:
    s = Scheduler()
    recs = [RequestRecord(i, arrival=float(i), has_text=True) for i in (3, 1, 2)]
    plan = s.plan_talker(recs, now=5.0, free_slots=1)
    assert plan.prefill == 1
    assert plan.blocked == ((2, 1), (3, 2))  # (request, streams ahead of it)
    assert s.plan_talker(recs, now=5.0, free_slots=0).blocked == ((1, 0), (2, 1), (3, 2))
    assert s.plan_talker(recs, now=5.0, free_slots=3).blocked == ()


def test_a_stream_continuing_at_its_frame_cap_is_first_in_line() -> None:
    s = Scheduler()
    new = RequestRecord(1, arrival=0.0, has_text=True)
    going_on = RequestRecord(2, arrival=9.0, has_text=True, status=Status.RESUMING)
    assert s.plan_talker([new, going_on], now=10.0, free_slots=1).prefill == 2


def test_a_long_parked_request_gives_its_slot_to_a_waiting_stream() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(park_evict_s=1.0))
    idle = [parked(1, since=clock.t), parked(2, since=clock.t + 0.5)]
    waiting = RequestRecord(3, arrival=clock.t, has_text=True)
    assert s.plan_evictions([*idle, waiting], now=clock.advance(0.9), free_slots=0) == ()  # not long enough
    assert s.plan_evictions([*idle], now=clock.advance(5.0), free_slots=0) == ()  # nobody waits: keep it
    assert s.plan_evictions([*idle, waiting], now=clock.t, free_slots=0) == (1,)  # longest parked, one needed
    assert s.plan_evictions([*idle, waiting], now=clock.t, free_slots=1) == ()  # a slot is free anyway
    idle[0].to(Status.EVICTING)  # already giving its slot up: that covers the one waiting
    assert s.plan_evictions([*idle, waiting], now=clock.t, free_slots=0) == ()
    second = RequestRecord(4, arrival=clock.t, has_text=True)
    assert s.plan_evictions([*idle, waiting, second], now=clock.t, free_slots=0) == (2,)


def test_a_paused_or_busy_request_is_not_evicted() -> None:
    s = Scheduler(SchedulerConfig(park_evict_s=0.0))
    paused = parked(1, since=0.0)
    paused.paused = True
    busy = running(2)  # generating, has text: not parked
    waiting = RequestRecord(3, arrival=0.0, has_text=True)
    assert s.plan_evictions([paused, busy, waiting], now=10.0, free_slots=0) == ()


def test_a_request_moves_only_along_the_allowed_transitions() -> None:
    r = RequestRecord(1, 0.0)
    assert r.status is Status.WAITING and not r.admitted and r.generating is False
    # One stream's life: admitted, parks, resumes, is evicted, drains, queues again, runs, ends.
    for step in (Status.RUNNING, Status.PARKED, Status.RUNNING, Status.PARKED, Status.EVICTING, Status.EVICTED,
                 Status.WAITING, Status.RUNNING, Status.DRAINING, Status.RESUMING, Status.RUNNING, Status.ENDED):
        assert step in TRANSITIONS[r.status]
        r.to(step, now=3.0)
        assert r.status is step
        assert (r.parked_since == 3.0) == (step is Status.PARKED)
    assert r.ended and not TRANSITIONS[Status.ENDED]
    with pytest.raises(AssertionError, match="ENDED → RUNNING"):
        r.to(Status.RUNNING)
    evicted = RequestRecord(2, 0.0, status=Status.EVICTED)
    with pytest.raises(AssertionError):
        evicted.to(Status.RESUMING)  # a request that gave its slot up queues behind the others
    assert all(Status.ENDED in TRANSITIONS[s] for s in Status if s is not Status.ENDED)  # any may end


def test_the_flags_the_policy_reads_follow_the_status() -> None:
    facts = {s: (r.admitted, r.generating, r.parked, r.evicting, r.resume)
             for s in Status for r in [RequestRecord(1, 0.0, status=s)]}
    assert facts[Status.WAITING] == (False, False, False, False, False)
    assert facts[Status.RESUMING] == (False, False, False, False, True)
    assert facts[Status.RUNNING] == (True, True, False, False, False)
    assert facts[Status.PARKED] == (True, True, True, False, False)
    assert facts[Status.EVICTING] == (True, True, False, True, False)
    assert facts[Status.DRAINING] == (True, False, False, False, False)
    assert facts[Status.EVICTED] == (True, False, False, True, False)
    assert facts[Status.ENDED] == (False, False, False, False, False)


def held(pending: int, left: float, first_frame_at: float = 0.0) -> RequestRecord:
    r = running(1, pending=pending)
    r.first_frame_at, r.frames_left = first_frame_at, left
    return r


def test_a_first_audio_is_held_while_the_rest_of_its_text_would_come_after_its_listener_needs_it() -> None:
    # 12.5 frames/s played, 10 made: 52 frames take 5.2 s to make and 4.16 s to play.
    s = Scheduler(SchedulerConfig(ramp=(2,), hold_error=0.0, flush_margin_s=0.05, first_hold_s=10.0))
    assert s.plan_codec([held(2, 50)], now=1.0, talker_pressing=False, stream_rate=10.0).chunks == ()
    # With 11 in hand the last of the 41 to come is due 4.16 s from now and made in 4.1 s: let go.
    assert s.plan_codec([held(11, 41)], now=1.0, talker_pressing=False, stream_rate=10.0).chunks == ((1, 2),)
    assert s.plan_codec([held(10, 42)], now=1.0, talker_pressing=False, stream_rate=10.0).chunks == ()
    # The margin: two cycles and flush_margin_s early.
    assert s.plan_codec([held(11, 41)], now=1.0, talker_pressing=False, cycle_s=0.2, stream_rate=10.0).chunks == ()
    # The measured rate is taken hold_error too fast.
    wary = Scheduler(SchedulerConfig(ramp=(2,), hold_error=0.25, flush_margin_s=0.05, first_hold_s=10.0))
    assert wary.plan_codec([held(11, 41)], now=1.0, talker_pressing=False, stream_rate=10.0).chunks == ()


def test_a_stream_made_faster_than_it_plays_is_not_held() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2,), hold_error=0.15))
    assert s.plan_codec([held(2, 500)], now=1.0, talker_pressing=False, stream_rate=15.0).chunks == ((1, 2),)
    assert not s.holds_first(held(2, 500), now=1.0, cycle_s=0.01, stream_rate=15.0)


def test_the_first_audio_hold_is_bounded_and_only_while_the_talker_makes_its_frames() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2,), first_hold_s=2.0))
    slow = 5.0  # frames/s: far below the 12.5 played
    assert s.holds_first(held(2, 100, first_frame_at=0.0), now=1.99, cycle_s=0.0, stream_rate=slow)
    assert not s.holds_first(held(2, 100, first_frame_at=0.0), now=2.0, cycle_s=0.0, stream_rate=slow)
    parked_on_text = held(2, 100)
    parked_on_text.to(Status.PARKED, 0.5)  # its text has not come: it speaks what it has
    assert not s.holds_first(parked_on_text, now=1.0, cycle_s=0.0, stream_rate=slow)
    done = held(2, 100)
    done.to(Status.DRAINING)
    assert not s.holds_first(done, now=1.0, cycle_s=0.0, stream_rate=slow)
    assert not s.holds_first(held(2, 100), now=1.0, cycle_s=0.0, stream_rate=None)  # nothing measured yet
    heard = held(2, 100)
    heard.first_audio_at = 0.5  # only the first audio is held: a listener who hears must keep hearing
    assert not s.holds_first(heard, now=1.0, cycle_s=0.0, stream_rate=slow)
    assert not Scheduler(SchedulerConfig(first_hold_s=0.0)).holds_first(held(2, 100), now=0.0, cycle_s=0.0,
                                                                        stream_rate=slow)


def test_a_continuations_first_audio_counts_the_audio_before_it_and_goes_before_that_runs_out() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2,), hold_error=0.0, flush_margin_s=0.05, first_hold_s=10.0))
    alone = held(2, 50)  # 5 s to make, 4.16 s to play: held, as above
    assert s.holds_first(alone, now=1.0, cycle_s=0.0, stream_rate=10.0)
    behind = held(2, 50)
    behind.before = ListenerTimeline(2.0)  # its listener hears 1 s more of the sentence before it
    assert not s.holds_first(behind, now=1.0, cycle_s=0.0, stream_rate=10.0)
    much = held(2, 100)  # 10 s to make, 8.16 s to play, 1 s ahead: held, but not once its listener runs dry
    much.before = ListenerTimeline(2.0)
    assert s.holds_first(much, now=1.0, cycle_s=0.0, stream_rate=10.0)
    assert s.holds_first(much, now=1.94, cycle_s=0.0, stream_rate=10.0)
    assert not s.holds_first(much, now=1.96, cycle_s=0.0, stream_rate=10.0)


# ---- a listener already hearing a gap (its timeline's end is past): the rules read `ListenerTimeline`,
# whose `ahead_s` is never below zero, so these hold the cases where that could have changed a decision.

def test_the_listener_who_has_heard_a_gap_longest_is_the_most_urgent() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(max_batch=1, buckets=(1,)))
    short_gap = running(1, audio_s=1.0, first_audio_at=clock.t)
    long_gap = running(2, audio_s=0.5, first_audio_at=clock.t)
    clock.advance(3.0)  # both ran dry: 2 s and 2.5 s ago
    assert s.plan_talker([short_gap, long_gap], now=clock.t, free_slots=0).step == (2,)
    plan = s.plan_codec([running(3, pending=2, chunks_sent=3, audio_s=1.0, first_audio_at=clock.t - 3.0),
                         running(4, pending=2, chunks_sent=3, audio_s=0.5, first_audio_at=clock.t - 3.0)],
                        now=clock.t, talker_pressing=False, cycle_s=0.0)
    assert [rid for rid, _ in plan.chunks] == [4, 3]


def test_a_listener_hearing_a_gap_is_pressing_and_never_deferred() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(ramp=(2,), low_water_s=1.0, defer_s=0.0))
    dry = running(1, pending=2, chunks_sent=3, audio_s=1.0, first_audio_at=clock.t)
    clock.advance(5.0)
    assert s.plan_talker([dry], now=clock.t, free_slots=0).pressing
    assert s.plan_codec([dry], now=clock.t, talker_pressing=True).chunks == ((1, 2),)


def test_a_partial_chunk_of_a_listener_hearing_a_gap_decodes_at_once_even_with_no_margin() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(ramp=(2, 8), flush_margin_s=0.0))
    r = running(1, pending=3, chunks_sent=1, audio_s=0.5, first_audio_at=clock.t)  # next chunk: 8
    assert s.plan_codec([r], now=clock.t, talker_pressing=False, cycle_s=0.0).chunks == ()  # 0.5 s ahead
    clock.advance(0.5)  # runs dry now: the decode had to start by now
    assert s.plan_codec([r], now=clock.t, talker_pressing=False, cycle_s=0.0).chunks == ()
    clock.advance(0.01)
    assert s.plan_codec([r], now=clock.t, talker_pressing=False, cycle_s=0.0).chunks == ((1, 3),)


def test_a_continuation_whose_earlier_audio_has_run_out_is_not_held() -> None:
    s = Scheduler(SchedulerConfig(ramp=(2,), hold_error=0.0, flush_margin_s=0.0, first_hold_s=10.0))
    late = held(2, 100)  # 10 s to make, 8.16 s to play: a newcomer's first audio would be held
    assert s.holds_first(late, now=3.0, cycle_s=0.0, stream_rate=10.0)
    late.before = ListenerTimeline(2.0)  # its listener heard the audio before it run out 1 s ago
    assert not s.holds_first(late, now=3.0, cycle_s=0.0, stream_rate=10.0)


@pytest.mark.parametrize("bad", [{"low_water_s": 0.0}, {"defer_s": -1.0}, {"flush_margin_s": -0.01}])
def test_bounds_on_seconds_ahead_that_could_never_be_crossed_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(**bad)  # type: ignore[arg-type]
