"""The Qwen3-TTS engine behind the `Engine`/`Stream` contract (DESIGN §3): `load_engine("tiny" | PATH)`.

`Qwen3Engine` validates a stream's options on the caller's thread (so bad requests fail at once with
an `EngineError`) and hands everything else to the `EngineCore` thread (engine/core.py).

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

from engine.core import CoreConfig, EngineCore, StreamOptions
from engine.cpu.cache import cache_dir
from engine.qwen3.edge import decoder_id
from engine.qwen3.model import Qwen3TTSModel, SamplingParams
from engine.stream import EventBridge
from engine.types import EngineError, StreamEvent, VoiceInfo

log = logging.getLogger("voxgate.engine.qwen3")

STREAM_OPTIONS = ("sample_rate", "speed", "seed", "instructions", "output", "ref_audio", "ref_text")
OUTPUTS = ("pcm", "codec_tokens")
#: ISO 639-1 codes (what the gateway speaks) for the model's language names.
ISO_LANGUAGES = {
    "chinese": "zh", "english": "en", "german": "de", "italian": "it", "portuguese": "pt", "spanish": "es",
    "japanese": "ja", "korean": "ko", "french": "fr", "russian": "ru",
}


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
        self.rid, self._bridge = self._core.submit(
            opts, lambda rid: EventBridge(engine.config.queue_size, on_cancel=lambda: self._core.cancel(rid))
        )
        self._finished = False

    def append(self, text: str) -> None:
        if self._finished:
            raise EngineError("invalid_state", "append after finish")
        if not self._bridge.ended:
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
    threads, frames_per_token, min_frames, kv_block, warm_up, cuda_graphs; `greedy` makes every stream argmax."""

    def __init__(self, model: Qwen3TTSModel, *, greedy: bool = False, model_path: Path | None = None,
                 **options: Any) -> None:
        if "max_batch" not in options and "max_streams" in options:
            options["max_batch"] = min(int(options["max_streams"]), CoreConfig().max_batch)
        try:
            self.config = CoreConfig(**options)
        except TypeError as exc:
            raise EngineError("invalid_option", f"unknown engine option: {exc}") from None
        self.model, self.model_path = model, model_path
        self.decoder_id = decoder_id(model_path) if model_path is not None else "unknown"
        self.greedy = greedy
        self.sample_rate = model.sample_rate
        self.core = EngineCore(model, self.config)
        self._streams: weakref.WeakSet[Qwen3Stream] = weakref.WeakSet()
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
            return [VoiceInfo("default", langs, description=f"Qwen3-TTS {kind}")]
        return [VoiceInfo(s, langs, description="Qwen3-TTS preset speaker") for s in self.model.speakers]

    def languages(self) -> list[str]:
        return ["auto", *[ISO_LANGUAGES.get(name, name) for name in self.model.languages if name != "auto"]]

    def _model_language(self, language: str) -> str:
        lang = (language or "auto").strip().lower()
        names = self.model.languages
        if lang in names:
            return lang
        base = lang.replace("_", "-").split("-")[0]
        for name in names:
            if ISO_LANGUAGES.get(name) == base:
                return name
        raise EngineError("unsupported_language", f"this model speaks no language {language!r}; "
                                                  f"available: {self.languages()}")

    def _reference(self, options: dict[str, object]) -> tuple[bytes, str | None] | None:
        """A cloned voice's clip (audio file bytes) and transcript; Base checkpoints speak nothing else."""
        audio, text = options.get("ref_audio"), options.get("ref_text")
        if audio is None:
            if self.supports_cloning:
                raise EngineError("unknown_voice", "a Base checkpoint speaks cloned voices only: register one "
                                                   "from a recording, ref_audio (POST /v1/audio/voices)")
            return None
        if not self.supports_cloning:
            raise EngineError("voice_cloning_unsupported",
                              f"this {self.model.model_type} checkpoint cannot clone voices (Base checkpoints can)")
        if not isinstance(audio, bytes | bytearray) or not audio:
            raise EngineError("invalid_option", "ref_audio must be the bytes of an audio file")
        if text is not None and not isinstance(text, str):
            raise EngineError("invalid_option", "ref_text must be a string")
        return bytes(audio), text or None

    def _speaker(self, voice: str | None) -> str | None:
        if voice is None or not voice.strip() or voice.strip().lower() in ("default", "auto"):
            return None
        if self.model.model_type != "custom_voice":
            raise EngineError("unknown_voice", f"this {self.model.model_type} checkpoint has no named voices")
        name = voice.strip().lower()
        if name not in self.model.speakers:
            raise EngineError("unknown_voice", f"no voice {voice!r}; available: {self.model.speakers}")
        return name

    def open_stream(self, voice: str | None, language: str, **options: object) -> Qwen3Stream:
        """Options: `sample_rate` (8000–48000; audio is resampled with soxr), `seed` (reproducible
        sampling, alone or batched), `instructions` (voice design / 1.7B CustomVoice), `speed` (1.0 only:
        the model has no rate control), `ref_audio` + `ref_text` (a cloned voice, Base checkpoints)."""
        if self._closed:
            raise EngineError("engine_closed", "the Qwen3 engine is closed")
        bad = sorted(set(options) - set(STREAM_OPTIONS))
        if bad:
            raise EngineError("invalid_option", f"the Qwen3 engine takes no option {bad}; known: {STREAM_OPTIONS}")
        rate = options.get("sample_rate", self.sample_rate)
        if isinstance(rate, bool) or not isinstance(rate, int) or not 8000 <= rate <= 48000:
            raise EngineError("invalid_option", f"sample_rate must be an integer within 8000–48000, got {rate!r}")
        speed = options.get("speed", 1.0)
        if speed != 1.0:
            raise EngineError("invalid_option",
                              f"the Qwen3 engine speaks at its own rate; speed {speed!r} is not supported")
        seed = options.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise EngineError("invalid_option", f"seed must be a non-negative integer, got {seed!r}")
        instructions = options.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise EngineError("invalid_option", "instructions must be a string")
        output = options.get("output", "pcm")
        if output not in OUTPUTS:
            raise EngineError("invalid_option", f"output must be one of {OUTPUTS}, got {output!r}")
        params = SamplingParams.from_defaults(self.model.gen, greedy=self.greedy, seed=seed)
        opts = StreamOptions(self._speaker(voice), self._model_language(language), instructions or None, rate,
                             params, codec_tokens=output == "codec_tokens", reference=self._reference(options))
        stream = Qwen3Stream(self, opts)
        self._streams.add(stream)
        return stream

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
