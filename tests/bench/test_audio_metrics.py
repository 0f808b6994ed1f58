"""The load harness's metrics on synthetic signals whose answers are known by construction."""

from __future__ import annotations

import numpy as np
import pytest
from audio_metrics import (
    OnsetTracker,
    continuity,
    find_knee,
    frame_of_sample,
    pausing_player,
    percentile,
    ratio,
    rms_onset,
    summarize,
    window_rms_dbfs,
)

RATE = 24000


def tone(seconds: float, dbfs: float, freq: float = 440.0) -> np.ndarray:
    """A sine whose RMS is `dbfs` (a sine's RMS is its peak / sqrt 2)."""
    t = np.arange(round(seconds * RATE)) / RATE
    peak = 32768.0 * 10 ** (dbfs / 20) * np.sqrt(2)
    return np.round(peak * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), dtype=np.int16)


# -- percentiles ---------------------------------------------------------------------------------


def test_percentile_matches_numpy_linear() -> None:
    rng = np.random.default_rng(1)
    xs = rng.exponential(0.3, size=37).tolist()
    for q in (0, 50, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([4.0], 99) == 4.0


def test_percentile_of_nothing_is_none_not_zero() -> None:
    assert percentile([], 95) is None
    s = summarize([])
    assert s["n"] == 0 and s["p95"] is None and s["mean"] is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_summarize() -> None:
    s = summarize([0.1, 0.2, 0.3, 0.4, 1.0])
    assert s["n"] == 5 and s["max"] == 1.0 and s["p50"] == pytest.approx(0.3)
    assert s["mean"] == pytest.approx(0.4)
    assert s["p95"] == pytest.approx(0.88)


# -- onset ---------------------------------------------------------------------------------------


def test_window_level_of_a_known_sine() -> None:
    levels = window_rms_dbfs(tone(0.1, -20.0), 240)  # 10 ms windows hold 4.4 periods of 440 Hz
    assert len(levels) == 10
    assert np.all(np.abs(levels - -20.0) < 0.3)
    assert np.all(np.isneginf(window_rms_dbfs(silence(0.05), 240)))


def test_onset_skips_leading_silence_and_a_click() -> None:
    click = np.full(24, 20000, dtype=np.int16)  # 1 ms: loud but far shorter than 50 ms
    lead = np.concatenate([silence(0.3), click, silence(0.2 - 24 / RATE)])  # speech at exactly 0.5 s
    signal = np.concatenate([lead, tone(0.5, -20.0)])
    assert rms_onset(signal, RATE) == round(0.5 * RATE)


def test_onset_needs_the_level_sustained() -> None:
    # 30 ms bursts separated by silence never stay above threshold for 50 ms.
    burst = np.concatenate([tone(0.03, -10.0), silence(0.03)])
    assert rms_onset(np.tile(burst, 10), RATE) is None
    assert rms_onset(np.tile(burst, 10), RATE, sustain_ms=30.0) == 0


def test_onset_threshold() -> None:
    quiet = np.concatenate([silence(0.1), tone(0.5, -50.0)])
    assert rms_onset(quiet, RATE, threshold_dbfs=-40.0) is None
    assert rms_onset(quiet, RATE, threshold_dbfs=-60.0) == round(0.1 * RATE)


def test_onset_tracker_fed_in_pieces_agrees_with_whole() -> None:
    signal = np.concatenate([silence(0.237), tone(0.01, -10.0), silence(0.1), tone(0.4, -25.0)])
    whole = rms_onset(signal, RATE)
    assert whole is not None
    rng = np.random.default_rng(7)
    cuts = np.sort(rng.integers(1, len(signal), size=40))
    tracker = OnsetTracker(RATE)
    for piece in np.split(signal, cuts):
        tracker.feed(piece)
    assert tracker.onset == whole
    # Speech begins at sample 8328, 70% into the window starting at 8160, loud enough to count.
    assert whole == 8160


def test_frame_of_sample() -> None:
    assert frame_of_sample([100, 100, 50], 0) == 0
    assert frame_of_sample([100, 100, 50], 199) == 1
    assert frame_of_sample([100, 100, 50], 200) == 2
    assert frame_of_sample([100, 100, 50], 250) is None
    assert frame_of_sample([0, 10], 0) == 1  # an empty frame holds nothing


# -- the pausing player --------------------------------------------------------------------------


def test_player_with_steady_supply_never_stalls() -> None:
    arrivals = [0.1 * i for i in range(20)]  # 0.1 s of audio every 0.1 s, ahead of real time
    stats = pausing_player(arrivals, [100] * 20, 1000)
    assert stats.underruns == 0 and stats.stall_s == 0.0
    assert stats.start_time == 0.0 and stats.end_time == pytest.approx(2.0)


def test_player_counts_one_stall_with_its_length() -> None:
    # 0.5 s at t=0, 0.5 s at t=0.2 (plays out at 1.0), then 0.5 s that only comes at 1.5.
    stats = pausing_player([0.0, 0.2, 1.5], [500, 500, 500], 1000)
    assert stats.underruns == 1
    assert stats.stall_s == pytest.approx(0.5)
    assert stats.stalls == [(pytest.approx(1.0), pytest.approx(0.5))]
    assert stats.end_time == pytest.approx(2.0)


def test_player_starts_at_the_audible_sample() -> None:
    # Starting at sample 600 (in the frame that arrives at 0.2) leaves 0.4 s, dry at 0.6.
    stats = pausing_player([0.0, 0.2, 1.5], [500, 500, 500], 1000, start_sample=600)
    assert stats.start_time == 0.2
    assert stats.underruns == 1 and stats.stall_s == pytest.approx(0.9)
    assert pausing_player([0.0], [10], 1000, start_sample=10).start_time is None  # nothing audible


def test_player_prebuffer_delays_start_and_hides_jitter() -> None:
    arrivals = [0.0, 0.2, 0.45, 0.6]
    sizes = [200, 200, 200, 200]  # 0.2 s each; the third is 0.05 s late for a player starting at 0
    assert pausing_player(arrivals, sizes, 1000).underruns == 1
    buffered = pausing_player(arrivals, sizes, 1000, prebuffer_s=0.4)
    assert buffered.start_time == 0.2 and buffered.underruns == 0
    assert buffered.end_time == pytest.approx(1.0)


def test_player_rebuffers_after_a_stall() -> None:
    # After running dry at 0.1 it waits for 0.3 s buffered: frames at 1.0 and 1.1 give 0.2, 0.3.
    stats = pausing_player([0.0, 1.0, 1.1, 1.2], [100, 100, 100, 100], 1000, prebuffer_s=0.1)
    assert stats.underruns == 1 and stats.stall_s == pytest.approx(0.9)
    stats = pausing_player([0.0, 1.0, 1.1, 1.2], [100, 100, 100, 100], 1000, prebuffer_s=0.3)
    assert stats.start_time == 1.1  # 0.3 s first buffered once the third frame is in
    assert stats.underruns == 0


def test_player_rejects_mismatched_inputs() -> None:
    with pytest.raises(ValueError):
        pausing_player([0.0, 1.0], [10], 1000)


# -- vLLM-Omni's continuity rule -----------------------------------------------------------------


def test_continuity_known_deficit() -> None:
    # 8 kHz s16: 16000 bytes/s. 0.125 s at 0 and at 0.125 (deficit 0: not an event), then the
    # third chunk at 0.5 when only 0.25 s had come: a 0.25 s deficit.
    c = continuity([0.0, 0.125, 0.5], [2000, 2000, 2000], 8000)
    assert c.underrun_events == 1
    assert c.max_underrun_s == pytest.approx(0.25)
    assert not c.is_continuous
    assert continuity([0.0, 0.125, 0.5], [2000, 2000, 2000], 8000, threshold_s=0.25).is_continuous
    assert continuity([], [], 8000) == continuity([0.0], [10], 8000)


def test_continuity_never_pauses_unlike_the_pausing_player() -> None:
    # One 0.2 s hole early on, then chunks exactly in real time. The pausing player stalls once;
    # the never-pausing clock stays 0.2 s behind, so every later chunk is an underrun event.
    rate = 1000
    arrivals = [0.0, 0.3] + [0.3 + 0.1 * i for i in range(1, 8)]
    samples = [100] * len(arrivals)
    player = pausing_player(arrivals, samples, rate)
    assert player.underruns == 1 and player.stall_s == pytest.approx(0.2)
    c = continuity(arrivals, [2 * n for n in samples], rate)
    assert c.underrun_events == len(arrivals) - 1 - 0  # every chunk after the first
    assert c.max_underrun_s == pytest.approx(0.2)
    assert not c.is_continuous


# -- knee and ratios -----------------------------------------------------------------------------


def test_knee_is_the_first_rate_that_breaks_a_target() -> None:
    points = [(2.0, 0.9, 0.99), (0.5, 0.3, 1.0), (1.0, 0.4, 0.97), (4.0, 3.0, 0.5)]
    knee = find_knee(points, ttfa_target_s=0.8, gap_free_target=0.95)
    assert knee["knee_rate"] == 2.0 and knee["reasons"] == ["ttfa_p95"] and knee["max_ok_rate"] == 1.0
    knee = find_knee(points, ttfa_target_s=5.0, gap_free_target=0.98)
    assert knee["knee_rate"] == 1.0 and knee["reasons"] == ["gap_free"]
    assert find_knee(points, 5.0, 0.1)["knee_rate"] is None
    assert find_knee(points, 5.0, 0.1)["max_ok_rate"] == 4.0


def test_knee_counts_missing_results_as_a_breach() -> None:
    knee = find_knee([(0.5, 0.2, 1.0), (1.0, None, None)], 1.0, 0.9)
    assert knee["knee_rate"] == 1.0 and knee["reasons"] == ["ttfa_p95", "gap_free"]


def test_ratio() -> None:
    assert ratio(3.0, 1.5) == 2.0
    assert ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
