"""The CPU voice engine against the stream contract (docs/architecture.md, Contracts), with the real shipped models."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from support.streams import next_audio
from support.waits import until

from engine import EngineError, Waiting, load_engine
from engine.types import AudioChunk, Engine, Stream, StreamEnd

EN = ["Sure, I can help with that. ", "Your order ships tomorrow morning. ", "Is there anything else?"]
ZH = ["好的，我来帮您处理。", "您的订单明天发货。"]

Collect = Callable[[object], Awaitable[tuple[list[AudioChunk], StreamEnd]]]


def assert_contract(chunks: list[AudioChunk], rate: int) -> None:
    """first_frame continuity, segment order, one rate, int16 mono."""
    frame, seg = 0, 0
    for c in chunks:
        assert c.first_frame == frame, "first_frame must continue exactly where the last chunk ended"
        assert c.segment >= seg, "segments come out in commit order"
        assert c.sample_rate == rate and c.pcm.dtype == np.int16 and c.pcm.ndim == 1 and c.pcm.size > 0
        frame += c.pcm.size
        seg = c.segment


def assert_speech(pcm: np.ndarray, rate: int, min_s: float, max_s: float) -> None:
    """Plausible duration, and mostly voiced: not silence, not a click."""
    seconds = pcm.size / rate
    assert min_s <= seconds <= max_s, f"{seconds:.2f} s of audio, expected {min_s}–{max_s}"
    frames = pcm[: pcm.size // (rate // 50) * (rate // 50)].reshape(-1, rate // 50).astype(np.float64)
    rms = np.sqrt((frames**2).mean(axis=1))
    assert rms.max() > 2000, "no loud frame: this is not speech"
    assert (rms > 300).mean() > 0.5, "mostly silence"
    assert np.abs(pcm).max() < 32767 * 0.999 or (np.abs(pcm) >= 32767).mean() < 0.001, "clipping"


def speech_rms(pcm: np.ndarray, rate: int = 24000) -> float:
    """RMS over the voiced 20 ms frames (pauses excluded)."""
    n = rate // 50
    frames = pcm[: pcm.size // n * n].reshape(-1, n).astype(np.float64)
    rms = np.sqrt((frames**2).mean(axis=1))
    return float(np.sqrt((rms[rms > 300] ** 2).mean()))


async def run(engine: Any, collect: Collect, texts: list[str], voice: str | None = None,
              language: str = "auto", **options: Any) -> tuple[list[AudioChunk], StreamEnd, float]:
    stream = engine.open_stream(voice, language, **options)
    t0 = time.perf_counter()
    for text in texts:
        stream.append(text)
    stream.finish()
    first: list[float] = []

    async def timed() -> tuple[list[AudioChunk], StreamEnd]:
        out: list[AudioChunk] = []
        async for ev in stream.events():
            if isinstance(ev, StreamEnd):
                return out, ev
            if isinstance(ev, Waiting):  # why audio is late (a worker, the first-audio hold): not audio
                continue
            if not first:
                first.append(time.perf_counter() - t0)
            out.append(ev)
        raise AssertionError("no StreamEnd")

    chunks, end = await asyncio.wait_for(timed(), timeout=60)
    return chunks, end, first[0] if first else float("inf")


async def test_english_segments_in_order_with_continuous_frames(cpu_engine: Any, collect: Collect,
                                                                pcm: Any) -> None:
    chunks, end, ttfa = await run(cpu_engine, collect, EN, None, "en")
    assert end == StreamEnd("done")
    assert_contract(chunks, 24000)
    assert sorted({c.segment for c in chunks}) == [0, 1, 2]
    for seg, (lo, hi) in enumerate([(1.0, 4.0), (1.2, 4.5), (0.6, 3.0)]):
        assert_speech(pcm(chunks, seg), 24000, lo, hi)
    # Typically 50–80 ms (bench/cpu_voice_bench.py measures it); here only a bound that catches a hang,
    # since a shared 2-core box under other runs stretches any speed figure.
    assert ttfa < 20.0, f"first English chunk after {ttfa:.2f} s on a warm engine"


async def test_mandarin_segments_are_speech(cpu_engine: Any, collect: Collect, pcm: Any) -> None:
    chunks, end, ttfa = await run(cpu_engine, collect, ZH, None, "zh")
    assert end == StreamEnd("done")
    assert_contract(chunks, 24000)
    # About 3–6 syllables a second: 9 and 8 syllables.
    assert_speech(pcm(chunks, 0), 24000, 1.3, 4.5)
    assert_speech(pcm(chunks, 1), 24000, 1.2, 4.0)
    # Typically 0.4–0.7 s (bench/zh_first_audio.py measures it); here only a bound that catches a hang:
    # a box at load 11 stretched it to 12.6 s.
    assert ttfa < 30.0, f"first Mandarin chunk after {ttfa:.2f} s on a warm engine"


async def test_auto_language_handles_mixed_text_segment_by_segment(cpu_engine: Any, collect: Collect,
                                                                   pcm: Any) -> None:
    # The English voice cannot read Han: had the Mandarin segment gone to it, it would have no audio.
    chunks, end, _ = await run(cpu_engine, collect, [EN[0], ZH[0], EN[2]], None, "auto")
    assert end == StreamEnd("done")
    assert_contract(chunks, 24000)
    assert_speech(pcm(chunks, 1), 24000, 1.3, 4.5)
    assert [int(pcm(chunks, s).size > 0) for s in range(3)] == [1, 1, 1]
    # The voice switch keeps the level: speech RMS of the Piper and Kokoro segments within 4 dB.
    en, zh = speech_rms(pcm(chunks, 0)), speech_rms(pcm(chunks, 1))
    assert abs(20 * np.log10(en / zh)) < 4.0, f"level jump {20 * np.log10(en / zh):.1f} dB"


async def test_output_sample_rate_and_speed_options(cpu_engine: Any, collect: Collect, pcm: Any) -> None:
    # Kokoro is deterministic, so durations compare exactly across options.
    base, _, _ = await run(cpu_engine, collect, [ZH[1]], "jf_gongitsune", "zh")
    low, _, _ = await run(cpu_engine, collect, [ZH[1]], "jf_gongitsune", "zh", sample_rate=8000)
    fast, _, _ = await run(cpu_engine, collect, [ZH[1]], "jf_gongitsune", "zh", speed=1.6)
    assert_contract(low, 8000)
    seconds = pcm(base).size / 24000
    assert pcm(low).size / 8000 == pytest.approx(seconds, abs=0.01)
    assert pcm(fast).size / 24000 < 0.8 * seconds


async def test_empty_segments_keep_their_index(cpu_engine: Any, collect: Collect) -> None:
    chunks, end, _ = await run(cpu_engine, collect, ["  ", "Okay."], "joe", "en")
    assert end == StreamEnd("done") and chunks
    assert {c.segment for c in chunks} == {1}


async def test_cancel_mid_stream_ends_cancelled_and_frees_work(cpu_engine: Any) -> None:
    stream = cpu_engine.open_stream("joe", "en")
    for i in range(8):
        stream.append(f"This is sentence number {i + 1} of a long answer that the caller interrupts. ")
    events = stream.events()
    first = await asyncio.wait_for(next_audio(events), timeout=30)
    assert isinstance(first, AudioChunk)
    jobs = stream.snapshot.pieces
    # The look-ahead: at most `workers` pieces in flight behind the one being delivered. That one may still
    # be running (a Piper piece puts out each sentence as it is made): while its first audio was held, the
    # look-ahead ran on beside it (`CpuStream._fill`), so it can be one more than `workers` in all.
    assert len(jobs) <= cpu_engine.workers + 1
    t0 = time.perf_counter()
    stream.cancel()
    rest = [ev async for ev in events]
    assert rest == [StreamEnd("cancelled")], "no audio may follow a cancel"
    assert stream.join(timeout=5)
    for job in jobs:
        assert job.handle is not None
        await until(job.handle.done, "the cancelled stream's job is over", 5)
    assert time.perf_counter() - t0 < 3.0
    # Nothing of the stream outlives it: the text not yet spoken and the pieces in flight are dropped.
    after = stream.snapshot
    assert not after.pieces and after.pending_segments == 0 and after.all_cut


async def test_cancel_aborts_a_model_run_in_progress(cpu_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Long Kokoro runs (each about 90 tokens); the cancel must not wait for the current one to finish.
    # What the run did is read from the model call itself, not from a clock: on a loaded 2-core box
    # even an aborted run's last ONNX node can take longer than any bound a test could name.
    kokoro = cpu_engine.model("kokoro")
    outcomes: list[str] = []
    real_run_timed = kokoro.run_timed

    def run_timed(*args: Any, **kwargs: Any) -> Any:
        try:
            out = real_run_timed(*args, **kwargs)
        except Exception as exc:
            outcomes.append(f"raised: {exc}")
            raise
        outcomes.append("returned")
        return out

    monkeypatch.setattr(kokoro, "run_timed", run_timed)
    text = ", ".join(["the quick brown fox jumps over the lazy dog"] * 6) + "."
    stream = cpu_engine.open_stream("jf_gongitsune", "en")
    stream.append(text)
    await until(lambda: stream.snapshot.pieces, "the driver cuts and submits its piece", 10)
    job = stream.snapshot.pieces[0].handle  # its future
    assert job is not None
    await until(lambda: job.running() or job.done(), "its job takes a worker", 10)
    assert job.running()
    await asyncio.sleep(0.2)  # past phonemisation (milliseconds), inside the model run (over a second)
    stream.cancel()
    await until(job.done, "the cancelled run is over", 10)
    # The run in progress was stopped by its terminate flag, not run to its end; no audio came of it. (A run
    # may also have given its worker up to another test's urgent job before: aborted the same way, rerun.)
    assert outcomes and all("terminate" in o for o in outcomes), outcomes
    assert [ev async for ev in stream.events()] == [StreamEnd("cancelled")]


async def test_concurrent_streams_both_complete(cpu_engine: Any, collect: Collect) -> None:
    a = cpu_engine.open_stream(None, "en")
    b = cpu_engine.open_stream(None, "zh")
    a.append(EN[1])
    b.append(ZH[0])
    a.finish()
    b.finish()
    (ca, ea), (cb, eb) = await asyncio.wait_for(asyncio.gather(collect(a), collect(b)), timeout=60)
    assert ea == eb == StreamEnd("done")
    assert_contract(ca, 24000)
    assert_contract(cb, 24000)


def test_engine_and_stream_implement_the_contract(cpu_engine: Any) -> None:
    assert isinstance(cpu_engine, Engine)
    stream = cpu_engine.open_stream(None, "auto")
    assert isinstance(stream, Stream)
    stream.cancel()


def test_voices_carry_language_tags_and_defaults(cpu_engine: Any) -> None:
    voices = {v.name: v for v in cpu_engine.voices()}
    assert voices["joe"].languages == ("en",)
    assert "zh" in voices["jf_alpha"].languages
    assert cpu_engine.languages() == ["auto", "en", "zh"]
    assert cpu_engine.default_voice("en") == "joe"
    assert cpu_engine.default_voice("zh") == "jf_gongitsune"
    assert cpu_engine.sample_rate == 24000


@pytest.mark.parametrize(
    ("voice", "language", "options", "code"),
    [
        ("alloy", "en", {}, "unknown_voice"),
        (None, "fr", {}, "unsupported_language"),
        ("joe", "zh", {}, "unsupported_language"),
        ("joe", "Chinese", {}, "unsupported_language"),
        (None, "en", {"sample_rate": 4000}, "invalid_option"),
        (None, "en", {"speed": 0}, "invalid_option"),
        (None, "en", {"pitch": 2}, "invalid_option"),
        (None, "en", {"speed": float("nan")}, "invalid_option"),
        (None, "en", {"speed": float("inf")}, "invalid_option"),
        (None, "en", {"speed": "1.0"}, "invalid_option"),
        (None, "en", {"speed": 10**400}, "invalid_option"),
        (None, "en", {"sample_rate": float("nan")}, "invalid_option"),
        (None, "en", {"sample_rate": float("inf")}, "invalid_option"),
        (None, "en", {"sample_rate": 16000.5}, "invalid_option"),
        (None, "en", {"sample_rate": True}, "invalid_option"),
        (None, "en", {"seed": -1}, "invalid_option"),
        (None, "en", {"seed": 2**63}, "invalid_option"),
        (None, "en", {"seed": 2**64}, "invalid_option"),
        (None, "en", {"seed": 1.5}, "invalid_option"),
        (None, "en", {"seed": "7"}, "invalid_option"),
        (None, "en", {"instructions": 5}, "invalid_option"),
        (7, "en", {}, "unknown_voice"),
        (None, 7, {}, "unsupported_language"),
    ],
)
def test_open_stream_rejects_what_the_cpu_voices_lack(cpu_engine: Any, voice: str | None, language: str,
                                                      options: dict[str, Any], code: str) -> None:
    with pytest.raises(EngineError) as err:
        cpu_engine.open_stream(voice, language, **options)
    assert err.value.code == code


@pytest.mark.parametrize(
    ("voice", "language", "options"),
    [("x" * 100_000, "en", {}), (None, "y" * 100_000, {}), (None, "en", {"sample_rate": 10**5000}),
     (None, "en", {"speed": "z" * 100_000}), (None, "en", {"seed": 2**70000}), (None, "en", {"p" * 100_000: 1}),
     (None, "en", {"instructions": ["w" * 100_000]})],
)
def test_open_stream_errors_never_echo_unbounded_input(cpu_engine: Any, voice: Any, language: Any,
                                                       options: dict[str, Any]) -> None:
    with pytest.raises(EngineError) as err:
        cpu_engine.open_stream(voice, language, **options)
    assert len(str(err.value)) < 300


def test_valid_seed_and_instructions_are_accepted_and_ignored(cpu_engine: Any) -> None:
    cpu_engine.open_stream(None, "en", seed=2**63 - 1, instructions="calm", speed=1, sample_rate=16000).cancel()


def test_load_engine_dispatches_cpu_backend_names(tmp_path: Any) -> None:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    engine = load_engine("Piper", cache_dir=tmp_path)  # English only: no Kokoro model assembled
    try:
        assert [v.name for v in engine.voices()] == ["joe"]
        assert engine.languages() == ["auto", "en"]
        with pytest.raises(EngineError) as err:
            engine.open_stream(None, "zh")
        assert err.value.code == "unsupported_language"
        assert not (tmp_path / "kokoro").exists()
    finally:
        engine.close()


async def test_a_synthesis_fault_ends_the_stream_with_error_after_earlier_audio(
        cpu_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A model run that raises cannot be caused for real with the shipped models: inject it.
    # Armed once segment 0 has been heard, so a run still finishing for an earlier test (the engine is
    # shared) cannot take the fault instead.
    real = cpu_engine.synthesise  # every model run of a piece goes through it
    armed = threading.Event()

    def failing(*args: Any) -> Any:
        for run in real(*args):
            if armed.is_set():
                raise RuntimeError("onnxruntime fault")
            yield run

    monkeypatch.setattr(cpu_engine, "synthesise", failing)
    stream = cpu_engine.open_stream("joe", "en")
    stream.append("First segment.")
    chunks, end = await asyncio.wait_for(_first_then_rest(stream, ["Second segment.", "Third one."], armed), 30)
    assert end.reason == "error" and "onnxruntime fault" in end.message
    assert chunks and {c.segment for c in chunks} == {0}  # segment 0 was spoken; nothing after the fault


async def _first_then_rest(stream: Any, more: list[str], armed: threading.Event) -> tuple[list[AudioChunk], StreamEnd]:
    out: list[AudioChunk] = []
    events = stream.events()
    first = await next_audio(events)
    assert isinstance(first, AudioChunk), first
    out.append(first)
    armed.set()
    for text in more:
        stream.append(text)
    stream.finish()
    async for ev in events:
        if isinstance(ev, StreamEnd):
            return out, ev
        out.append(ev)
    raise AssertionError("no StreamEnd")
