"""CPU voice capacity: the real-time-factor meter (given costs), the pool's deadline-aware order (a
fake clock), and `CpuEngine.capacity()` after real synthesis."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from support.streams import collect

from engine.cpu.capacity import RtfMeter
from engine.cpu.policy import DEFAULT
from engine.cpu.pool import UrgencyPool
from engine.types import Capacity, StreamEnd


def test_the_prior_holds_until_a_job_is_measured() -> None:
    meter = RtfMeter(prior_rtf=0.5, headroom=0.8)
    assert meter.rtf() == 0.5 and meter.streams(2) == 3  # floor(2 / 0.5 × 0.8)
    meter.record("piper", 0.0, 0.0)  # nothing made (a cancelled job): nothing learnt
    meter.record("piper", float("nan"), 1.0)
    assert meter.rtf() == 0.5


def test_streams_follow_the_measured_real_time_factor() -> None:
    meter = RtfMeter(alpha=0.5, alpha_up=0.5, headroom=0.8)
    meter.record("piper", 0.5, 5.0)  # RTF 0.1: the first measurement replaces the prior
    assert meter.rtf() == pytest.approx(0.1) and meter.streams(2) == 16  # floor(2 / 0.1 × 0.8)
    meter.record("piper", 1.5, 5.0)  # a loaded box: RTF 0.3; the EWMA moves halfway
    assert meter.rtf() == pytest.approx(0.2) and meter.streams(2) == 8
    for _ in range(30):
        meter.record("piper", 10.0, 5.0)  # slower than real time: still one stream, never zero
    assert meter.rtf() == pytest.approx(2.0, rel=1e-3) and meter.streams(2) == 1


def test_a_rise_in_cost_is_believed_at_once_a_fall_slowly() -> None:
    meter = RtfMeter(alpha=0.1, alpha_up=0.5)
    meter.record("piper", 0.5, 5.0)  # RTF 0.1
    meter.record("piper", 1.5, 5.0)  # 0.3: halfway up at once
    assert meter.rtf() == pytest.approx(0.2)
    meter.record("piper", 0.0, 5.0)  # free: a tenth of the way down
    assert meter.rtf() == pytest.approx(0.18)


def test_short_jobs_move_the_estimate_less() -> None:
    meter = RtfMeter(alpha=0.5, alpha_up=0.5)
    meter.record("piper", 0.5, 5.0)
    meter.record("piper", 0.5, 0.05)  # a one-word piece: RTF 10, mostly per-run overhead
    assert meter.rtf() < 0.6  # weighted by 0.05 / 0.5 of a full job: 0.1 + 0.05 × 9.9


def test_a_mixed_load_is_judged_by_its_mix() -> None:
    meter = RtfMeter(alpha=0.2, alpha_up=None)
    for _ in range(50):  # Piper (RTF 0.1) makes three times the audio of Kokoro (RTF 0.4)
        meter.record("piper", 0.3, 3.0)
        meter.record("kokoro", 0.4, 1.0)
    assert meter.backend_rtf("piper") == pytest.approx(0.1) and meter.backend_rtf("kokoro") == pytest.approx(0.4)
    # The audio-weighted mix (the shares are EWMAs too, so the latest job leans it a little)
    assert meter.rtf() == pytest.approx(0.75 * 0.1 + 0.25 * 0.4, rel=0.15)


def _held(pool: UrgencyPool) -> tuple[threading.Event, Any]:
    """Occupy the pool's one worker until the gate opens, so the test's jobs queue behind it."""
    gate, started = threading.Event(), threading.Event()
    blocker = pool.submit(float("-inf"), lambda: (started.set(), gate.wait(10)))
    assert started.wait(5)
    return gate, blocker


def test_a_playing_stream_about_to_run_dry_goes_before_a_newcomer() -> None:
    now = [50.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, blocker = _held(pool)
    order: list[str] = []
    new = pool.submit(50.0, lambda: order.append("new"), owner="new", first_audio=True)
    comfy = pool.submit(54.0, lambda: order.append("comfy"), owner="comfy")  # 4 s of audio left
    dry_soon = pool.submit(50.6, lambda: order.append("dry_soon"), owner="dry_soon")  # 0.6 s left
    dry = pool.submit(49.0, lambda: order.append("dry"), owner="dry")  # already ran out 1 s ago
    assert [pool.ahead(f) for f in (dry, dry_soon, new, comfy)] == [0, 1, 2, 3]
    now[0] = 53.5  # time passes while they wait: the comfortable one is now due within the guard
    assert pool.ahead(comfy) == 2 and pool.ahead(new) == 3
    gate.set()
    for f in (blocker, new, comfy, dry_soon, dry):
        f.result(timeout=5)
    assert order == ["dry", "dry_soon", "comfy", "new"]
    pool.shutdown()


def test_a_newcomer_goes_first_while_every_playing_stream_has_time() -> None:
    now = [0.0]
    pool = UrgencyPool(1, guard_s=1.0, clock=lambda: now[0])
    gate, blocker = _held(pool)
    order: list[str] = []
    later = [pool.submit(d, lambda n=n: order.append(n), owner=n) for n, d in (("b", 3.0), ("a", 2.0))]
    new = [pool.submit(t, lambda n=n: order.append(n), owner=n, first_audio=True) for n, t in (("n1", 0.1),
                                                                                                 ("n2", 0.2))]
    gate.set()
    for f in (blocker, *later, *new):
        f.result(timeout=5)
    assert order == ["n1", "n2", "a", "b"]  # newcomers oldest first, then earliest deadline
    pool.shutdown()


@pytest.fixture(scope="module")
def piper() -> Any:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    from engine import load_engine

    engine = load_engine("piper", workers=2)
    yield engine
    engine.close()


async def test_capacity_after_real_synthesis(piper: Any) -> None:
    prior = piper.capacity()
    assert isinstance(prior, Capacity) and prior.streams >= 1 and prior.active == 0
    assert piper.meter.backend_rtf("piper") is not None  # the warm-up is the first measurement
    stream = piper.open_stream("joe", "en")
    assert piper.capacity().active == 1  # open, not ended: it will need audio in real time
    stream.append("The capacity of the engine is judged from what synthesis has cost so far. ")
    stream.append("Every piece reports its run time and the seconds of audio it made.")
    stream.finish()
    events, end = await collect(stream, 60)
    assert end == StreamEnd("done") and events
    rtf = piper.meter.backend_rtf("piper")
    assert rtf is not None and 0.0 < rtf < 5.0  # Piper runs well ahead of real time, even on a busy box
    cap = piper.capacity()
    assert cap.active == 0
    assert cap.streams == max(1, int(2 / piper.meter.rtf() * 0.8)) and 1 <= cap.streams < 1000
    rtf = piper.meter.backend_rtf("piper")
    assert cap.budget == pytest.approx(2 * 0.8) and cap.costs == (("en", rtf),) and cap.voice_costs == (("joe", rtf),)
    # Its one class of voice, Piper's, heard a first piece's run after a stream starts alone (admission's prior).
    assert cap.first_audio_s == (("piper", pytest.approx(piper.config.first_piece_s * rtf)),)
    assert cap.language_classes == (("en", "piper"),) and cap.voice_classes == (("joe", "piper"),)
    assert piper.pool.guard_s >= 0.5


async def test_capacity_admits_nobody_new_while_the_pool_is_behind(piper: Any) -> None:
    # Both workers held: the stream's first audio waits for a worker, so the engine says it can take no
    # newcomer beyond those it serves until it has caught up (`behind_s`), whatever the measured cost
    # says; its budget stays what it costs, so admission predicts a start after the moment, not after a
    # whole stream; once it catches up, it can.
    gates = [threading.Event() for _ in range(piper.workers)]
    started = [threading.Event() for _ in range(piper.workers)]
    blockers = [piper.pool.submit(float("-inf"), lambda g=g, s=s: (s.set(), g.wait(10)))
                for g, s in zip(gates, started, strict=True)]
    assert all(s.wait(5) for s in started)
    stream = piper.open_stream("joe", "en")
    stream.append("Waiting for a worker.")
    stream.finish()
    for _ in range(200):  # the stream's driver submits its first piece on its own thread
        if piper.pool.strained():
            break
        threading.Event().wait(0.01)
    cap = piper.capacity()
    assert cap.active == 1 and cap.streams == 1 and piper.meter.streams(piper.workers) >= 1
    assert cap.behind_s > 0 and cap.budget == pytest.approx(piper.meter.budget(piper.workers))
    for g in gates:
        g.set()
    events, end = await collect(stream, 60)
    assert end == StreamEnd("done") and events
    for b in blockers:
        b.result(timeout=5)
    cap = piper.capacity()
    assert cap.streams == piper.meter.streams(piper.workers) and cap.busy_s is not None and cap.busy_s > 0
    assert cap.budget == pytest.approx(piper.meter.budget(piper.workers)) and cap.behind_s == 0.0


def test_a_stream_costs_its_languages_voice_and_the_budget_is_the_promised_worker_time(cpu_engine: Any) -> None:
    # Piper (English) and Kokoro (Mandarin) differ about tenfold: admission charges each stream its own.
    cap = cpu_engine.capacity()
    costs = dict(cap.costs)
    assert set(costs) == {"en", "zh"}
    assert costs["en"] == cpu_engine.rtf("piper") and costs["zh"] == cpu_engine.rtf("kokoro")
    voices = dict(cap.voice_costs)
    assert voices["joe"] == costs["en"] and voices["jf_alpha"] == costs["zh"]
    assert len(voices) == len(cpu_engine.voices())
    # A voice's class is its backend, and a class's first audio alone its first piece at the backend's RTF.
    first_audio_s = dict(cap.first_audio_s)
    assert first_audio_s == {b: pytest.approx(cpu_engine.config.first_piece_s * cpu_engine.rtf(b))
                             for b in ("piper", "kokoro")}  # fmt: skip
    assert cap.voice_class("en") == "piper" and cap.voice_class("zh") == cap.voice_class("en", "jf_alpha") == "kokoro"
    assert cap.budget == pytest.approx(cpu_engine.workers * cpu_engine.meter.headroom)
    # A stream at the mixed cost fits `streams` times: the count an engine without costs would give.
    assert cap.streams == max(1, int(cap.budget / cpu_engine.meter.rtf()))


def test_the_job_time_follows_long_jobs_at_once_and_short_ones_slowly() -> None:
    meter = RtfMeter()
    meter.record("piper", 0.2, 2.0)
    meter.record("piper", 1.0, 7.0)  # a long piece: what an urgent job may have to wait for
    assert meter.job_s == pytest.approx(0.6)
    for _ in range(3):
        meter.record("piper", 0.1, 1.0)  # short pieces move it a tenth of the way each
    assert 0.4 < meter.job_s < 0.6


def test_the_overrun_is_the_90th_percentile_of_the_latest_runs_past_their_prediction() -> None:
    meter = RtfMeter()
    for _ in range(DEFAULT.overrun_min_runs - 1):
        meter.record("kokoro", 1.5, 1.0, predicted_s=1.0)
    meter.record("kokoro", 1.0, 1.0)  # no prediction (0): its cost counts, not its overrun
    assert meter.overrun("kokoro") is None  # too few runs to say
    meter.record("kokoro", 1.5, 1.0, predicted_s=1.0)
    assert meter.overrun("kokoro") == pytest.approx(1.5) and meter.overrun("piper") is None
    for i in range(DEFAULT.overrun_window):  # one run in twenty at twice its prediction: under the 90th percentile
        meter.record("kokoro", 2.0 if i % 20 == 0 else 1.0, 1.0, predicted_s=1.0)
    assert meter.overrun("kokoro") == pytest.approx(1.0)
    for i in range(DEFAULT.overrun_window):  # one in five: over it
        meter.record("kokoro", 2.0 if i % 5 == 0 else 1.0, 1.0, predicted_s=1.0)
    assert meter.overrun("kokoro") == pytest.approx(2.0)
    for _ in range(DEFAULT.overrun_window):  # the box got quieter: the old runs leave the window
        meter.record("kokoro", 0.9, 1.0, predicted_s=1.0)
    assert meter.overrun("kokoro") == pytest.approx(0.9)


def test_the_holds_error_follows_the_overrun_within_its_bounds(piper: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert piper.hold_error("kokoro") == DEFAULT.hold_error_cold  # nothing measured: the cold margin
    for overrun, error in ((0.8, DEFAULT.hold_error), (1.6, 0.6), (9.0, DEFAULT.hold_error_max)):
        monkeypatch.setattr(piper.meter, "overrun", lambda backend, o=overrun: o)
        assert piper.hold_error("piper") == pytest.approx(error)


async def test_real_runs_record_how_long_they_took_past_their_prediction(piper: Any) -> None:
    before = len(piper.meter.overruns("piper"))
    stream = piper.open_stream("joe", "en")
    stream.append("Each run is timed against what was predicted when it started. So is this one. And this.")
    stream.finish()
    _, end = await collect(stream, 60)
    assert end == StreamEnd("done")
    runs = piper.meter.overruns("piper")
    assert len(runs) > before and all(0.0 < r < 100.0 for r in runs)
