"""Reference parity against the official `qwen-tts` package (`pytest -m parity`), skipped when it is absent.

`qwen-tts==0.1.1` pins transformers 4.57.3 and pulls a CUDA-linked torchaudio that cannot load beside the
CPU torch, so it lives in its own environment, never in the project's:

    python3 -m venv /tmp/qref && /tmp/qref/bin/pip install torch==2.13.0      # the CPU build on disk
    echo torch==2.13.0 > /tmp/c.txt && /tmp/qref/bin/pip install qwen-tts==0.1.1 pytest -c /tmp/c.txt
    PYTHONPATH=. /tmp/qref/bin/python -m pytest -m parity tests/engine/qwen3/test_parity.py -p no:cacheprovider

`qwen_tts` imports `torchaudio.compliance.kaldi` at import time (only its 25 Hz tokenizer uses it); a stub
module with a real ModuleSpec stands in for torchaudio (transformers calls find_spec on it).
The official code loads the tiny checkpoint from its directory with its own loader, then has to produce
the same greedy codes and the same waveform as ours from the same weights.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.qwen3 import Qwen3TTSModel

pytestmark = pytest.mark.parity
FRAMES = 24


def _stub_torchaudio() -> None:
    try:
        import torchaudio.compliance.kaldi  # noqa: F401
        return
    except (ImportError, OSError):  # the PyPI wheel is CUDA-linked: OSError on a CPU torch
        for name in [m for m in sys.modules if m == "torchaudio" or m.startswith("torchaudio.")]:
            del sys.modules[name]
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
        mod.__path__ = []  # type: ignore[attr-defined]
        sys.modules[name] = mod
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]  # type: ignore[attr-defined]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> Any:
    if importlib.util.find_spec("qwen_tts") is None:
        pytest.skip("the official qwen-tts package is not installed (see this module's doc)")
    _stub_torchaudio()
    from qwen_tts import Qwen3TTSModel as Official

    return Official.from_pretrained(str(tiny_dir), dtype=torch.float32, attn_implementation="sdpa")


def _reference_codes(ref: Any, text: str, speaker: str, language: str, non_streaming: bool) -> np.ndarray:
    ids = ref._tokenize_texts([ref._build_assistant_text(text)])
    codes, _ = ref.model.generate(
        input_ids=ids, languages=[language], speakers=[speaker], non_streaming_mode=non_streaming,
        max_new_tokens=FRAMES + 1, do_sample=False, subtalker_dosample=False, repetition_penalty=1.05,
    )
    return codes[0].cpu().numpy()


def test_official_tokenizer_gives_the_same_ids(reference: Any, tiny_model: Qwen3TTSModel) -> None:
    for text in ("Hello there, how are you?", "你好，今天天气很好。"):
        ids = reference._tokenize_texts([reference._build_assistant_text(text)])[0][0].tolist()
        assert ids == tiny_model.tokenizer.encode(reference._build_assistant_text(text))


@pytest.mark.parametrize(("speaker", "language", "streaming_text"),
                         [("ryan", "english", True), ("vivian", "auto", False), ("dylan", "chinese", True)])
def test_greedy_codes_match_the_official_generate(reference: Any, tiny_model: Qwen3TTSModel, speaker: str,
                                                  language: str, streaming_text: bool) -> None:
    text = ("The quick brown fox jumps over the lazy dog, and then it runs all the way back home again."
            if language != "chinese" else "你好，今天天气很好。我们一起去公园散步吧，然后回家吃晚饭。")
    want = _reference_codes(reference, text, speaker, language, non_streaming=not streaming_text)
    got = tiny_model.generate(text, voice=speaker, language=language, greedy=True, max_frames=FRAMES,
                              streaming_text=streaming_text)
    assert want.shape[0] >= 20
    assert np.array_equal(got[: want.shape[0]], want)


def test_codec_waveform_matches_the_official_decoder(reference: Any, tiny_model: Qwen3TTSModel) -> None:
    codes = torch.randint(0, 2048, (120, 16), generator=torch.Generator().manual_seed(3))
    wavs, sr = reference.model.speech_tokenizer.decode([{"audio_codes": codes}])
    ours = tiny_model.decode(codes.numpy())
    assert sr == 24000 and wavs[0].shape == ours.shape
    assert float(np.max(np.abs(wavs[0] - ours))) <= 1e-5 * float(np.max(np.abs(ours)))
