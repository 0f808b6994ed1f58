"""Pure metric functions for the streaming-TTS load harness (bench/load.py).

Everything here works on plain numbers (arrival times in seconds, sizes in samples or bytes, int16
PCM as NumPy arrays) so each metric can be checked on synthetic signals with known answers
(tests/bench/test_audio_metrics.py). Nothing here touches sockets or clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.audio import OnsetTracker as OnsetTracker
from engine.audio import rms_onset as rms_onset
from engine.audio import window_rms_dbfs as window_rms_dbfs

# -- percentiles ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (NumPy's
    default "linear" method); None for no values, so an empty run never reads as zero latency."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    xs = sorted(float(v) for v in values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, mean, p50, p95, p99 and max of a sample (None where there is nothing to summarise)."""
    xs = [float(v) for v in values]
    return {
        "n": len(xs),
        "mean": sum(xs) / len(xs) if xs else None,
        "p50": percentile(xs, 50),
        "p95": percentile(xs, 95),
        "p99": percentile(xs, 99),
        "max": max(xs) if xs else None,
    }


# -- audible onset -------------------------------------------------------------------------------


# window_rms_dbfs, rms_onset and OnsetTracker live in engine/audio.py (imported above): the gateway's
# timing record uses the same rule, so one definition of "audible" holds on both sides of the socket.


def frame_of_sample(sizes: Sequence[int], sample: int) -> int | None:
    """Index of the frame holding `sample`, given each frame's size in samples (None if beyond)."""
    total = 0
    for k, n in enumerate(sizes):
        total += n
        if sample < total:
            return k
    return None


# -- players -------------------------------------------------------------------------------------


@dataclass
class PlayerStats:
    """What a listener hears from a player that starts at `start_sample` and pauses when dry."""

    start_time: float | None  # when playback began (None: nothing to play)
    end_time: float | None  # when the last sample finished playing
    underruns: int = 0
    stall_s: float = 0.0
    stalls: list[tuple[float, float]] = field(default_factory=list)  # (when it ran dry, how long)
    resumed_by: list[int] = field(default_factory=list)  # per stall: the index of the frame that ended it


def pausing_player(arrivals: Sequence[float], sizes: Sequence[int], rate: int, start_sample: int = 0,
                   prebuffer_s: float = 0.0, min_stall_s: float = 1e-6) -> PlayerStats:  # fmt: skip
    """Simulate a real client player over frames that arrived at `arrivals` (s) holding `sizes`
    samples each. It starts once the frame holding `start_sample` is in (leading silence is never
    played) and `prebuffer_s` of audio is buffered; when the buffer runs dry it pauses (an underrun)
    and resumes once a frame brings it back to `prebuffer_s` (or the last frame is in). Stalls no
    longer than `min_stall_s` are float noise, not gaps, and are not counted."""
    if len(arrivals) != len(sizes):
        raise ValueError("arrivals and sizes differ in length")
    cum = np.cumsum(np.asarray(sizes, dtype=np.int64)) if sizes else np.empty(0, dtype=np.int64)
    k0 = frame_of_sample(sizes, start_sample)
    if k0 is None:
        return PlayerStats(None, None)
    need = prebuffer_s * rate
    last = len(sizes) - 1
    stats = PlayerStats(None, None)
    playing = False
    play_t = 0.0  # wall time at which the player was at play_pos
    play_pos = float(start_sample)
    dry_at: float | None = None  # when the current stall began (None before the first start)
    for k in range(k0, len(sizes)):
        t = float(arrivals[k])
        if playing:
            dry = play_t + (float(cum[k - 1]) - play_pos) / rate
            if dry < t:  # ran out before this frame came
                playing, play_pos, dry_at = False, float(cum[k - 1]), dry
        if not playing and (float(cum[k]) - play_pos >= need or k == last):
            playing, play_t = True, t
            if stats.start_time is None:
                stats.start_time = t
            elif dry_at is not None:
                gap = t - dry_at
                if gap > min_stall_s:
                    stats.underruns += 1
                    stats.stall_s += gap
                    stats.stalls.append((dry_at, gap))
                    stats.resumed_by.append(k)
    if playing:
        stats.end_time = play_t + (float(cum[-1]) - play_pos) / rate
    return stats


@dataclass(frozen=True)
class Continuity:
    """vLLM-Omni's continuity statistics (vllm_omni/benchmarks/audio_continuity.py, #3618)."""

    underrun_events: int
    max_underrun_s: float
    is_continuous: bool


def continuity(arrivals: Sequence[float], nbytes: Sequence[int], rate: int, width: int = 2, channels: int = 1,
               threshold_s: float = 0.1) -> Continuity:  # fmt: skip
    """vLLM-Omni's rule: a player that starts at the first byte and never pauses. For each chunk
    after the first, the deficit is how far the real-time clock (since the first byte) is ahead of
    the bytes received before that chunk; positive deficits are underrun events, and the stream is
    continuous when the worst deficit is at most `threshold_s` (the jitter buffer that would hide
    every gap)."""
    if len(arrivals) != len(nbytes):
        raise ValueError("arrivals and sizes differ in length")
    if not arrivals:
        return Continuity(0, 0.0, True)
    bps = rate * width * channels
    t0 = arrivals[0]
    received = 0
    events, worst = 0, 0.0
    for i, (t, n) in enumerate(zip(arrivals, nbytes, strict=True)):
        if i > 0:
            deficit = (t - t0) * bps - received
            if deficit > 0:
                events += 1
                worst = max(worst, deficit / bps)
        received += n
    return Continuity(events, worst, worst <= threshold_s)


# -- capacity ------------------------------------------------------------------------------------


def find_knee(points: Sequence[tuple[float, float | None, float | None]], ttfa_target_s: float,
              gap_free_target: float) -> dict[str, object]:  # fmt: skip
    """The capacity knee: the lowest arrival rate at which TTFA p95 exceeds `ttfa_target_s` or the
    gap-free share falls below `gap_free_target`. `points` are (rate, ttfa_p95, gap_free_share);
    a None metric (nothing completed at that rate) counts as a breach. Returns the knee rate
    (None when every rate met both targets), why, and the highest rate that met both below it."""
    knee: float | None = None
    reasons: list[str] = []
    last_ok: float | None = None
    for rate, p95, share in sorted(points, key=lambda p: p[0]):
        why = []
        if p95 is None or p95 > ttfa_target_s:
            why.append("ttfa_p95")
        if share is None or share < gap_free_target:
            why.append("gap_free")
        if why:
            knee, reasons = rate, why
            break
        last_ok = rate
    return {"knee_rate": knee, "reasons": reasons, "max_ok_rate": last_ok,
            "ttfa_target_s": ttfa_target_s, "gap_free_target": gap_free_target}  # fmt: skip


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero (a ratio that cannot be read)."""
    if a is None or b is None or b == 0:
        return None
    return a / b
