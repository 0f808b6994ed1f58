"""The CPU voices' scheduling rules (engine/cpu/policy.py) and the listener's timeline
(engine/listening.py), each on a fake clock: plain numbers for `now`, no threads, no model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from engine.cpu import policy
from engine.cpu.policy import DEFAULT, TRANSITIONS, PendingPiece, RunningJob, StreamStatus
from engine.listening import HoldRule, ListenerTimeline, holds_first

NOW = 1000.0  # the fake clock's reading
CPU_HOLD = HoldRule(DEFAULT.first_hold_s, DEFAULT.hold_margin_s, DEFAULT.hold_margin_s)


# ---- the pool's order ----


def test_a_playing_stream_about_to_run_dry_goes_before_a_newcomer() -> None:
    due = policy.rank(NOW + 0.3, 5, False, NOW, guard_s=1.0)
    newcomer = policy.rank(NOW - 10.0, 1, True, NOW, guard_s=1.0)
    assert due < newcomer


def test_a_newcomer_goes_before_a_playing_stream_with_time_to_spare() -> None:
    newcomer = policy.rank(NOW, 9, True, NOW, guard_s=1.0)
    comfortable = policy.rank(NOW + 5.0, 1, False, NOW, guard_s=1.0)
    assert newcomer < comfortable


def test_playing_streams_run_earliest_deadline_first_and_ties_in_submission_order() -> None:
    ranks = [policy.rank(d, seq, False, NOW, 1.0) for d, seq in ((NOW + 4, 0), (NOW + 3, 1), (NOW + 3, 2))]
    assert sorted(ranks) == [ranks[1], ranks[2], ranks[0]]


def test_newcomers_are_served_oldest_first() -> None:
    assert policy.rank(NOW - 2.0, 7, True, NOW, 1.0) < policy.rank(NOW - 1.0, 3, True, NOW, 1.0)


def test_a_newcomer_waits_when_a_playing_stream_would_run_dry_during_its_run() -> None:
    # The newcomer's run (2 s) outlasts the guard: the playing stream due in 1.5 s goes first.
    assert not policy.first_goes_next(first_run_s=2.0, rest_deadline=NOW + 1.5, now=NOW, guard_s=1.0)
    assert policy.first_goes_next(first_run_s=0.5, rest_deadline=NOW + 1.5, now=NOW, guard_s=1.0)
    assert policy.first_goes_next(first_run_s=9.0, rest_deadline=None, now=NOW, guard_s=1.0)


def test_the_guard_is_two_long_runs_but_never_under_half_a_second() -> None:
    assert policy.guard_s(0.1) == DEFAULT.guard_min_s
    assert policy.guard_s(0.7) == pytest.approx(1.4)


# ---- giving a worker up ----


def running(key: int, *, deadline: float, run_s: float, started: float, wasted_s: float = 0.0,
            first: bool = False, can_yield: bool = True) -> RunningJob:
    return RunningJob(key, deadline, run_s, started, wasted_s, first, can_yield)


def test_an_urgent_piece_takes_the_worker_of_the_run_with_most_time_to_spare() -> None:
    jobs = [running(1, deadline=NOW + 10, run_s=4.0, started=NOW - 0.1),
            running(2, deadline=NOW + 20, run_s=4.0, started=NOW - 0.1)]
    assert policy.choose_victim(NOW + 0.2, False, 0.5, jobs, NOW, guard=1.0) == 2


def test_no_worker_is_taken_for_a_piece_that_can_wait() -> None:
    jobs = [running(1, deadline=NOW + 20, run_s=4.0, started=NOW - 0.1)]
    assert policy.choose_victim(NOW + 5.0, False, 0.5, jobs, NOW, guard=1.0) is None


def test_a_run_about_to_end_keeps_its_worker() -> None:
    jobs = [running(1, deadline=NOW + 20, run_s=1.0, started=NOW - 0.9)]  # 0.1 s left < yield_min_s
    assert policy.choose_victim(NOW, True, 0.5, jobs, NOW, guard=1.0) is None


def test_a_run_that_already_threw_away_half_its_time_keeps_its_worker() -> None:
    jobs = [running(1, deadline=NOW + 20, run_s=4.0, started=NOW - 0.5, wasted_s=1.6)]
    assert policy.choose_victim(NOW, True, 0.5, jobs, NOW, guard=1.0) is None


def test_a_run_that_could_not_start_again_by_its_own_deadline_keeps_its_worker() -> None:
    jobs = [running(1, deadline=NOW + 1.0, run_s=4.0, started=NOW - 0.1)]
    assert policy.choose_victim(NOW, True, 0.5, jobs, NOW, guard=1.0) is None


def test_a_newcomers_first_audio_gives_way_to_a_playing_streams_due_piece() -> None:
    jobs = [running(1, deadline=NOW, run_s=4.0, started=NOW - 0.1, first=True)]  # its deadline is its age
    assert policy.choose_victim(NOW + 0.2, False, 0.5, jobs, NOW, guard=1.0) == 1


def test_a_run_asked_once_or_without_a_yield_hook_is_not_asked() -> None:
    jobs = [running(1, deadline=NOW + 20, run_s=4.0, started=NOW - 0.1, can_yield=False)]
    assert policy.choose_victim(NOW, True, 0.5, jobs, NOW, guard=1.0) is None


# ---- a stream's pieces ----


def test_a_piece_is_due_when_its_listener_runs_dry_less_its_own_run() -> None:
    assert policy.piece_deadline(ListenerTimeline(NOW + 2.0), [1.0, 0.5], run_s=0.4) == pytest.approx(NOW + 3.1)


def test_a_piece_is_left_whole_when_its_listener_has_plenty_ahead() -> None:
    assert policy.ramp_limit(120, 7.0, slack_s=30.0, rtf=0.1, share=1.0) >= 120


def test_a_piece_behind_little_audio_is_cut_to_a_share_of_it_but_not_below_a_clause() -> None:
    # 2 s of slack at RTF 0.2 make 10 s of audio; half of it for a 120-letter, 10 s piece: 60 letters.
    assert policy.ramp_limit(120, 10.0, slack_s=2.0, rtf=0.2, share=1.0) == 60
    assert policy.ramp_limit(120, 10.0, slack_s=0.0, rtf=0.2, share=1.0) == DEFAULT.ramp_min_cost


def test_streams_sharing_the_workers_each_cut_to_their_part_but_not_below_the_cheap_bound() -> None:
    # Six streams on two workers: each may count on a third of the workers for the audio ahead.
    assert policy.ramp_limit(120, 10.0, slack_s=2.0, rtf=0.2, share=1 / 3) == DEFAULT.share_min_cost
    assert policy.ramp_limit(120, 10.0, slack_s=6.0, rtf=0.2, share=1 / 3) == 120


def test_a_smaller_piece_bound_in_the_config_bounds_every_piece() -> None:
    cfg = replace(DEFAULT, kokoro_piece_cost=30)
    assert cfg.piece_limit("kokoro") == 30 and cfg.piece_limit("piper") == DEFAULT.piper_piece_cost


def test_the_holds_error_is_cold_until_measured_then_follows_the_overrun_within_bounds() -> None:
    assert policy.hold_error(None) == DEFAULT.hold_error_cold
    assert policy.hold_error(0.8) == DEFAULT.hold_error
    assert policy.hold_error(1.6) == pytest.approx(0.6)
    assert policy.hold_error(9.0) == DEFAULT.hold_error_max


def test_a_waiting_notice_is_due_once_the_listener_is_dry_and_the_piece_waited() -> None:
    assert policy.notice_due(queued_at=NOW, sent=ListenerTimeline(NOW - 5)) == NOW + DEFAULT.notice_after_s
    assert policy.notice_due(queued_at=NOW, sent=ListenerTimeline(NOW + 3)) == NOW + 3


def test_a_continuations_deadlines_move_only_when_the_audio_before_it_moved_past_follow_s() -> None:
    assert policy.moved(ListenerTimeline(NOW), None)
    assert not policy.moved(ListenerTimeline(NOW + DEFAULT.follow_s / 2), ListenerTimeline(NOW))
    assert policy.moved(ListenerTimeline(NOW + 2 * DEFAULT.follow_s), ListenerTimeline(NOW))


# ---- the first-audio hold ----


def test_first_audio_goes_at_once_when_the_rest_is_made_in_time() -> None:
    pending = [PendingPiece(seconds=3.0, run_s=0.5, start=None)]  # made 0.5 s from now, needed in 2 s
    late = policy.first_audio_late(NOW, ListenerTimeline(NOW + 2.0),
                                   pending, more_text=False, free_at=NOW, next_run_s=1.0)
    assert not holds_first(NOW, NOW, late, None, CPU_HOLD)


def test_first_audio_is_held_while_the_next_piece_would_come_after_it_has_played() -> None:
    pending = [PendingPiece(seconds=3.0, run_s=2.0, start=NOW + 0.5)]  # waits for a worker, then runs 2 s
    late = policy.first_audio_late(NOW, ListenerTimeline(NOW + 1.0),
                                   pending, more_text=False, free_at=NOW, next_run_s=1.0)
    assert late == pytest.approx(1.5)
    assert holds_first(NOW, NOW, late, None, CPU_HOLD)


def test_made_pieces_count_as_audio_the_listener_has() -> None:
    pending = [PendingPiece(3.0, 0.1, None, made_s=3.0), PendingPiece(2.0, 3.5, None)]
    late = policy.first_audio_late(NOW, ListenerTimeline(NOW + 1.0),
                                   pending, more_text=False, free_at=NOW, next_run_s=1.0)
    assert late == pytest.approx(-0.5)  # the 2nd comes at +3.5, needed at +4


def test_text_still_to_come_is_taken_as_one_more_piece_from_when_a_worker_is_free() -> None:
    late = policy.first_audio_late(NOW, ListenerTimeline(NOW + 1.0),
                                   [], more_text=True, free_at=NOW + 1.0, next_run_s=0.8)
    assert late == pytest.approx(0.8)
    assert policy.first_audio_late(NOW, ListenerTimeline(NOW + 1.0),
                                   [], more_text=False, free_at=NOW, next_run_s=0.8) == -math.inf


def test_the_hold_ends_after_first_hold_s_whatever_the_prediction() -> None:
    assert holds_first(NOW + DEFAULT.first_hold_s - 0.01, NOW, 5.0, None, CPU_HOLD)
    assert not holds_first(NOW + DEFAULT.first_hold_s, NOW, 5.0, None, CPU_HOLD)


def test_a_continuation_is_not_held_past_the_end_of_the_audio_before_it() -> None:
    before = ListenerTimeline(NOW + 0.5)
    assert policy.hold_until(NOW, before) + DEFAULT.hold_margin_s == pytest.approx(NOW + 0.5)
    assert holds_first(NOW + 0.4, NOW, 5.0, before, CPU_HOLD)
    assert not holds_first(NOW + 0.46, NOW, 5.0, before, CPU_HOLD)


# ---- a stream's plan ----


def held(pending: list[PendingPiece], *, ready_at: float = NOW, before: ListenerTimeline | None = None,
         runs_out_at: float = NOW + 1.0, more_text: bool = False, free_at: float = NOW,
         next_run_s: float = 1.0) -> policy.HeldAudio:
    return policy.HeldAudio(ready_at, before, ListenerTimeline(runs_out_at), tuple(pending), more_text, free_at,
                            next_run_s)


def test_a_stream_with_nothing_held_or_due_sleeps_until_an_event() -> None:
    assert policy.stream_plan(NOW, None, None) == policy.StreamPlan(release=True, notice=False, wake_at=None)


def test_a_waiting_notice_goes_when_due_and_not_before() -> None:
    assert policy.stream_plan(NOW, NOW + 0.3, None) == policy.StreamPlan(True, False, NOW + 0.3)
    assert policy.stream_plan(NOW + 0.3, NOW + 0.3, None).notice


def test_held_first_audio_goes_at_once_when_the_rest_comes_in_time() -> None:
    made_in_time = held([PendingPiece(seconds=3.0, run_s=0.5, start=None)])
    assert policy.stream_plan(NOW, None, made_in_time).release


def test_held_first_audio_wakes_when_a_piece_that_starts_later_would_come_in_time() -> None:
    # The next piece waits for a worker until +0.5, runs 2 s: 1.5 s late against 1 s of held audio.
    # Held, the lateness runs off as the hold lasts: it goes when 1.5 s less the margin have passed.
    waits = held([PendingPiece(seconds=3.0, run_s=2.0, start=NOW + 0.5)])
    plan = policy.stream_plan(NOW, None, waits)
    assert not plan.release
    assert plan.wake_at == pytest.approx(NOW + 1.5 - DEFAULT.hold_margin_s)
    runs_out_at = waits.heard.runs_out_at + (plan.wake_at - NOW)
    later = replace(waits, heard=ListenerTimeline(runs_out_at))  # nothing else changed
    assert policy.stream_plan(plan.wake_at, None, later).release


def test_held_first_audio_waits_for_an_event_or_the_cap_when_waiting_does_not_shorten_the_lateness() -> None:
    # Text still to come from a free worker: held longer, it comes later by as much. Only an event (its
    # text cut, a worker freed) or `first_hold_s` ends the hold: no timer before the cap.
    more = held([], more_text=True, free_at=NOW, next_run_s=1.5)
    plan = policy.stream_plan(NOW, None, more)
    assert not plan.release and plan.wake_at == pytest.approx(NOW + DEFAULT.first_hold_s)
    assert policy.stream_plan(NOW + DEFAULT.first_hold_s, None, more).release


def test_a_held_continuation_wakes_no_later_than_the_audio_before_it_ends_less_the_margin() -> None:
    waits = held([PendingPiece(seconds=3.0, run_s=2.0, start=NOW + 0.5)], before=ListenerTimeline(NOW + 0.8))
    plan = policy.stream_plan(NOW, None, waits)
    assert not plan.release and plan.wake_at == pytest.approx(NOW + 0.8 - DEFAULT.hold_margin_s)
    assert policy.stream_plan(plan.wake_at, None, waits).release


def test_a_new_listeners_first_piece_is_left_whole_and_later_ones_ramp() -> None:
    assert policy.piece_cost(True, 120, 7.0, 0.2, 0.5, 1.0) == 120
    assert policy.piece_cost(False, 120, 7.0, 0.2, 0.5, 1.0) == DEFAULT.ramp_min_cost


def test_the_qwen3_hold_must_be_early_by_its_margin_not_merely_on_time() -> None:
    rule = HoldRule(cap_s=2.0, margin_s=0.2, tolerance_s=-0.2)
    assert holds_first(NOW, NOW, -0.1, None, rule)  # on time by 0.1 s: not early enough
    assert not holds_first(NOW, NOW, -0.3, None, rule)


# ---- a stream's status ----


def test_a_stream_moves_only_along_the_transition_table() -> None:
    status = StreamStatus.NEW
    for to in (StreamStatus.HELD, StreamStatus.PLAYING, StreamStatus.ENDED):
        status = policy.advance(status, to)
    with pytest.raises(ValueError):
        policy.advance(StreamStatus.PLAYING, StreamStatus.HELD)
    with pytest.raises(ValueError):
        policy.advance(StreamStatus.ENDED, StreamStatus.PLAYING)


def test_a_continuation_whose_earlier_stream_ended_unheard_becomes_a_new_listeners() -> None:
    assert policy.advance(StreamStatus.FOLLOWING, StreamStatus.NEW) is StreamStatus.NEW
    assert StreamStatus.FOLLOWING not in TRANSITIONS[StreamStatus.NEW]


def test_every_status_can_end() -> None:
    assert all(StreamStatus.ENDED in allowed for s, allowed in TRANSITIONS.items() if s is not StreamStatus.ENDED)


# ---- the listener's timeline ----


def test_a_listener_runs_dry_after_the_audio_sent_and_the_queue_behind_it() -> None:
    timeline = ListenerTimeline(NOW + 2.0).then(1.5)
    assert timeline.dry_at == NOW + 3.5 and timeline.ahead_s(NOW) == pytest.approx(3.5)
    assert timeline.start_by(0.5) == NOW + 3.0
    assert ListenerTimeline(NOW - 1).ahead_s(NOW) == 0.0


def test_a_continuation_plays_no_sooner_than_the_audio_before_it_ends() -> None:
    own = ListenerTimeline(NOW, queued_s=1.0)
    assert own.after(ListenerTimeline(NOW + 2.0)).dry_at == NOW + 3.0
    assert own.after(ListenerTimeline(NOW - 2.0)) is own
    assert own.after(None) is own


def test_a_buffer_in_seconds_becomes_a_timeline_on_the_monotonic_clock() -> None:
    assert ListenerTimeline.from_buffer(NOW, 2.5) == ListenerTimeline(NOW + 2.5)
    assert ListenerTimeline.from_buffer(NOW, None) is None


# ---- a listener's timeline through its streams' snapshots ----


def snap(status: StreamStatus = StreamStatus.PLAYING, *, first_put_at: float | None = None, sent_s: float = 0.0,
         held_s: float | None = None, before: ListenerTimeline | None = None,
         pieces: tuple[float, ...] = (), after: policy.StreamSnapshot | None = None) -> policy.StreamSnapshot:
    """A stream's snapshot; `after`: the snapshot of the stream before it (published, as a stream does)."""
    published = None if after is None else _Published(after)
    return policy.StreamSnapshot(status, False, False, True, first_put_at, sent_s, held_s, before,
                                 tuple(policy.PieceSnapshot(s, "piper", None, None) for s in pieces), published)


class _Published:
    def __init__(self, snapshot: policy.StreamSnapshot) -> None:
        self.snapshot = snapshot


def test_a_playing_streams_audio_ends_its_sent_seconds_after_its_first_chunk() -> None:
    playing = snap(first_put_at=NOW - 1.0, sent_s=3.0, pieces=(2.0,))
    assert policy.sent_timeline([playing], NOW).runs_out_at == NOW + 2.0
    assert policy.heard_timeline([playing], NOW) == ListenerTimeline(NOW + 2.0, 2.0)  # its pieces queued behind


def test_a_new_listener_with_nothing_submitted_hears_nothing_of_it() -> None:
    assert policy.heard_timeline([snap(StreamStatus.NEW)], NOW) is None
    assert policy.sent_timeline([snap(StreamStatus.NEW)], NOW).runs_out_at == NOW  # its first piece is due now


def test_held_first_audio_plays_from_its_release_which_is_no_sooner_than_now() -> None:
    held = snap(StreamStatus.HELD, held_s=1.5)
    assert policy.sent_timeline([held], NOW).runs_out_at == NOW + 1.5


def test_a_streams_audio_plays_after_the_stream_before_it_of_its_listener() -> None:
    earlier = snap(first_put_at=NOW - 1.0, sent_s=2.0, pieces=(3.0,))  # hears until NOW+1, then 3 s queued
    later = snap(StreamStatus.FOLLOWING, pieces=(1.0,), after=earlier)
    chain = policy.chain(later)
    assert chain == (later, earlier)
    assert policy.sent_timeline(chain, NOW).runs_out_at == NOW + 4.0
    # once its own audio is out, it starts no sooner than the earlier one has played
    out = replace(later, status=StreamStatus.PLAYING, first_put_at=NOW, sent_s=1.0)
    assert policy.sent_timeline(policy.chain(out), NOW).runs_out_at == NOW + 5.0


def test_the_audio_before_a_continuation_counts_when_the_stream_before_it_ended() -> None:
    cont = snap(StreamStatus.FOLLOWING, before=ListenerTimeline(NOW + 0.7))
    assert policy.sent_timeline([cont], NOW).runs_out_at == NOW + 0.7


# ---- the pool's plan ----


def queued(key: int, deadline: float, first: bool = False, run_s: float = 0.3) -> policy.QueuedJob:
    return policy.QueuedJob(key, deadline, first, run_s)


def busy(key: int, deadline: float = NOW + 30) -> RunningJob:
    """A look-ahead run of 5 s, started a moment ago."""
    return running(key, deadline=deadline, run_s=5.0, started=NOW - 0.1)


def test_the_plan_gives_a_free_worker_to_the_oldest_newcomer_while_no_playing_stream_is_close() -> None:
    jobs = [queued(1, NOW + 5.0), queued(2, NOW - 1.0, first=True), queued(3, NOW - 2.0, first=True)]
    assert policy.plan(jobs, [], 2, NOW, guard=1.0).next == 3


def test_the_plan_gives_a_free_worker_to_a_playing_stream_that_would_run_dry_during_the_newcomers_run() -> None:
    jobs = [queued(1, NOW + 2.0), queued(2, NOW - 1.0, first=True, run_s=3.0)]  # the newcomer's run: 3 s
    assert policy.plan(jobs, [], 2, NOW, guard=1.0).next == 1


def test_the_plan_takes_no_worker_while_one_is_free() -> None:
    jobs = [queued(1, NOW + 0.2)]
    assert policy.plan(jobs, [busy(7)], 2, NOW, guard=1.0).victim is None


def test_the_plan_takes_the_worker_of_a_look_ahead_for_a_due_job_when_every_worker_is_busy() -> None:
    decided = policy.plan([queued(1, NOW + 0.2)], [busy(7), busy(8, deadline=NOW + 60)], 2, NOW, guard=1.0)
    assert decided.next == 1 and decided.victim == 8  # the one with most time to spare


def test_the_plan_looks_again_when_the_most_urgent_playing_job_falls_within_the_guard() -> None:
    decided = policy.plan([queued(1, NOW + 5.0), queued(2, NOW + 9.0)], [busy(7)], 1, NOW, guard=1.0)
    assert decided.victim is None and decided.wake_at == NOW + 4.0


def test_the_plan_looks_again_when_a_playing_job_would_fall_due_within_the_newcomers_run() -> None:
    jobs = [queued(1, NOW + 5.0), queued(2, NOW - 1.0, first=True, run_s=2.5)]
    decided = policy.plan(jobs, [], 2, NOW, guard=1.0)
    assert decided.next == 2 and decided.wake_at == NOW + 2.5  # then the playing stream's goes first


def test_an_empty_plan_waits_for_an_event_not_a_timer() -> None:
    assert policy.plan([], [busy(7)], 1, NOW, guard=1.0) == policy.CpuPlan(None, None, None)
    past = policy.plan([queued(1, NOW + 0.5)], [], 1, NOW, guard=1.0)  # already within the guard
    assert past.next == 1 and past.wake_at is None


def test_a_job_due_never_sets_no_timer() -> None:
    assert policy.plan([queued(1, math.inf)], [busy(7)], 1, NOW, guard=1.0).wake_at is None
