"""The core's text track without the core thread: the tiny checkpoint's real tokenizer over plain streams."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future

import pytest

from engine.qwen3 import make_tiny_checkpoint
from engine.qwen3.generate import SamplingParams
from engine.qwen3.serving.core_stream import CoreStream, StreamOptions, TalkerRequest
from engine.qwen3.serving.scheduler import RequestRecord
from engine.qwen3.serving.text_track import Pace, TextTrack, TrackLimits
from engine.qwen3.text import TextTokenizer

PROMPT_ROWS = 10
LIMITS = TrackLimits(max_context=64, min_frames=6, frames_per_token=2.0, hold_more_frames=5.0)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    return TextTokenizer.from_dir(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture
def track(tokenizer: TextTokenizer) -> TextTrack:
    return TextTrack(tokenizer, LIMITS, lambda _s: PROMPT_ROWS)


def stream_with(*pieces: str) -> CoreStream:
    opts = StreamOptions("ryan", "english", None, 24000, SamplingParams())
    s = CoreStream(1, opts, bridge=None, record=RequestRecord(1, 0.0))  # type: ignore[arg-type]
    s.pending_text = deque(enumerate(pieces))
    s.segments = len(pieces)
    s.ledger.appended = sum(len(p) for p in pieces)
    return s


def test_a_pieces_trailing_space_is_carried_before_the_next_word(track: TextTrack, tokenizer: TextTokenizer) -> None:
    ids, carry = track.piece_ids("", "hello ")
    assert (ids, carry) == (tokenizer.encode("hello"), " ")
    ids, carry = track.piece_ids(carry, "world. ")
    assert ids == tokenizer.encode(" world.") and carry == " "
    assert track.piece_ids(carry, "  ") == ([], "   ")  # whitespace only: all carried


def test_the_budget_leaves_room_for_the_frame_cap_after_the_prompt(track: TextTrack) -> None:
    s = stream_with("hi ")
    budget = track.budget(s)
    assert budget == (64 - PROMPT_ROWS - 6) // 2
    talk = TalkerRequest(token_segments=[0] * budget, prompt_len=PROMPT_ROWS)
    assert track.frame_cap(talk) <= 64 - PROMPT_ROWS  # the cap never runs past the slot's positions


def test_a_request_takes_whole_pieces_while_they_fit(track: TextTrack, tokenizer: TextTokenizer) -> None:
    s = stream_with("one two ", "three ", "four five six seven eight nine ten ")
    first = tokenizer.content_ids("one two")
    second = track.piece_ids(" ", "three ")[0]
    ids, segments = track.take(s, len(first) + len(second) + 1)
    assert ids == first + second and segments == [0] * len(first) + [1] * len(second)
    assert list(s.pending_text) == [(2, "four five six seven eight nine ten ")]  # it goes to the next request
    assert s.ledger.pending == len("four five six seven eight nine ten ") and s.carry == " "


def test_a_piece_larger_than_a_request_is_cut_at_a_word_boundary(track: TextTrack, tokenizer: TextTokenizer) -> None:
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa "
    s = stream_with(text)
    budget = len(tokenizer.content_ids("alpha beta gamma")) + 1
    ids, segments = track.take(s, budget)
    assert 0 < len(ids) <= budget and set(segments) == {0}
    head = tokenizer.decode(ids)
    rest = s.pending_text[0][1]
    assert rest and (head + " " + rest).split() == text.split()  # nothing lost, no word split
    assert s.ledger.taken + len(rest) == len(text)


def test_tokens_the_model_did_not_reach_go_back_in_front_of_the_pending_text(track: TextTrack) -> None:
    s = stream_with("first piece ", "second piece ", "third ")
    ids, segments = track.take(s, 100)
    assert not s.pending_text
    s.talk = TalkerRequest(ids=ids, token_segments=segments, track_offset=1, frames=2, ended_by_eos=True)
    consumed = track.account(s)
    assert consumed == 3 and s.fed_tokens == 3 and s.fed_segments == len(set(segments[:3]))
    back = "".join(text for _, text in s.pending_text)
    assert back.split()[-1] == "third" and [seg for seg, _ in s.pending_text][-1] == 2
    assert s.ledger.pending == len(back)  # the ledger counts the returned text as pending again


def test_a_request_that_consumed_all_its_text_returns_nothing(track: TextTrack) -> None:
    s = stream_with("all of it ")
    ids, segments = track.take(s, 100)
    s.talk = TalkerRequest(ids=ids, token_segments=segments, track_offset=1, frames=len(ids), ended_by_eos=True)
    assert track.account(s) == len(ids) and not s.pending_text


def test_a_stream_is_admitted_only_with_text_and_a_ready_voice(track: TextTrack) -> None:
    assert not track.can_admit(stream_with("   "))  # whitespace is not text to speak
    s = stream_with("hello ")
    assert track.can_admit(s)
    s.voice = Future()  # its cloned voice is still being made
    assert not track.can_admit(s)
    s.voice = None
    s.talk = TalkerRequest(slot=0)  # it holds a slot already
    assert not track.can_admit(s)


def test_frames_left_counts_text_still_to_come(track: TextTrack) -> None:
    s = stream_with()
    s.talk = TalkerRequest(token_segments=[0] * 5, frames=2, prompt_len=PROMPT_ROWS)
    assert track.frames_left(s, None) == 3 + LIMITS.hold_more_frames  # unmeasured: one frame a row
    s.finished = True
    assert track.frames_left(s, 2.0) == 8  # 5 rows × 2 less the 2 made


def test_unspoken_names_the_taken_and_the_pending_text(track: TextTrack) -> None:
    s = stream_with("spoken ", "later ")
    ids, segments = track.take(s, len(track.tokenizer.content_ids("spoken")))
    s.talk = TalkerRequest(ids=ids, token_segments=segments)
    said = track.unspoken(s)
    assert "spoken" in said and "later" in said


def test_the_pace_is_measured_after_three_requests_then_smoothed() -> None:
    pace = Pace(min_requests=3, alpha=0.5)
    done = TalkerRequest(token_segments=[0] * 10, frames=20, ended_by_eos=True)
    pace.observe(TalkerRequest(token_segments=[0] * 10, frames=20))  # the frame cap stopped it: no measure
    pace.observe(done)
    pace.observe(done)
    assert pace.frames_per_row is None
    pace.observe(done)
    assert pace.frames_per_row == 2.0
    pace.observe(TalkerRequest(token_segments=[0] * 10, frames=40, ended_by_eos=True))
    assert pace.frames_per_row == 3.0

