"""The first-audio forecast per class of voice (engine/start_forecast.py, `Capacity.voice_class`): where an
engine's voices differ in speed (the CPU voices: Piper, Kokoro), each class is measured apart and starts
from the engine's own word on it. Fake clock; the policy's defaults (SLO 1.5 s, a stream twice as slow
beside a full engine as alone) unless a test says otherwise. Each test is named by the behaviour it
protects."""

from __future__ import annotations

import math

import pytest

from engine import Capacity
from engine.fair_queue import FairQueue, FairQueueConfig, Refused, Waiter
from tests.support.clocks import ManualClock


def queue(clock: ManualClock, **knobs: float) -> FairQueue:
    return FairQueue(FairQueueConfig(first_audio_slo_s=1.5, **knobs), clock)  # type: ignore[arg-type]


def engine_says(q: FairQueue, **first_audio_s: float) -> None:
    """The engine's word on each class's first audio alone (`Capacity.first_audio_s`), as a look reads it."""
    q.forecast.estimates(first_audio_s.items())


def measure_alone(q: FairQueue, clock: ManualClock, voice: str, *heard_after_s: float, key: str = "m") -> None:
    """Streams of class `voice` started one at a time on an idle engine, each heard after the given
    seconds, then ended."""
    for s in heard_after_s:
        w = q.push(key, 1.0, 4, voice=voice)
        assert w.state == "admitted" and q.in_flight == 1
        clock.now += s
        q.heard(w)
        q.finish(w)


def admit_at_once(q: FairQueue, n: int, voice: str, key: str = "a") -> list[Waiter]:
    started = [q.push(key, 1.0, 4, voice=voice) for _ in range(n)]
    assert all(w.state == "admitted" for w in started)
    return started


def test_a_slow_voices_measurements_do_not_close_the_door_to_a_fast_voice() -> None:
    # One tenant's Mandarin (Kokoro) replies were heard in 3 s alone: the box is too slow for a second
    # Kokoro stream beside any load. Another tenant's English (Piper) replies still start four at once.
    clock = ManualClock()
    q = queue(clock)
    engine_says(q, piper=0.2, kokoro=1.0)
    measure_alone(q, clock, "kokoro", 3.0, 3.0, 3.0, key="acme")
    assert q.first_audio_tail_s("kokoro") == pytest.approx(3.0) and q.slo_capacity(4, "kokoro") < 2
    assert q.first_audio_tail_s("piper") == pytest.approx(0.2) and q.slo_capacity(4, "piper") == 4
    admit_at_once(q, 4, "piper", key="globex")


def test_a_fast_voices_measurements_do_not_hide_a_slow_voices_slowness() -> None:
    # Sixty English replies heard in 0.1 s and two Mandarin ones in 2 s in a row: Kokoro is slow on this
    # box now, however many fast Piper streams were measured beside it.
    clock = ManualClock()
    q = queue(clock)
    engine_says(q, piper=0.2, kokoro=1.0)
    measure_alone(q, clock, "piper", *[0.1] * 60)
    measure_alone(q, clock, "kokoro", 2.0, 2.0)
    assert q.first_audio_tail_s("kokoro") == pytest.approx(2.0)
    admit_at_once(q, 1, "piper")
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 4, voice="kokoro")  # beside one of four: 2.5 s
    assert e.value.bound == "slo" and e.value.predicted_s is not None and e.value.predicted_s > 1.5
    assert q.push("c", 1.0, 4, voice="piper").state == "admitted"


def test_a_fresh_server_forecasts_a_kokoro_voice_slower_than_a_piper_voice() -> None:
    # Nothing heard yet: the engine's cost model says a Kokoro stream's first piece takes 1.0 s alone
    # and a Piper one's 0.2 s. Beside three of four, a Kokoro stream would be heard in 1.75 s, a Piper
    # one in 0.35 s.
    clock = ManualClock()
    q = queue(clock)
    engine_says(q, piper=0.2, kokoro=1.0)
    assert q.first_audio_tail_s("kokoro") > q.first_audio_tail_s("piper")
    assert q.slo_capacity(4, "kokoro") == pytest.approx(3.0) and q.slo_capacity(4, "piper") == 4
    admit_at_once(q, 3, "piper")
    with pytest.raises(Refused) as e:
        q.push("b", 1.0, 4, voice="kokoro")
    assert e.value.bound == "slo"
    assert q.push("b", 1.0, 4, voice="piper").state == "admitted"


def test_the_engines_word_on_a_class_moves_its_prior_and_measurements_still_weigh_against_it() -> None:
    clock = ManualClock()
    q = queue(clock)
    engine_says(q, kokoro=0.5)
    assert q.first_audio_tail_s("kokoro") == pytest.approx(0.5)
    engine_says(q, kokoro=1.2)  # the engine measured Kokoro's runs slower (a busier box)
    assert q.first_audio_tail_s("kokoro") == pytest.approx(1.2)
    measure_alone(q, clock, "kokoro", 4.0)  # one slow stream against the prior's two: not yet the box
    assert q.first_audio_tail_s("kokoro") == pytest.approx(1.2)
    engine_says(q)  # the engine no longer tells it: the policy's default
    assert q.first_audio_tail_s("kokoro") == pytest.approx(q.config.default_first_audio_s)


def test_a_word_that_is_not_a_time_is_not_believed() -> None:
    clock = ManualClock()
    q = queue(clock)
    engine_says(q, zero=0.0, below=-1.0, nan=math.nan, inf=math.inf)
    for voice in ("zero", "below", "nan", "inf"):
        assert q.first_audio_tail_s(voice) == pytest.approx(q.config.default_first_audio_s)


def test_remembered_voices_are_bounded_and_a_forgotten_one_starts_again_at_its_prior() -> None:
    clock = ManualClock()
    q = queue(clock, first_audio_voices=2)
    engine_says(q, **{f"v{i}": 0.3 for i in range(10)})  # an engine telling more classes than remembered
    assert len(q.forecast.voices) == 2
    measure_alone(q, clock, "a", 3.0, 3.0, 3.0)
    measure_alone(q, clock, "b", 0.3)
    measure_alone(q, clock, "a", 3.0)  # heard again: the latest used
    measure_alone(q, clock, "c", 0.3)  # a third class: the one heard least lately goes
    assert q.forecast.samples("b") == 0 and q.forecast.samples("a") == 4 and q.forecast.samples("c") == 1
    measure_alone(q, clock, "d", 0.3)
    assert q.forecast.samples("a") == 0
    assert q.first_audio_tail_s("a") == pytest.approx(q.config.default_first_audio_s)  # its prior again
    assert len(q.forecast.voices) <= 4  # two told, two measured


def test_a_stream_is_forecast_by_the_class_of_voice_that_speaks_it_and_an_unknown_one_by_the_slowest() -> None:
    cap = Capacity(2, 0, budget=1.6, costs=(("en", 0.1), ("zh", 1.0)),
                   voice_costs=(("joe", 0.1), ("jf_alpha", 1.0)), first_audio_s=(("kokoro", 2.0), ("piper", 0.2)),
                   language_classes=(("en", "piper"), ("zh", "kokoro")),
                   voice_classes=(("joe", "piper"), ("jf_alpha", "kokoro")))
    assert cap.voice_class("en") == cap.voice_class("en", "default") == cap.voice_class("en", "joe") == "piper"
    assert cap.voice_class("zh") == cap.voice_class("zh", "jf_alpha") == "kokoro"
    assert cap.voice_class("en", "jf_alpha") == "kokoro"  # a Kokoro voice reading English
    # "auto", an unknown language or voice: the engine may speak it with its slowest voice.
    assert cap.voice_class("auto") == cap.voice_class(None) == cap.voice_class("en", "nobody") == "kokoro"
    assert Capacity(4, 0).voice_class("en", "joe") == ""  # no classes told: one


def test_without_an_slo_no_class_shrinks_the_room() -> None:
    clock = ManualClock()
    q = FairQueue(FairQueueConfig(), clock)
    engine_says(q, kokoro=3.0)
    measure_alone(q, clock, "kokoro", 3.0, 3.0, 3.0)
    assert q.slo_capacity(4, "kokoro") == 4
    admit_at_once(q, 4, "kokoro")


def test_where_each_voice_runs_as_measured_every_stream_admitted_after_learning_it_is_heard_within_the_slo() -> None:
    # Piper heard 0.25 s after it starts alone, Kokoro 1.0 s (both twice that beside a full engine), the
    # engine telling neither (the default prior, 0.5 s); a Piper stream every 0.5 s, a Kokoro one every
    # 2 s, streams holding their slot 2 s: more than four slots serve. Once each voice is measured, every
    # stream admitted is heard within 1.5 s: Piper's many fast measurements do not let a Kokoro stream
    # start beside a load it cannot be heard beside in time (a tail shared by both did: 1.75 s). Exact
    # binary times.
    clock = ManualClock()
    q = queue(clock)
    speed, every = {"piper": 0.25, "kokoro": 1.0}, {"piper": 0.5, "kokoro": 2.0}
    step, running, waited = 0.0625, [], []
    heard_in: list[tuple[str, float, float]] = []  # (voice, started at, heard after asking)
    refused = dict.fromkeys(speed, 0)
    for i in range(int(40 / step)):
        for voice in [v for v in speed if i * step % every[v] == 0 and i * step < 36]:
            try:
                w = q.push("a" if voice == "piper" else "b", 1.0, 4, voice=voice)
            except Refused:
                refused[voice] += 1
                continue
            (running if w.state == "admitted" else waited).append(w)
        for w in [w for w in running if clock.now - (w.started_at or 0.0) >= 2.0]:
            running.remove(w)
            q.release(w, 4)
        q.look(4)
        for w in [w for w in waited if w.state == "admitted"]:
            waited.remove(w)
            running.append(w)
        for w in running:
            assert w.started_at is not None
            if not w.heard and clock.now >= w.started_at + speed[w.voice] * q.forecast.slowdown(w.busy):
                q.heard(w)
                heard_in.append((w.voice, w.started_at, clock.now - w.enqueued_at))
        clock.now += step
    learned = [s for _, at, s in heard_in if at >= 1000.0 + 8.0]  # both voices measured by then
    assert len(learned) >= 40 and max(learned) <= 1.5 + 1e-9
    assert refused["kokoro"] > 0  # refused at once where it could not be heard in time
