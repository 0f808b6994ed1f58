"""The Qwen3-TTS engine behind the `Engine`/`Stream` contract (engine/types.py): `load_engine("tiny" | PATH)`.

`Qwen3Engine` validates a stream's options on the caller's thread (so bad requests fail at once with
an `EngineError`) and hands everything else to the `EngineCore` thread (engine/qwen3/serving/core.py).

"tiny" is `engine.qwen3.make_tiny_checkpoint` written once into the cache directory ($VOXGATE_CACHE,
default ~/.cache/voxgate) under a name derived from the generator's source, so a changed tiny model
is rebuilt instead of silently reused, and loaded through the same loader as a real checkpoint.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from engine.cache import cache_dir
from engine.languages import canonical_language
from engine.options import shown, stream_request
from engine.qwen3.edge import decoder_id
from engine.qwen3.generate import SamplingParams
from engine.qwen3.model import Qwen3TTSModel
from engine.qwen3.serving.core import CoreConfig, EngineCore, StreamOptions, TextLedger
from engine.qwen3.serving.talker_backend import TalkerFactory, talker_factory
from engine.stream import EventBridge
from engine.types import Capacity, EngineError, StreamEvent, StreamRequest, VoiceInfo

log = logging.getLogger("voxgate.engine.qwen3")

MIN_TOKENS_PER_REQUEST = 16  # the prompt must leave at least this much text room in a request
PROMPT_ROWS_BESIDES_INSTRUCTIONS = 12  # role 3, codec prefix ≤ 6 with a speaker, the first text token: ≤ 10

#: Tiny checkpoints by model name: the CustomVoice layout (named speakers), Base (cloned voices only).
TINY_MODELS = {"tiny": "custom_voice", "tiny-base": "base"}


def tiny_checkpoint(cache: str | os.PathLike[str] | None = None, model_type: str = "custom_voice") -> Path:
    """The tiny checkpoint directory, written on first use (atomically: concurrent first uses are safe)."""
    from engine.qwen3 import tiny

    digest = hashlib.sha256(inspect.getsource(tiny).encode()).hexdigest()[:12]
    kind = "" if model_type == "custom_voice" else f"{model_type}-"
    target = cache_dir(cache) / f"qwen3-tts-tiny-{kind}{digest}"
    if (target / "config.json").exists():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=".qwen3-tiny-", dir=target.parent))
    try:
        tiny.make_tiny_checkpoint(tmp, seed=0, model_type=model_type)
        try:
            tmp.rename(target)
        except OSError:  # another process got there first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


class Qwen3Stream:
    def __init__(self, engine: Qwen3Engine, opts: StreamOptions) -> None:
        self._core = engine.core
        self._ledger = TextLedger()
        self.rid, self._bridge = self._core.submit(
            opts, lambda rid: EventBridge(engine.config.queue_size, on_cancel=lambda: self._core.cancel(rid)),
            self._ledger,
        )
        self._max_pending = engine.config.max_pending_chars
        self._appended = 0
        self._finished = False

    def append(self, text: str) -> None:
        """Queue one segment. Past `max_pending_chars` of text no request has taken yet it is refused
        with `queue_full` (its index is spent all the same, so later segments keep theirs)."""
        if self._finished:
            raise EngineError("invalid_state", "append after finish")
        if not isinstance(text, str):
            raise EngineError("invalid_text", f"append takes a string, got {shown(text)}")
        index = self._appended
        self._appended += 1
        if self._bridge.ended:
            return
        pending = self._ledger.pending
        if pending + len(text) > self._max_pending:
            self._core.append(self.rid, "")  # the core counts segments by appends
            raise EngineError("queue_full", f"segment {index} refused: the stream already holds {pending} "
                                            f"characters not yet spoken (at most {self._max_pending})")
        self._ledger.appended += len(text)
        self._core.append(self.rid, text)

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._core.finish(self.rid)

    def cancel(self) -> None:
        self._bridge.cancel()  # its on_cancel tells the core, which frees the slot before its next step

    def events(self) -> AsyncIterator[StreamEvent]:
        return self._bridge.events()


class Qwen3Engine:
    """Options (see `CoreConfig`): max_streams, max_context, max_batch, ramp, max_codec_rows, queue_size,
    threads, frames_per_token, min_frames, kv_block, warm_up, cuda_graphs, first_hold_s, hold_more_s;
    `greedy` makes every stream argmax; `talker` the talker backend (a name in engine/qwen3/serving/talker_backend.py
    `TALKERS`, default "native", or a `TalkerFactory`) and `talker_options` its own options."""

    def __init__(self, model: Qwen3TTSModel, *, greedy: bool = False, model_path: Path | None = None,
                 talker: str | TalkerFactory = "native", talker_options: dict[str, Any] | None = None,
                 **options: Any) -> None:
        if "max_batch" not in options and "max_streams" in options:
            options["max_batch"] = min(int(options["max_streams"]), CoreConfig().max_batch)
        try:
            self.config = CoreConfig(**options)
        except TypeError as exc:
            raise EngineError("invalid_option", f"unknown engine option: {exc}") from None
        except ValueError as exc:
            raise EngineError("invalid_option", str(exc)) from None
        self.model, self.model_path = model, model_path
        self.decoder_id = decoder_id(model_path) if model_path is not None else "unknown"
        self.greedy = greedy
        self.sample_rate = model.sample_rate
        try:
            factory = talker_factory(talker)
        except ValueError as exc:
            raise EngineError("invalid_option", str(exc)) from None
        self.core = EngineCore(model, self.config, talker=factory, talker_options=talker_options)
        self._streams: weakref.WeakSet[Qwen3Stream] = weakref.WeakSet()
        self._weights_bytes: int | None = None  # counted once, at the first memory()
        self._closed = False

    @property
    def supports_cloning(self) -> bool:
        """Base checkpoints speak cloned voices (gateway/voices.py registers them): x-vector, plus ICL
        when the clone has a transcript and the checkpoint its speech-tokenizer encoder."""
        return self.model.speaker_encoder is not None

    def voices(self) -> list[VoiceInfo]:
        langs = tuple(self.languages()[1:])
        kind = self.model.model_type
        if kind != "custom_voice":  # voice design / base: one unnamed voice shaped by instructions or a clone
            shaped = "designed" if kind == "voice_design" else "preset"
            return [VoiceInfo("default", langs, kind=shaped, description=f"Qwen3-TTS {kind}")]
        return [VoiceInfo(s, langs, description="Qwen3-TTS preset speaker") for s in self.model.speakers]

    def languages(self) -> list[str]:
        return ["auto", *[canonical_language(name) for name in self.model.languages if name != "auto"]]

    def _model_language(self, language: str) -> str:
        """The model's name ("chinese") for a request's language, canonical already ("zh": the request's
        check made it so, engine/languages.py)."""
        names = self.model.languages
        if language in names:
            return language
        for name in names:
            if canonical_language(name) == language:
                return name
        raise EngineError("unsupported_language", f"this model speaks no language {shown(language)}; "
                                                  f"available: {self.languages()}")

    def _reference(self, request: StreamRequest) -> tuple[bytes, str | None] | None:
        """A cloned voice's clip (audio file bytes) and transcript; Base checkpoints speak nothing else."""
        clip = request.reference
        if clip is None:
            if self.supports_cloning:
                raise EngineError("unknown_voice", "a Base checkpoint speaks cloned voices only: register one "
                                                   "from a recording, ref_audio (POST /v1/audio/voices)")
            return None
        if not self.supports_cloning:
            raise EngineError("voice_cloning_unsupported",
                              f"this {self.model.model_type} checkpoint cannot clone voices (Base checkpoints can)")
        return clip.audio, clip.text or None

    def _speaker(self, voice: str | None) -> str | None:
        if voice is None or not voice.strip() or voice.strip().lower() in ("default", "auto"):
            return None
        if self.model.model_type != "custom_voice":
            raise EngineError("unknown_voice", f"this {self.model.model_type} checkpoint has no named voices")
        name = voice.strip().lower()
        if name not in self.model.speakers:
            raise EngineError("unknown_voice", f"no voice {shown(voice)}; available: {self.model.speakers}")
        return name

    def check(self, request: StreamRequest) -> None:
        """Raises the EngineError that opening `request` would (cheap: a tokenizer pass over the
        instructions at most; nothing opened)."""
        self._options(request)

    def _options(self, request: StreamRequest) -> StreamOptions:
        if self._closed:
            raise EngineError("engine_closed", "the Qwen3 engine is closed")
        if request.speed != 1.0:
            raise EngineError("invalid_option",
                              f"the Qwen3 engine speaks at its own rate; speed {request.speed:g} is not supported")
        if request.phonemes:  # its talker reads text, not phonemes: a lexicon's IPA entries need a respelling
            raise EngineError("phonemes_unsupported", "the Qwen3 engine reads no IPA phonemes; give the entries a say")
        speaker, language_name = self._speaker(request.voice), self._model_language(request.language)
        reference = self._reference(request)
        self._check_prompt_room(request.instructions)
        params = SamplingParams.from_defaults(self.model.gen, greedy=self.greedy, seed=request.seed)
        return StreamOptions(speaker, language_name, request.instructions or None,
                             request.sample_rate or self.sample_rate, params,
                             codec_tokens=request.output == "codec_tokens", reference=reference,
                             listener_buffer_s=request.listener_buffer_s)

    def open_stream(self, voice: str | None, language: str, **options: object) -> Qwen3Stream:
        """Options (`StreamRequest`'s): `sample_rate` (8000–48000; audio is resampled with soxr), `seed`
        (0–2**63-1: reproducible sampling, alone or batched), `instructions` (voice design / 1.7B
        CustomVoice; at most 2000 characters, and they must leave room for text in `max_context`),
        `speed` (1.0 only: the model has no rate control), `output` (pcm | codec_tokens), `ref_audio` +
        `ref_text` (a cloned voice, Base checkpoints). Every check runs here, so a bad option fails at
        once with `EngineError("invalid_option", …)` (whose message quotes no unbounded input), never later."""
        stream = Qwen3Stream(self, self._options(stream_request(voice, language, options)))
        self._streams.add(stream)
        return stream

    def _check_prompt_room(self, instructions: str | None) -> None:
        """Instructions are prompt rows, one a token: with the rest of the prompt they must leave a
        request room for some text, else every stream would fail at its first prefill. Counted from
        the tokens (cheap: this runs on the caller's thread). A cloned voice's reference frames are
        checked once its clip is made into a voice: a stream that does not fit ends with an error."""
        model = self.model
        ignored = model.model_type == "base" or (model.model_type == "custom_voice"
                                                  and model.cfg.tts_model_size == "0b6")
        if not instructions or ignored:
            return
        rows = len(model.tokenizer.instruct_ids(instructions)) + PROMPT_ROWS_BESIDES_INSTRUCTIONS
        room = self.config.max_context - rows - self.config.min_frames
        if room < self.config.frames_per_token * MIN_TOKENS_PER_REQUEST:
            raise EngineError("invalid_option", f"instructions of {len(instructions)} characters take {rows} of "
                                                f"this engine's {self.config.max_context} prompt positions: "
                                                "shorten them")

    def capacity(self) -> Capacity:
        """How many streams the core keeps ahead of their listeners now, judged from the frames per
        second its cycles have made at each batch size (engine/qwen3/serving/scheduler.py `ThroughputMeter`), capped
        by the slots; and how many streams are open and not ended (holding or waiting for a slot).
        Cheap, any thread: it reads the meter under its lock, never waits for the core."""
        active = sum(1 for s in list(self._streams) if not s._bridge.ended)
        return Capacity(self.core.meter.streams(self.config.max_streams), active)

    def memory(self) -> dict[str, int | None]:
        """What the engine holds, for the gateway's admin plane (gateway/engine_report.py): its weights and
        its slots' state (every slot is allocated at start-up). Cheap: sizes read, nothing waits for the core."""
        per_slot = self.core.bytes_per_slot()
        slots = self.config.max_streams
        if self._weights_bytes is None:
            import torch  # already loaded: the model is torch's

            modules = [m for m in vars(self.model).values() if isinstance(m, torch.nn.Module)]
            self._weights_bytes = sum(t.numel() * t.element_size() for m in modules
                                      for t in [*m.parameters(), *m.buffers()])  # fmt: skip
        return {"weights_bytes": self._weights_bytes, "kv_bytes": per_slot.get("kv", 0) * slots if per_slot else None,
                "slot_bytes": sum(per_slot.values()) * slots if per_slot else None}  # fmt: skip

    def telemetry(self) -> dict[str, float]:
        """The core's own measures for /metrics (gateway/engine_report.py): its last cycle's time and batch,
        slots in use of all, and streams waiting for a slot. Read without the core's lock (a snapshot)."""
        core, slots = self.core, self.config.max_streams
        cycles = core.stats.cycle_s
        in_use = slots - core.free_slots
        out = {"batch_size": float(core.stats.batch_rows), "slots_in_use": float(in_use), "slots_total": float(slots),
               "queue_depth": float(max(0, core.active - in_use))}  # fmt: skip
        if cycles:
            out["cycle_seconds"] = cycles[-1]
        return out

    def codec_info(self) -> dict[str, object]:
        """What a client decoding codec frames on the device needs to know (`codec.start`)."""
        return {
            "codebooks": 16,
            "codebook_size": self.model.codec_cfg.decoder_config.codebook_size,
            "frame_rate_hz": self.model.sample_rate / self.model.samples_per_frame,
            "sample_rate": self.model.sample_rate,
            "decoder_id": self.decoder_id,
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for stream in list(self._streams):
            stream.cancel()
        self.core.stop()


def load_qwen3_engine(model: str, **options: Any) -> Qwen3Engine:
    """"tiny" / "tiny-base" (built once in the cache dir) or a checkpoint directory; `cache_dir` and
    `device` options."""
    from engine.qwen3 import load_model

    cache = options.pop("cache_dir", None)
    device = options.pop("device", "cpu")
    if (name := model.strip().lower()) in TINY_MODELS:
        path = tiny_checkpoint(cache, TINY_MODELS[name])
    else:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise EngineError("model_unavailable",
                              f"{model!r} is not a Qwen3-TTS checkpoint directory (no config.json)")
    try:
        loaded = load_model(path, device=device)
    except (ValueError, OSError) as exc:
        raise EngineError("model_unavailable", f"cannot load {model!r}: {exc}") from exc
    return Qwen3Engine(loaded, model_path=path, **options)
