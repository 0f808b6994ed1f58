"""A small runner for Piper VITS voices (ONNX + json config), phonemes from espeak-ng.

Written here rather than using `piper-tts` (GPL-3.0 runtime with its own espeak copy): the runner is
the phoneme-id mapping below plus one onnxruntime call per sentence. With a cache directory the graph
is patched once to also output its duration predictor's frames per id (engine/cpu/durations.py), so
each run's words come with their exact sample spans (`run_timed`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engine.cpu.durations import PIPER_DURATIONS, with_durations
from engine.cpu.espeak import Espeak, Pinned
from engine.cpu.onnx import make_session
from engine.cpu.text import sentences, split_long, strip_han
from engine.cpu.timings import TimedUnit, place, plan
from engine.cpu.voice_config import VOICE_DEFAULT, VoiceConfig
from engine.words import words

_BOS, _EOS, _PAD = "^", "$", "_"


class PiperVoice:
    """One Piper voice: `units(text)` → phoneme-id sequences, `run(ids, speed)` → float32 audio.
    `voice_config`: how long a run may be (`piper_max_phonemes`) and how its words are aligned."""

    def __init__(self, model_path: Path, config_path: Path, espeak: Espeak, threads: int = 1,
                 cache: Path | None = None, voice_config: VoiceConfig = VOICE_DEFAULT) -> None:
        cfg = json.loads(Path(config_path).read_text(encoding="utf-8"))
        self.sample_rate: int = int(cfg["audio"]["sample_rate"])
        self.espeak_voice: str = cfg.get("espeak", {}).get("voice", "en-us")
        inf = cfg.get("inference", {})
        self._noise_scale = float(inf.get("noise_scale", 0.667))
        self._length_scale = float(inf.get("length_scale", 1.0))
        self._noise_w = float(inf.get("noise_w", 0.8))
        self._id_map: dict[str, list[int]] = cfg["phoneme_id_map"]
        self._espeak = espeak
        self._voice_config = voice_config
        graph = with_durations(Path(model_path), PIPER_DURATIONS, cache) if cache is not None else Path(model_path)
        self._session = make_session(graph, threads)
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.timed = len(self._session.get_outputs()) > 1  # the graph says how long each id lasts

    def units(self, text: str) -> list[list[int]]:
        """One phoneme-id sequence per sentence (Han characters dropped: this voice cannot read them)."""
        return [u.ids for u in self.timed_units(text)]

    @property
    def inventory(self) -> frozenset[str]:
        """The phoneme symbols this voice knows (an IPA entry's symbols must be among them)."""
        return frozenset(self._id_map)

    def timed_units(self, text: str, pinned: Pinned | None = None) -> list[TimedUnit]:
        """`units` with each run's words placed in its ids (engine/cpu/timings.py); `pinned`: words
        whose IPA is given (a lexicon's), spoken as given."""
        out: list[TimedUnit] = []
        for sentence in sentences(strip_han(text)):
            ipa = self._espeak.phonemize(sentence, self.espeak_voice, pinned)
            groups = [[w] for w in words(sentence)]
            cut = split_long(ipa, self._voice_config.piper_max_phonemes)
            for unit in plan(ipa, groups, cut, self.ids_spans, self._voice_config):
                if len(unit.ids) > 3:  # BOS, PAD, EOS alone would be silence
                    out.append(unit)
        return out

    def _ids(self, phonemes: str) -> list[int]:
        return self.ids_spans(phonemes)[0]

    def ids_spans(self, phonemes: str) -> tuple[list[int], list[tuple[int, int] | None]]:
        # Piper's layout: BOS PAD, each known phoneme followed by PAD, EOS. A phoneme's span holds its PAD.
        ids = [*self._id_map[_BOS], *self._id_map[_PAD]]
        spans: list[tuple[int, int] | None] = []
        for ph in phonemes:
            if ph in self._id_map:
                start = len(ids)
                ids += self._id_map[ph]
                ids += self._id_map[_PAD]
                spans.append((start, len(ids)))
            else:
                spans.append(None)
        ids += self._id_map[_EOS]
        return ids, spans

    def run_timed(self, unit: TimedUnit, speed: float = 1.0,
                  run_options: Any = None) -> tuple[np.ndarray, list[tuple[str, int, int]] | None]:
        """The unit's audio and its words as (word, start, end) samples into it (None: an unpatched graph)."""
        outputs = self._run(unit.ids, speed, run_options)
        audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        if len(outputs) < 2:
            return audio, None
        frames = np.asarray(outputs[1], dtype=np.float64).reshape(-1)
        total = frames.sum()
        hop = audio.size / total if total > 0 else 0.0  # samples per frame (256 for Piper medium)
        return audio, place(unit, frames * hop)

    def run(self, ids: list[int], speed: float = 1.0, run_options: Any = None) -> np.ndarray:
        return np.asarray(self._run(ids, speed, run_options)[0], dtype=np.float32).reshape(-1)

    def _run(self, ids: list[int], speed: float, run_options: Any) -> list[Any]:
        feed: dict[str, np.ndarray] = {
            "input": np.asarray([ids], dtype=np.int64),
            "input_lengths": np.asarray([len(ids)], dtype=np.int64),
            "scales": np.asarray(
                [self._noise_scale, self._length_scale / speed, self._noise_w], dtype=np.float32
            ),
        }
        if "sid" in self._inputs:
            feed["sid"] = np.zeros(1, dtype=np.int64)
        return list(self._session.run(None, feed, run_options))
