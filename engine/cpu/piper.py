"""A small runner for Piper VITS voices (ONNX + json config), phonemes from espeak-ng.

Written here rather than using `piper-tts` (GPL-3.0 runtime with its own espeak copy): the runner is
the phoneme-id mapping below plus one onnxruntime call per sentence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engine.cpu.espeak import Espeak
from engine.cpu.onnx import make_session
from engine.cpu.text import sentences, split_long, strip_han

_BOS, _EOS, _PAD = "^", "$", "_"
_MAX_PHONEMES = 400  # VITS attention cost grows with length; longer sentences are cut at clauses


class PiperVoice:
    """One Piper voice: `units(text)` → phoneme-id sequences, `run(ids, speed)` → float32 audio."""

    def __init__(self, model_path: Path, config_path: Path, espeak: Espeak, threads: int = 1) -> None:
        cfg = json.loads(Path(config_path).read_text(encoding="utf-8"))
        self.sample_rate: int = int(cfg["audio"]["sample_rate"])
        self.espeak_voice: str = cfg.get("espeak", {}).get("voice", "en-us")
        inf = cfg.get("inference", {})
        self._noise_scale = float(inf.get("noise_scale", 0.667))
        self._length_scale = float(inf.get("length_scale", 1.0))
        self._noise_w = float(inf.get("noise_w", 0.8))
        self._id_map: dict[str, list[int]] = cfg["phoneme_id_map"]
        self._espeak = espeak
        self._session = make_session(model_path, threads)
        self._inputs = {i.name for i in self._session.get_inputs()}

    def units(self, text: str) -> list[list[int]]:
        """One phoneme-id sequence per sentence (Han characters dropped: this voice cannot read them)."""
        out: list[list[int]] = []
        for sentence in sentences(strip_han(text)):
            ipa = self._espeak.phonemize(sentence, self.espeak_voice)
            for piece in split_long(ipa, _MAX_PHONEMES):
                ids = self._ids(piece)
                if len(ids) > 3:  # BOS, PAD, EOS alone would be silence
                    out.append(ids)
        return out

    def _ids(self, phonemes: str) -> list[int]:
        # Piper's layout: BOS PAD, each known phoneme followed by PAD, EOS.
        ids = [*self._id_map[_BOS], *self._id_map[_PAD]]
        for ph in phonemes:
            if ph in self._id_map:
                ids += self._id_map[ph]
                ids += self._id_map[_PAD]
        ids += self._id_map[_EOS]
        return ids

    def run(self, ids: list[int], speed: float = 1.0, run_options: Any = None) -> np.ndarray:
        feed: dict[str, np.ndarray] = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray(
                [self._noise_scale, self._length_scale / speed, self._noise_w], dtype=np.float32
            ),
        }
        if "sid" in self._inputs:
            feed["sid"] = np.zeros(1, dtype=np.int64)
        audio = self._session.run(None, feed, run_options)[0]
        return np.asarray(audio, dtype=np.float32).reshape(-1)
