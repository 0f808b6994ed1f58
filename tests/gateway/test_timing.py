"""Every response's timing record, and the leading-silence trim: the pure parts on signals with known
answers, then through a real gateway serving Piper (WebSocket, /metrics, the `openai` client)."""

from __future__ import annotations

import base64
import io
import json
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import openai
import pytest
import soundfile
from support.servers import serve
from support.wsclient import open_session, utterance

from engine import Engine
from engine.audio import first_above, rms_onset
from gateway.connection import Limits
from gateway.settings import Settings
from gateway.timing import SPEECH_DBFS, LeadingTrim, ResponseClock, Timing

RATE = 24000
MS = RATE // 1000
PREROLL, MAX_MS = 15, 300
THRESHOLD = Limits().trim_threshold_dbfs


def tone(ms: int, dbfs: float = -20.0) -> np.ndarray:
    t = np.arange(ms * MS) / RATE
    return np.round(32768 * 10 ** (dbfs / 20) * np.sqrt(2) * np.sin(2 * np.pi * 300 * t)).astype(np.int16)


def quiet(ms: int, peak: int = 20) -> np.ndarray:
    """Near-silence: noise well below the trim's threshold (-45 dBFS is a peak of 184)."""
    return np.random.default_rng(ms).integers(-peak, peak, ms * MS).astype(np.int16)


def trimmed_in_chunks(signal: np.ndarray, chunk: int, **options: Any) -> tuple[np.ndarray, LeadingTrim]:
    trim = LeadingTrim(RATE, **options)
    out = [trim.feed(signal[i : i + chunk]) for i in range(0, len(signal), chunk)]
    return np.concatenate([*out, trim.flush()]), trim


# -- the trim, pure --------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [7 * MS, 80 * MS, 250 * MS, 10**6])
def test_trim_stops_the_preroll_before_the_first_sound(chunk: int) -> None:
    signal = np.concatenate([quiet(120), tone(400), quiet(50)])
    out, trim = trimmed_in_chunks(signal, chunk)
    onset = first_above(signal, THRESHOLD)
    assert onset is not None and onset // MS == 120
    assert trim.trimmed == onset - PREROLL * MS  # the same cut however the audio is chunked
    assert np.array_equal(out, signal[trim.trimmed :])  # nothing else touched
    assert first_above(out, THRESHOLD) == PREROLL * MS


def test_trim_is_bounded_by_trim_max_ms_and_holds_no_more_than_that() -> None:
    signal = np.concatenate([quiet(900), tone(300)])
    trim = LeadingTrim(RATE, max_ms=MAX_MS, preroll_ms=PREROLL)
    held = 0
    for i in range(0, len(signal), 10 * MS):
        out = trim.feed(signal[i : i + 10 * MS])
        if trim.pending:
            held += 10 * MS
            assert out.size == 0
    assert held < (MAX_MS + PREROLL) * MS  # the start is never held past the bound
    assert trim.trimmed == MAX_MS * MS


def test_trim_never_cuts_sound_at_the_start_or_when_disabled() -> None:
    signal = np.concatenate([quiet(5), tone(200)])
    out, trim = trimmed_in_chunks(signal, 40 * MS)
    assert trim.trimmed == 0 and np.array_equal(out, signal)
    late = np.concatenate([quiet(100), tone(200)])
    for options in ({"enabled": False}, {"max_ms": 0}):
        out, trim = trimmed_in_chunks(late, 40 * MS, **options)
        assert trim.trimmed == 0 and np.array_equal(out, late) and not trim.pending


def test_an_utterance_of_near_silence_only_is_flushed_at_its_end() -> None:
    signal = quiet(100)
    out, trim = trimmed_in_chunks(signal, 30 * MS)
    assert trim.trimmed == (100 - PREROLL) * MS and np.array_equal(out, signal[trim.trimmed :])


def test_trim_happens_once_at_the_start_only() -> None:
    signal = np.concatenate([tone(100), quiet(200), tone(100)])  # a pause inside the utterance stays
    out, trim = trimmed_in_chunks(signal, 50 * MS)
    assert trim.trimmed == 0 and np.array_equal(out, signal)


# -- the clock, pure -------------------------------------------------------------------------------


def test_clock_times_first_audible_and_last_audio_from_the_engine_start() -> None:
    clock = ResponseClock(RATE, start=10.0, queue_wait_s=0.25)
    chunks = [quiet(100), np.concatenate([quiet(30), tone(70)]), tone(100), tone(100)]
    for i, pcm in enumerate(chunks):
        clock.audio(pcm, now=10.1 + 0.1 * i)
    clock.trimmed = 12 * MS
    t = clock.record()
    # The onset is 130 ms into the audio: a player starting at 10.1 s plays it at 10.23 s (its chunk
    # was sent at 10.2 s, in time).
    assert rms_onset(np.concatenate(chunks), RATE, SPEECH_DBFS) == 130 * MS
    assert t == Timing(queue_wait_ms=250, ttfa_ms=100, audible_ttfa_ms=230, synthesis_ms=400, audio_ms=400,
                       rtf=1.0, trimmed_ms=12)  # fmt: skip
    assert t.headers(whole=False) == {"X-Queue-Wait-Ms": "250", "X-TTFA-Ms": "100"}
    assert t.headers(whole=True)["X-Audible-TTFA-Ms"] == "230" and t.headers(whole=True)["X-RTF"] == "1.0"


def test_audible_audio_sent_late_is_heard_when_it_comes() -> None:
    clock = ResponseClock(RATE, start=0.0)
    clock.audio(quiet(20), now=0.1)
    clock.audio(tone(100), now=0.5)  # the player ran dry at 0.12 s and waited for it
    assert clock.record().audible_ttfa_ms == 500


def test_clock_keeps_only_the_chunks_that_may_hold_the_onset() -> None:
    clock = ResponseClock(RATE, start=0.0)
    for i in range(1000):
        clock.audio(quiet(20), now=i * 0.02)
    assert len(clock._chunks) <= 2  # a long silence is not remembered chunk by chunk
    clock.audio(tone(100), now=20.0)
    assert clock.record().audible_ttfa_ms == 20000


def test_clock_of_no_audio_and_of_codec_frames() -> None:
    assert ResponseClock(RATE, None).record() == Timing(0, None, None, None, 0, None, 0)
    clock = ResponseClock(RATE, start=1.0)
    clock.codec(0.08, now=1.2)
    clock.codec(0.08, now=1.3)
    assert clock.record() == Timing(0, 200, None, 300, 160, 1.875, 0)


def test_trim_settings_are_checked() -> None:
    for bad in ({"trim_max_ms": 5000}, {"trim_preroll_ms": -1}, {"trim_threshold_dbfs": 3.0}):
        with pytest.raises(ValueError, match="trim_"):
            Settings(limits=Limits(**bad))  # type: ignore[arg-type]


# -- through a real gateway ------------------------------------------------------------------------

SENTENCES = "Your package will arrive on Monday afternoon. Please hold while I check your account. Thank you."


@pytest.fixture(scope="module")
def trimming(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=5.0))


@pytest.fixture(scope="module")
def untrimmed(cpu_engine: Engine) -> Iterator[str]:
    yield from serve(cpu_engine, Limits(config_timeout=5.0, trim_leading_silence=False))


async def spoken(addr: str, text: str, **config: Any) -> tuple[list[dict[str, Any]], np.ndarray, list[int]]:
    """One utterance: its events, its PCM, and for each audio.mark the samples received before it."""
    ws, ready = await open_session(addr, **config)
    assert ready["type"] == "session.ready"
    await ws.send(json.dumps({"type": "input.text", "text": text}))
    await ws.send(json.dumps({"type": "input.done"}))
    events: list[dict[str, Any]] = []
    pcm = bytearray()
    before_marks: list[int] = []
    while not events or events[-1]["type"] not in ("session.done", "error"):
        m = await ws.recv()
        if isinstance(m, bytes):
            pcm += m
            continue
        events.append(json.loads(m))
        if events[-1]["type"] == "audio.mark":
            before_marks.append(len(pcm) // 2)
    await ws.close()
    return events, np.frombuffer(bytes(pcm), np.int16), before_marks


def timing_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    done = next(e for e in events if e["type"] == "audio.done")
    final = events[-1]
    assert final["type"] == "session.done" and final["timing"] == done["timing"]
    return done["timing"]


async def test_timing_is_in_audio_done_and_session_done_and_consistent(trimming: str) -> None:
    events, pcm, _ = await spoken(trimming, SENTENCES)
    t = timing_of(events)
    assert set(t) == {"queue_wait_ms", "ttfa_ms", "audible_ttfa_ms", "synthesis_ms", "audio_ms", "rtf", "trimmed_ms"}
    done = next(e for e in events if e["type"] == "audio.done")
    assert done["total_bytes"] == pcm.size * 2
    assert t["audio_ms"] == round(pcm.size / RATE * 1000)  # the audio sent, exactly
    assert t["queue_wait_ms"] >= 0 and 0 < t["ttfa_ms"] <= t["synthesis_ms"]
    onset = rms_onset(pcm, RATE, SPEECH_DBFS)
    assert onset is not None and t["audible_ttfa_ms"] >= t["ttfa_ms"] + onset // MS  # played from the first audio
    assert t["rtf"] == pytest.approx(t["synthesis_ms"] / t["audio_ms"], abs=0.002)
    assert 0 <= t["trimmed_ms"] <= MAX_MS
    assert all(isinstance(v, int) for k, v in t.items() if k != "rtf")  # whole milliseconds


@pytest.mark.parametrize(("fmt", "width"), [("ulaw", 1), ("alaw", 1)])
async def test_timing_counts_audio_of_the_telephony_formats(trimming: str, fmt: str, width: int) -> None:
    ws, _ = await open_session(trimming, response_format=fmt, sample_rate=8000)
    events, frames = await utterance(ws, "Telephony timing.")
    await ws.close()
    t = timing_of(events)
    assert t["audio_ms"] == round(sum(map(len, frames)) / width / 8000 * 1000)
    assert t["audible_ttfa_ms"] is not None and t["trimmed_ms"] <= MAX_MS


async def test_timing_of_a_file_response(trimming: str) -> None:
    ws, _ = await open_session(trimming, response_format="wav", stream_audio=False)
    events, frames = await utterance(ws, "One whole file.")
    await ws.close()
    t = timing_of(events)
    samples, rate = soundfile.read(io.BytesIO(b"".join(frames)), dtype="int16")
    assert t["audio_ms"] == round(len(samples) / rate * 1000)
    assert t["ttfa_ms"] == t["synthesis_ms"]  # the file is the first and the last audio
    onset = rms_onset(samples, rate, SPEECH_DBFS)
    assert onset is not None and abs(t["audible_ttfa_ms"] - t["ttfa_ms"] - onset * 1000 / rate) <= 1
    assert first_above(samples, THRESHOLD) <= PREROLL * rate // 1000 or t["trimmed_ms"] == MAX_MS


async def test_trimmed_audio_starts_the_preroll_before_its_first_sound(trimming: str, untrimmed: str) -> None:
    trims = []
    for text in ("Your package will arrive on Monday afternoon.", "Hello there!", "I have booked a table."):
        events, pcm, _ = await spoken(trimming, text)
        t = timing_of(events)
        trims.append(t["trimmed_ms"])
        start = first_above(pcm, THRESHOLD)
        assert start is not None
        if 0 < t["trimmed_ms"] < MAX_MS:
            assert start == PREROLL * MS  # cut to exactly the pre-roll: no onset lost
        else:
            assert start <= PREROLL * MS  # nothing to trim: it already started within the pre-roll
        _, raw, _ = await spoken(untrimmed, text)
        lead = first_above(raw, THRESHOLD)
        assert lead is not None and lead * 1000 // RATE < MAX_MS  # Piper's lead is short: the cap never bites
    assert any(trims), f"Piper's leading silence was never trimmed: {trims}"


async def test_untrimmed_server_trims_nothing(untrimmed: str) -> None:
    events, _, _ = await spoken(untrimmed, "Hello there!")
    assert timing_of(events)["trimmed_ms"] == 0


@pytest.mark.parametrize("addr_fixture", ["trimming", "untrimmed"])
async def test_marks_count_the_audio_sent(addr_fixture: str, request: pytest.FixtureRequest) -> None:
    """Each audio.mark's sample_offset is where its segment begins in the audio the client received (at
    the engine's rate no resampler shifts it): the trimmed start is not counted."""
    events, pcm, before = await spoken(request.getfixturevalue(addr_fixture), SENTENCES)
    marks = [e for e in events if e["type"] == "audio.mark"]
    assert [m["segment_index"] for m in marks] == [0, 1, 2]
    assert [m["sample_offset"] for m in marks] == before
    assert before[0] == 0 and before == sorted(before) and before[-1] < pcm.size


async def test_marks_shift_at_a_resampled_rate(trimming: str) -> None:
    events, pcm, before = await spoken(trimming, SENTENCES, sample_rate=16000)
    offsets = [e["sample_offset"] for e in events if e["type"] == "audio.mark"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] < pcm.size
    # The streaming resampler delays its output a few samples; the marks are off by no more than that.
    assert all(abs(o - b) <= 64 for o, b in zip(offsets, before, strict=True))


def test_metrics_have_the_timing_histograms_by_model_and_tenant(trimming: str) -> None:
    with urllib.request.urlopen(f"http://{trimming}/metrics") as r:
        body = r.read().decode()
    for name in ("voxgate_response_queue_wait_seconds", "voxgate_response_ttfa_seconds",
                 "voxgate_response_audible_ttfa_seconds", "voxgate_response_rtf"):  # fmt: skip
        assert f'{name}_count{{model="piper",tenant="default"}}' in body, name


# -- OpenAI's POST /v1/audio/speech ----------------------------------------------------------------


@pytest.fixture(scope="module")
def oai(trimming: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"http://{trimming}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_openai_streamed_response_has_queue_wait_and_ttfa_headers(oai: openai.OpenAI) -> None:
    raw = oai.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="Timed.", response_format="pcm")
    assert int(raw.headers["x-queue-wait-ms"]) >= 0 and int(raw.headers["x-ttfa-ms"]) > 0
    assert "x-audio-ms" not in raw.headers  # unknown when the headers leave, before the audio
    pcm = np.frombuffer(raw.parse().content, np.int16)
    assert first_above(pcm, THRESHOLD) <= PREROLL * MS  # trimmed as on the WebSocket (Piper's lead < the cap)


@pytest.mark.parametrize("fmt", ["flac", "mp3", "opus"])
def test_openai_whole_file_has_every_timing_header(oai: openai.OpenAI, fmt: str) -> None:
    raw = oai.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input="A whole file.",
                                                    response_format=fmt)  # fmt: skip
    h = raw.headers
    ttfa, audible, synthesis = (int(h[k]) for k in ("x-ttfa-ms", "x-audible-ttfa-ms", "x-synthesis-ms"))
    assert 0 < ttfa == synthesis <= audible <= ttfa + MAX_MS  # one file: the first and the last audio
    assert 0 <= int(h["x-trimmed-ms"]) <= MAX_MS and int(h["x-queue-wait-ms"]) >= 0
    assert float(h["x-rtf"]) == pytest.approx(synthesis / int(h["x-audio-ms"]), abs=0.002)
    samples, rate = soundfile.read(io.BytesIO(raw.parse().content))
    if fmt == "flac":  # lossless and unpadded: the samples are the audio counted
        assert int(h["x-audio-ms"]) == round(len(samples) / rate * 1000)


def test_openai_sse_done_event_carries_the_whole_record(trimming: str) -> None:
    body = json.dumps({"input": "Server sent timing.", "response_format": "pcm", "stream_format": "sse"}).encode()
    req = urllib.request.Request(f"http://{trimming}/v1/audio/speech", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert int(r.headers["X-TTFA-Ms"]) > 0
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == len(audio) // 2
    t = done["timing"]
    assert t["audio_ms"] == round(len(audio) / 2 / RATE * 1000)
    assert 0 < t["ttfa_ms"] <= t["audible_ttfa_ms"] and t["ttfa_ms"] <= t["synthesis_ms"]
    assert 0 <= t["trimmed_ms"] <= MAX_MS


def test_openai_whole_file_client_that_leaves_frees_its_engine_stream(trimming: str, cpu_engine: Engine) -> None:
    """A file is assembled before its headers (to time it whole): a client leaving meanwhile must still
    cancel its engine stream at once, as a streamed body's does."""

    def active() -> int:
        return cpu_engine.capacity().active  # type: ignore[attr-defined]

    def wait_for(check: Any, what: str) -> None:
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    body = json.dumps({"input": "A long answer that takes a while to speak. " * 90, "response_format": "mp3"})
    host, port = trimming.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"POST /v1/audio/speech HTTP/1.1\r\nHost: {trimming}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())  # fmt: skip
        wait_for(lambda: active() >= 1, "the request never started")
    wait_for(lambda: active() == 0, "the departed client's engine stream was not cancelled")


async def test_queue_wait_is_timed_apart_from_ttfa(cpu_engine: Engine) -> None:
    """With room for one stream, a second session's utterance waits for admission: the wait is its
    `queue_wait_ms`, and its TTFA clock starts only when its text goes to the engine."""
    for addr in serve(cpu_engine, Limits(config_timeout=5.0), max_active_streams=1, first_audio_slo_s=0):
        first, _ = await open_session(addr)
        second, _ = await open_session(addr)
        await first.send(json.dumps({"type": "input.text", "text": SENTENCES * 2}))
        await first.send(json.dumps({"type": "input.done"}))
        while True:  # the first stream holds the one slot once its audio has begun
            m = await first.recv()
            if isinstance(m, str) and json.loads(m)["type"] == "audio.start":
                break
        events, _ = await utterance(second, "Waiting my turn.")
        t = timing_of(events)
        assert t["queue_wait_ms"] > 0 and any(e["type"] == "audio.waiting" for e in events)
        assert t["ttfa_ms"] is not None and t["audio_ms"] > 0
        await first.close()
        await second.close()
