"""The synthetic engine, `load_engine("synthetic")`: speech-shaped audio at a set pace, no model.

For load-testing a deployment (the gateway, its balancer, Redis) without a GPU or CPU voices to spend,
and for capacity benchmarks: vLLM's dummy weights serve the same end. It is a real engine behind the
`Engine`/`Stream` contract (engine/types.py) — streams, segments, word timings, `Waiting`, cancel, capacity —
whose cost is close to nothing, so what a load test measures is the rest of the deployment.

The audio is babble, not words: a voiced source (a glottal pulse train with a wandering pitch) shaped
by vowel formants, one syllable per vowel group of each word (a Han character: one), with a syllable-rate
amplitude envelope and pauses between words and after punctuation. The syllables are made once per
sample rate (`_bank`); a stream's audio is slices of them, so a chunk costs a copy and a multiply.

Pacing: one clock thread serves every stream from a heap of due times and sleeps until the next is due
(no thread per stream, no spinning). With `step_s` it serves them in steps, as a batched GPU engine makes
a frame of every stream it runs per decode step: each chunk comes at the first step at or after it is
due (so up to `step_s` late), every stream's chunk due by then together; the pace is kept (the next chunk
is due from when this one was due, not when it came). A stream's first audio comes `first_audio_s` after
it has text and a slot; each later chunk of `chunk_s` audio seconds comes `chunk_s / speed` after the one
before, so audio is made at `speed` × real time. A stream whose text runs dry waits for more; one whose
consumer is behind (its bounded queue full) is looked at again `RETRY_S` later, never blocking the others.

Capacity: `capacity` streams hold a slot at once (`Capacity.streams`); one opened past it waits for a
slot (a `Waiting("capacity")` event), and past `capacity` waiting `open_stream` refuses (`queue_full`).

Codec tokens (`output="codec_tokens"`): the same plan, paced the same, sent as `CodecFrames` of Qwen3-TTS's
shape (16 codebooks of 2048 at 12.5 frames a second) instead of PCM, so a load test of on-device
decoding clients exercises the gateway's codec path. The codes are a fixed row per bank syllable (and one
for silence) varied frame by frame: token-shaped, decodable by no real decoder (`decoder_id` says so).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import re
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from engine.options import shown, stream_request
from engine.stream import EventBridge
from engine.types import (
    AudioChunk,
    Capacity,
    CodecFrames,
    EngineError,
    StreamEvent,
    StreamRequest,
    VoiceInfo,
    Waiting,
    Words,
    WordTiming,
)
from engine.words import WORD

log = logging.getLogger("voxgate.engine.synthetic")

OUTPUT_RATE = 24000
VOICE = "synthetic"
# Every language the gateway names canonically (engine/languages.py): babble speaks them all.
LANGUAGES = ("en", "zh", "de", "es", "fr", "it", "ja", "ko", "pt", "ru")
# A syllable at request speed 1.0, and the silences around words: about 4 syllables a second with the
# pauses, an ordinary speaking rate (English runs 3-6 syllables/s).
SYLLABLE_S = 0.2
WORD_GAP_S = 0.04
CLAUSE_PAUSE_S = 0.15  # after , ; : and their CJK forms
SENTENCE_PAUSE_S = 0.3  # after . ! ? and their CJK forms
MAX_SYLLABLES = 6  # a word's syllables at most (a 60-letter "word" is not a minute of audio)
# The bank: this many syllables per sample rate, each long enough for the slowest request speed (0.25).
BANK_SYLLABLES = 8
BANK_SYLLABLE_S = SYLLABLE_S / 0.25
BANK_RATES = 8  # sample rates whose banks are kept (clients ask for a few: 8k, 16k, 24k, 48k); 0.6 MB each at 24 kHz
MASTER_RATE = 48000  # the bank is made once at this rate and read at the others
BANK_TOP_HZ = 3500.0  # the highest harmonic: under the lowest rate's (8 kHz) Nyquist, so any rate reads it cleanly
# A stream whose consumer queue is full is looked at again after this long (its audio waits, its
# pace resumes from then): the clock thread never blocks on one consumer.
RETRY_S = 0.02
# Vowels (F1, F2, F3 in Hz; Peterson & Barney adult male means): one per bank syllable.
VOWELS = ((730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480),
          (570, 840, 2410), (660, 1720, 2410), (490, 1350, 1690), (520, 1190, 2390))
# Codec frames (`output="codec_tokens"`), shaped as Qwen3-TTS's 12 Hz tokenizer's: 1920 samples of its
# 24 kHz audio per frame; `codec_info()` tells clients so.
CODEC_FRAME_SAMPLES = 1920
CODEC_BOOKS = 16
CODEC_BOOK_SIZE = 2048
_VOWEL_GROUP = re.compile(r"[aeiouyàáâäèéêëìíîïòóôöùúûüаеёиоуыэюя]+", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?。！？…]\W*$")
_CLAUSE_END = re.compile(r"[,;:，；：、]\W*$")


@dataclass(frozen=True)
class SyntheticOptions:
    """The engine's options (`[engine_options]` or a `[[models]]` table's `options`).

    `speed`: audio made per wall second, × real time (4.0: a busy GPU's per-stream pace). `first_audio_s`:
    seconds from a stream having text and a slot to its first audio (a real engine's prefill and first
    decode). `capacity`: streams served at once (`Capacity.streams`). `chunk_s`: audio seconds per
    `AudioChunk` (the CPU voices' are at most 0.25). `queue_size`: chunks queued per stream for its
    consumer (16 × 0.2 s: 150 kB of 24 kHz audio per stream at most; hundreds of streams share a box).
    `max_pending_chars`: text a stream may hold not yet spoken (`queue_full` past it). `step_s`: 0 (the
    default), each chunk at its own due time; above 0, chunks in steps of this period, every stream's due
    chunk together (a GPU engine's decode step: 0.02 s is one 80 ms frame at 4× real time)."""

    speed: float = 4.0
    first_audio_s: float = 0.1
    capacity: int = 1024
    chunk_s: float = 0.2
    queue_size: int = 16
    max_pending_chars: int = 262144
    step_s: float = 0.0

    def __post_init__(self) -> None:
        bounds: dict[str, tuple[float, float]] = {
            "speed": (0.01, 10000.0), "first_audio_s": (0.0, 60.0), "capacity": (1, 1_000_000),
            "chunk_s": (0.01, 2.0), "queue_size": (1, 100_000), "max_pending_chars": (1, 1 << 30),
            "step_s": (0.0, 1.0),
        }  # fmt: skip
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            whole = name in ("capacity", "queue_size", "max_pending_chars")
            kinds = (int,) if whole else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not (low <= value <= high):
                kind = "an integer" if whole else "a number"
                raise EngineError("model_unavailable",
                                  f"synthetic engine option {name} must be {kind} in [{low:g}, {high:g}], "
                                  f"not {shown(value)}")


class SyntheticEngine:
    """Speech-shaped audio at a set pace and capacity (module docstring); options: `SyntheticOptions`."""

    sample_rate: int = OUTPUT_RATE
    supports_cloning = False

    def __init__(self, options: SyntheticOptions | None = None) -> None:
        self.options = options or SyntheticOptions()
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, SyntheticStream]] = []
        self._seq = itertools.count()
        self._slots = 0  # streams holding a slot
        self._waiting: deque[SyntheticStream] = deque()  # streams waiting for one, in order
        self._streams: weakref.WeakSet[SyntheticStream] = weakref.WeakSet()
        self._busy_s = 0.0
        self._closed = False
        _bank(OUTPUT_RATE)  # the syllables, made before the first stream (once per process)
        self._clock = threading.Thread(target=self._run, name="synthetic-clock", daemon=True)
        self._clock.start()
        log.info("synthetic engine: speed %.2fx, first audio %.3f s, capacity %d streams",
                 self.options.speed, self.options.first_audio_s, self.options.capacity)

    # ---- the Engine contract ----

    def voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(VOICE, LANGUAGES, description="synthetic babble for load tests (no model)")]

    def languages(self) -> list[str]:
        return ["auto", *LANGUAGES]

    def codec_info(self) -> dict[str, object]:
        """What a codec_tokens client is told (`codec.start`): Qwen3-TTS's shape, and a `decoder_id` that
        no real decoder has (the tokens are babble's, not a codec's)."""
        return {"codebooks": CODEC_BOOKS, "codebook_size": CODEC_BOOK_SIZE,
                "frame_rate_hz": OUTPUT_RATE / CODEC_FRAME_SAMPLES, "sample_rate": OUTPUT_RATE,
                "decoder_id": "synthetic"}  # fmt: skip

    def check(self, request: StreamRequest) -> None:
        """Raises the EngineError that opening `request` would. `instructions`, `seed` and a lexicon's
        `phonemes` are accepted and change nothing: babble says no words to pronounce."""
        if self._closed:
            raise EngineError("engine_closed", "the synthetic engine is closed")
        if request.reference is not None:
            raise EngineError("voice_cloning_unsupported", "the synthetic engine cannot clone voices")
        if request.language not in self.languages():
            raise EngineError("unsupported_language", f"the synthetic engine speaks no language "
                              f"{shown(request.language)}; available: {self.languages()}")
        voice = (request.voice or "").strip().lower()
        if voice not in ("", "default", "auto", VOICE):
            raise EngineError("unknown_voice", f"no synthetic voice {shown(request.voice)}; available: [{VOICE!r}]")

    def capacity(self) -> Capacity:
        with self._cond:
            return Capacity(self.options.capacity, self._slots, self._busy_s, workers=1)

    def open_stream(self, voice: str | None, language: str, **options: object) -> SyntheticStream:
        """Open one utterance (options: `StreamRequest`'s, checked by engine/options.py). Past `capacity`
        streams it waits for a slot; past `capacity` waiting it is refused (`queue_full`)."""
        request = stream_request(voice, language, options)
        self.check(request)
        codec = request.output == "codec_tokens"
        rate = OUTPUT_RATE if codec else request.sample_rate or OUTPUT_RATE  # codes are planned at the codec's rate
        bank = _bank(rate)  # a new rate's is read here (ms), on the caller's thread, not on the clock
        with self._cond:
            if self._slots >= self.options.capacity and len(self._waiting) >= self.options.capacity:
                raise EngineError("queue_full", f"the synthetic engine serves {self.options.capacity} streams "
                                  f"and has as many waiting")
            stream = SyntheticStream(self, rate, bank, request.speed, request.word_timings, codec=codec)
            self._streams.add(stream)
            if self._slots < self.options.capacity:
                self._slots += 1
                stream._slot = True
            else:
                self._waiting.append(stream)
                stream._bridge.put(Waiting("capacity", len(self._waiting) - 1), timeout=0)
        return stream

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for stream in list(self._streams):
            stream.cancel()
        self._clock.join(5)

    # ---- used by streams (under self._cond) ----

    def _schedule(self, stream: SyntheticStream, due: float) -> None:
        if stream._scheduled or stream._over:
            return
        stream._scheduled = True
        heapq.heappush(self._heap, (due, next(self._seq), stream))
        if self._heap[0][2] is stream:
            self._cond.notify()

    def _release(self, stream: SyntheticStream) -> None:
        """`stream` is over: its slot goes to the first stream waiting."""
        if stream._over:
            return
        stream._over = True
        if not stream._slot:
            self._waiting.remove(stream)
            return
        stream._slot = False
        self._slots -= 1
        if self._waiting and not self._closed:
            nxt = self._waiting.popleft()
            nxt._slot = True
            self._slots += 1
            nxt._wake(time.monotonic())

    # ---- the clock thread ----

    def _until_next(self) -> float | None:
        """Seconds until the earliest chunk is made (≤ 0: now; None: none scheduled): when it is due, or
        at the first step at or after that (`step_s`). Under `_cond`."""
        if not self._heap:
            return None
        due, step = self._heap[0][0], self.options.step_s
        return (due if step <= 0 else math.ceil(due / step) * step) - time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and ((wait_s := self._until_next()) is None or wait_s > 0):
                    self._cond.wait(wait_s)
                if self._closed:
                    return
                due, _, stream = heapq.heappop(self._heap)
                stream._scheduled = False
            t0 = time.perf_counter()
            try:
                stream._step(due)
            except Exception as exc:  # a bug in one stream ends it, never the clock every stream shares
                log.exception("synthetic stream failed")
                stream._fail(exc)
            with self._cond:
                self._busy_s += time.perf_counter() - t0


class SyntheticStream:
    """One utterance of the synthetic engine. Holds its appended text not yet spoken (at most
    `max_pending_chars`), the plan of the segment it speaks (a few numbers per word) and at most
    `queue_size` chunks in its bridge. `codec`: it sends `CodecFrames` instead of `AudioChunk`s."""

    def __init__(self, engine: SyntheticEngine, rate: int, bank: np.ndarray, speed: float,
                 word_timings: bool, *, codec: bool = False) -> None:
        self._engine = engine
        self.sample_rate = rate
        self._bank = bank
        self._speed = speed  # the request's speaking rate (StreamRequest.speed), not the engine's pace
        self._word_timings = word_timings
        self._codec = codec
        self._bridge = EventBridge(engine.options.queue_size, on_cancel=self._abort)
        self._inbox: deque[tuple[int, str]] = deque()
        self._inbox_chars = 0
        self._appended = 0
        self._finished = False
        self._slot = False  # holds one of the engine's slots
        self._over = False  # ended or cancelled: its slot is given back
        self._scheduled = False  # has an entry in the clock's heap
        self._next_due = 0.0  # when its next chunk is made (time.monotonic)
        self._started = False  # its first audio's delay is spent
        self._frames = 0  # frames put so far: the next chunk's first_frame
        self._codec_frames = 0  # codec frames put so far (codec mode): the next CodecFrames' first_frame
        self._segment: _Segment | None = None  # the segment being spoken (the clock's only)
        # An event its full queue refused, put first next time, with the samples of audio it paces.
        self._pending: tuple[StreamEvent, int] | None = None

    def append(self, text: str) -> None:
        """Queue one segment (O(1)); it is spoken after those before it."""
        with self._engine._cond:
            if self._finished:
                raise EngineError("invalid_state", "append after finish")
            if self._over:
                return
            index = self._appended
            self._appended += 1  # spent even when refused, so later segments keep their indices
            bound = self._engine.options.max_pending_chars
            if self._inbox_chars + len(text) > bound:
                raise EngineError("queue_full", f"segment {index} refused: the stream already holds "
                                  f"{self._inbox_chars} characters not yet spoken (at most {bound})")
            self._inbox.append((index, text))
            self._inbox_chars += len(text)
            self._wake(time.monotonic())

    def finish(self) -> None:
        with self._engine._cond:
            self._finished = True
            self._wake(time.monotonic())

    def cancel(self) -> None:
        self._bridge.cancel()  # drops queued audio, ends with "cancelled", then calls _abort

    def events(self) -> AsyncIterator[StreamEvent]:
        return self._bridge.events()

    # ---- internals ----

    def _wake(self, now: float) -> None:
        """Has work (under the engine's lock): schedule its next chunk, its first after `first_audio_s`."""
        if not self._slot:
            return
        if not self._started and self._inbox:
            self._started = True
            self._next_due = now + self._engine.options.first_audio_s
        self._engine._schedule(self, max(self._next_due, now))

    def _abort(self) -> None:
        with self._engine._cond:
            self._inbox.clear()
            self._inbox_chars = 0
            self._engine._release(self)

    def _fail(self, exc: Exception) -> None:
        self._bridge.end("error", f"synthetic engine: {exc}")
        with self._engine._cond:
            self._engine._release(self)

    def _put(self, event: StreamEvent, due: float, frames: int = 0) -> bool:
        """Put `event` (audio of `frames` samples); False when its queue is full (it is kept and the stream
        looked at again later)."""
        try:
            ok = self._bridge.put(event, timeout=0)  # type: ignore[arg-type]
        except TimeoutError:
            self._pending = (event, frames)
            with self._engine._cond:
                self._next_due = max(due, time.monotonic() + RETRY_S)
                self._engine._schedule(self, self._next_due)
            return False
        if not ok:  # cancelled or ended meanwhile
            self._pending = None
        return ok

    def _step(self, due: float) -> None:
        """On the clock: put what is due — a held event, a segment's words, one chunk — and schedule the next."""
        if self._bridge.ended:
            return
        if self._pending is not None:
            (event, frames), self._pending = self._pending, None
            if not self._put(event, due, frames):
                return
            if isinstance(event, AudioChunk | CodecFrames):
                self._after_chunk(due, frames)
                return
        while self._segment is None or self._segment.done:
            with self._engine._cond:
                if not self._inbox:
                    if self._finished:
                        self._bridge.end("done")
                        self._engine._release(self)
                    return  # idle: `append` or `finish` wakes it
                index, text = self._inbox.popleft()
                self._inbox_chars -= len(text)
            self._segment = _Segment(index, text, self._frames, self.sample_rate, self._speed)
            if self._word_timings and self._segment.words:
                words = Words(index, self.sample_rate, self._segment.words)
                if not self._put(words, due):
                    return
        if self._codec:
            self._step_codec(due)
            return
        pcm = self._segment.render(self._bank, round(self._engine.options.chunk_s * self.sample_rate))
        if pcm.size == 0:
            self._after_chunk(due, 0)
            return
        chunk = AudioChunk(pcm, self.sample_rate, self._frames, self._segment.index)
        self._frames += pcm.size
        if self._put(chunk, due, pcm.size):
            self._after_chunk(due, pcm.size)

    def _step_codec(self, due: float) -> None:
        """One chunk's worth of whole codec frames (the segment's last frame padded out), paced as its audio."""
        assert self._segment is not None
        per_chunk = max(1, round(self._engine.options.chunk_s * OUTPUT_RATE / CODEC_FRAME_SAMPLES))
        codes, samples = self._segment.codes(per_chunk, self._codec_frames)
        if samples == 0:
            self._after_chunk(due, 0)
            return
        frames = CodecFrames(codes, self._codec_frames, self._segment.index)
        self._codec_frames += codes.shape[0]
        self._frames += samples
        if self._put(frames, due, samples):
            self._after_chunk(due, samples)

    def _after_chunk(self, due: float, frames: int) -> None:
        """A chunk of `frames` is out: the next is due when it would have taken `speed` to make."""
        with self._engine._cond:
            self._next_due = due + frames / self.sample_rate / self._engine.options.speed
            self._engine._schedule(self, self._next_due)


class _Segment:
    """One appended segment as a plan: units of (frames, bank syllable or -1 for silence), the words'
    stream-relative frames, and a cursor through the units as it is rendered."""

    def __init__(self, index: int, text: str, first_frame: int, rate: int, speed: float) -> None:
        self.index = index
        syllable = round(SYLLABLE_S / speed * rate)
        gap = round(WORD_GAP_S / speed * rate)
        self._units: list[tuple[int, int]] = []
        words: list[WordTiming] = []
        frame = first_frame
        for match in WORD.finditer(text):
            word = match.group()
            if self._units:
                self._units.append((gap, -1))
                frame += gap
            count = _syllables(word)
            seed = zlib.crc32(word.casefold().encode())
            self._units += [(syllable, (seed + i) % BANK_SYLLABLES) for i in range(count)]
            words.append(WordTiming(word, frame, frame + count * syllable))
            frame += count * syllable
        if words:
            tail = text.rstrip()
            pause = WORD_GAP_S
            if _SENTENCE_END.search(tail):
                pause = SENTENCE_PAUSE_S
            elif _CLAUSE_END.search(tail):
                pause = CLAUSE_PAUSE_S
            self._units.append((round(pause / speed * rate), -1))
        self.words = tuple(words)
        self._unit = 0
        self._offset = 0  # frames of the current unit already rendered

    @property
    def done(self) -> bool:
        return self._unit >= len(self._units)

    def _take(self, frames: int) -> list[tuple[int, int, int, int]]:
        """Advance the cursor by the next `frames` frames (fewer at the segment's end): the pieces passed,
        as (unit length, syllable or -1, offset in the unit, frames taken)."""
        pieces: list[tuple[int, int, int, int]] = []
        left = frames
        while left > 0 and not self.done:
            length, syllable = self._units[self._unit]
            take = min(left, length - self._offset)
            pieces.append((length, syllable, self._offset, take))
            self._offset += take
            left -= take
            if self._offset >= length:
                self._unit, self._offset = self._unit + 1, 0
        return pieces

    def render(self, bank: np.ndarray, frames: int) -> np.ndarray:
        """The next `frames` frames of the segment (fewer at its end), int16."""
        parts: list[np.ndarray] = []
        for length, syllable, offset, take in self._take(frames):
            if syllable < 0:
                parts.append(np.zeros(take, np.float32))
            else:
                span = slice(offset, offset + take)
                parts.append(bank[syllable, span] * _envelope(length)[span])
        if not parts:
            return np.zeros(0, np.int16)
        audio = np.concatenate(parts)
        return (audio * 32767).astype(np.int16)

    def codes(self, count: int, first: int) -> tuple[np.ndarray, int]:
        """The next `count` codec frames (fewer at the segment's end, whose last is padded out to a whole
        frame), numbered from `first`: int16 [n, CODEC_BOOKS], and the samples of plan they cover. Planned at
        OUTPUT_RATE; each frame takes the syllable (or silence) under its middle."""
        pieces = self._take(count * CODEC_FRAME_SAMPLES)
        samples = sum(p[3] for p in pieces)
        if samples == 0:
            return np.zeros((0, CODEC_BOOKS), np.int16), 0
        under = np.repeat(np.array([p[1] for p in pieces]), [p[3] for p in pieces])
        n = -(-samples // CODEC_FRAME_SAMPLES)
        middles = np.minimum(np.arange(n) * CODEC_FRAME_SAMPLES + CODEC_FRAME_SAMPLES // 2, samples - 1)
        syllables = under[middles]
        codes = _code_rows()[syllables].astype(np.int32)  # -1: the last row, silence
        voiced = syllables >= 0
        # Voiced frames drift in the acoustic books (codebooks 1..15) as a real codec's do; silence holds.
        codes[voiced, 1:] += (np.arange(first, first + n)[voiced, None] * np.arange(1, CODEC_BOOKS)) % 61
        return (codes % CODEC_BOOK_SIZE).astype(np.int16), samples


def _syllables(word: str) -> int:
    """A word's syllables: its vowel groups (a Han character, a digit: one each), 1 to MAX_SYLLABLES."""
    if len(word) == 1:
        return 1
    if word.isdigit():
        return min(MAX_SYLLABLES, len(word))
    return max(1, min(MAX_SYLLABLES, len(_VOWEL_GROUP.findall(word))))


@lru_cache(maxsize=1)
def _code_rows() -> np.ndarray:
    """int16 [BANK_SYLLABLES + 1, CODEC_BOOKS]: one codec row per bank syllable, the last for silence."""
    rows = np.random.default_rng(37).integers(0, CODEC_BOOK_SIZE, (BANK_SYLLABLES + 1, CODEC_BOOKS))
    return rows.astype(np.int16)


@lru_cache(maxsize=64)
def _envelope(length: int) -> np.ndarray:
    """A syllable's amplitude: a quick rise, a long hold and a fall (syllable-rate modulation)."""
    x = (np.arange(length, dtype=np.float32) + 0.5) / length
    return (np.sin(np.pi * x) ** 0.6).astype(np.float32)


@lru_cache(maxsize=BANK_RATES)
def _bank(rate: int) -> np.ndarray:
    """The syllables at `rate`, float32 [syllables, frames]: the master bank read at `rate` (a linear
    interpolation, a few ms: its content lies below BANK_TOP_HZ, far under any rate's Nyquist)."""
    master = _master_bank()
    if rate == MASTER_RATE:
        return master
    length = round(BANK_SYLLABLE_S * rate)
    at = np.arange(length) * (MASTER_RATE / rate)
    grid = np.arange(master.shape[1])
    return np.stack([np.interp(at, grid, row) for row in master]).astype(np.float32)


@lru_cache(maxsize=1)
def _master_bank() -> np.ndarray:
    """`BANK_SYLLABLES` voiced syllables at MASTER_RATE peaking near 0.3: a glottal pulse train (harmonics
    falling 6 dB/octave, up to BANK_TOP_HZ) with a pitch that wanders and falls, each harmonic weighted by
    one vowel's formants, and a short noise burst, low-passed, at the onset (a consonant). Made once
    (about 0.1 s), when the engine loads."""
    rng = np.random.default_rng(37)
    length = round(BANK_SYLLABLE_S * MASTER_RATE)
    t = np.arange(length, dtype=np.float64) / MASTER_RATE
    bank = np.zeros((BANK_SYLLABLES, length), np.float32)
    burst = round(0.03 * MASTER_RATE)
    smooth = np.ones(12) / 12  # a moving average: the burst's noise kept mostly below 4 kHz
    for i, formants in enumerate(VOWELS[:BANK_SYLLABLES]):
        f0_base = 105.0 + 12.0 * i
        f0 = f0_base * (1.0 + 0.05 * np.sin(2 * np.pi * 3.0 * t + i) - 0.04 * t / BANK_SYLLABLE_S)
        phase = 2 * np.pi * np.cumsum(f0) / MASTER_RATE
        audio = np.zeros(length)
        for k in range(1, int(BANK_TOP_HZ // (f0_base * 1.06)) + 1):  # the wandering pitch stays under the top
            f = k * f0_base
            weight = sum(math.exp(-(((f - formant) / (60.0 + 0.06 * formant)) ** 2)) for formant in formants)
            audio += (weight + 0.02) / k * np.sin(k * phase)
        noise = np.convolve(rng.standard_normal(burst), smooth, mode="same")
        audio[:burst] += noise / np.abs(noise).max() * np.linspace(0.5, 0.0, burst) * np.abs(audio).max()
        bank[i] = (0.3 * audio / np.abs(audio).max()).astype(np.float32)
    return bank


def load_synthetic_engine(**options: Any) -> SyntheticEngine:
    """`load_engine("synthetic", **options)`: options are `SyntheticOptions`' fields; any other is refused."""
    known = {f for f in SyntheticOptions.__dataclass_fields__}
    if unknown := sorted(set(options) - known, key=str):
        raise EngineError("model_unavailable", f"no synthetic engine option {[shown(k) for k in unknown[:5]]}; "
                          f"known: {sorted(known)}")
    return SyntheticEngine(SyntheticOptions(**options))

