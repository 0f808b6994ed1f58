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

from engine.qwen3 import Qwen3TTSModel, load_model, make_tiny_checkpoint
from engine.qwen3.speaker_encoder import mel_filterbank

pytestmark = [pytest.mark.parity, pytest.mark.reference]
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


@pytest.fixture(scope="module")
def base_pair(tmp_path_factory: pytest.TempPathFactory, reference: Any) -> tuple[Any, Qwen3TTSModel]:
    from qwen_tts import Qwen3TTSModel as Official

    d = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base"), seed=1, model_type="base")
    return Official.from_pretrained(str(d), dtype=torch.float32, attn_implementation="sdpa"), load_model(d)


def _voice_audio() -> np.ndarray:
    t = np.arange(24000 * 2) / 24000
    return (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def test_mel_filters_match_librosa(reference: Any) -> None:
    import librosa

    want = librosa.filters.mel(sr=24000, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    assert np.allclose(mel_filterbank(), want, rtol=1e-5, atol=1e-8)


def test_x_vector_and_base_codes_match_the_official_model(base_pair: tuple[Any, Qwen3TTSModel]) -> None:
    ref, ours = base_pair
    wav = _voice_audio()
    want = ref.model.extract_speaker_embedding(wav, 24000)
    voice = ours.clone_voice(wav)
    assert torch.allclose(voice.speaker_embedding, want.float(), rtol=1e-4, atol=1e-5)
    text = "The quick brown fox jumps over the lazy dog, and then it runs all the way back home again."
    ids = ref._tokenize_texts([ref._build_assistant_text(text)])
    prompt = {"ref_code": [None], "ref_spk_embedding": [voice.speaker_embedding], "x_vector_only_mode": [True],
              "icl_mode": [False]}
    codes, _ = ref.model.generate(input_ids=ids, voice_clone_prompt=prompt, languages=["english"],
                                  non_streaming_mode=False, max_new_tokens=FRAMES + 1, do_sample=False,
                                  subtalker_dosample=False)
    got = ours.generate(text, voice=voice, language="english", greedy=True, max_frames=FRAMES)
    assert codes[0].shape[0] >= 20 and np.array_equal(got, codes[0].numpy())


def test_icl_codes_match_the_official_model(base_pair: tuple[Any, Qwen3TTSModel]) -> None:
    ref, ours = base_pair
    voice = ours.clone_voice(_voice_audio(), ref_text="Good morning to you.",
                             ref_codes=torch.randint(0, 2048, (6, 16), generator=torch.Generator().manual_seed(5)))
    text = "The quick brown fox jumps over the lazy dog, and then it runs all the way back home again."
    ids = ref._tokenize_texts([ref._build_assistant_text(text)])
    ref_ids = [ref._tokenize_texts([ref._build_ref_text("Good morning to you.")])[0]]
    prompt = {"ref_code": [voice.ref_codes], "ref_spk_embedding": [voice.speaker_embedding],
              "x_vector_only_mode": [False], "icl_mode": [True]}
    for streaming in (True, False):
        codes, _ = ref.model.generate(input_ids=ids, ref_ids=ref_ids, voice_clone_prompt=prompt,
                                      languages=["english"], non_streaming_mode=not streaming,
                                      max_new_tokens=FRAMES + 1, do_sample=False, subtalker_dosample=False)
        got = ours.generate(text, voice=voice, language="english", greedy=True, max_frames=FRAMES,
                            streaming_text=streaming)
        assert codes[0].shape[0] >= 20 and np.array_equal(got, codes[0].numpy()), streaming


REF_TEXT = "Good morning to you."


def _clips() -> list[tuple[str, np.ndarray, int]]:
    """Synthetic references: a chirp, noise, a long voiced tone (past the 250-frame window the official
    stack does not apply), one sample over a frame, and 16 kHz / 44.1 kHz input that gets resampled."""
    rng = np.random.default_rng(11)

    def chirp(seconds: float, sr: int) -> np.ndarray:
        t = np.arange(int(seconds * sr)) / sr
        return (0.4 * np.sin(2 * np.pi * (80 + 700 * t / seconds) * t)).astype(np.float32)

    t12 = np.arange(24000 * 12) / 24000
    voiced = 0.3 * np.sin(2 * np.pi * 150 * t12 + 4 * np.sin(2 * np.pi * 3 * t12))
    voiced += 0.01 * rng.standard_normal(t12.shape)
    return [
        ("chirp", chirp(3.0, 24000), 24000),
        ("noise", (0.2 * rng.standard_normal(31_000)).astype(np.float32), 24000),
        ("voiced 12 s", voiced.astype(np.float32), 24000),
        ("1921 samples", chirp(1.0, 24000)[:1921], 24000),
        ("16 kHz", chirp(2.5, 16000) + (0.02 * rng.standard_normal(40_000)).astype(np.float32), 16000),
        ("44.1 kHz", chirp(1.3, 44100), 44100),
    ]


@pytest.mark.parametrize("index", range(6), ids=[name for name, _, _ in _clips()])
def test_reference_codes_match_the_official_speech_tokenizer(base_pair: tuple[Any, Qwen3TTSModel],
                                                             index: int) -> None:
    ref, ours = base_pair
    _, wav, sr = _clips()[index]
    want = ref.model.speech_tokenizer.encode(wav, sr=sr).audio_codes[0].numpy()
    got = ours.encode_reference(wav, sr)
    assert want.shape == got.shape == (-(-int(np.ceil(wav.shape[0] * 24000 / sr)) // 1920), 16)
    assert np.array_equal(got, want)


def test_encoder_latents_match_the_official_mimi(base_pair: tuple[Any, Qwen3TTSModel]) -> None:
    """The pre-quantizer embedding (conv encoder → transformer → downsampling), before any argmin."""
    ref, ours = base_pair
    official, mine = ref.model.speech_tokenizer.model.encoder, ours.codec_encoder
    assert mine is not None
    x = torch.from_numpy(_clips()[0][1])[None, None]
    with torch.no_grad():
        want = official.encoder(x)
        want = official.downsample(official.encoder_transformer(want.transpose(1, 2))[0].transpose(1, 2))
        got = mine.encoder(x)
        got = mine.downsample(mine.encoder_transformer(got.transpose(1, 2)).transpose(1, 2))
    assert want.shape == got.shape
    assert float((want - got).abs().max()) <= 1e-6 * float(want.abs().max())


@pytest.mark.parametrize("sr", [24000, 16000])
def test_icl_from_raw_audio_matches_the_official_voice_clone(base_pair: tuple[Any, Qwen3TTSModel], sr: int) -> None:
    """From a raw reference clip: the official create_voice_clone_prompt's codes and x-vector, its greedy
    generate's codes and generate_voice_clone's waveform (reference prepended, then cut) all equal ours."""
    ref, ours = base_pair
    t = np.arange(sr * 2) / sr
    wav = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
    items = ref.create_voice_clone_prompt(ref_audio=(wav, sr), ref_text=REF_TEXT, x_vector_only_mode=False)
    voice = ours.clone_voice(wav, sr, ref_text=REF_TEXT)
    assert voice.ref_codes is not None and np.array_equal(voice.ref_codes.numpy(), items[0].ref_code.numpy())
    assert torch.allclose(voice.speaker_embedding, items[0].ref_spk_embedding.float(), rtol=1e-4, atol=1e-5)
    text = "The quick brown fox jumps over the lazy dog, and then it runs all the way back home again."
    ids = ref._tokenize_texts([ref._build_assistant_text(text)])
    ref_ids = [ref._tokenize_texts([ref._build_ref_text(REF_TEXT)])[0]]
    prompt = ref._prompt_items_to_voice_clone_prompt(items)
    want, _ = ref.model.generate(input_ids=ids, ref_ids=ref_ids, voice_clone_prompt=prompt, languages=["english"],
                                 non_streaming_mode=False, max_new_tokens=FRAMES + 1, do_sample=False,
                                 subtalker_dosample=False)
    got = ours.generate(text, voice=voice, language="english", greedy=True, max_frames=FRAMES)
    assert want[0].shape[0] >= 20 and np.array_equal(got, want[0].numpy())
    wavs, out_sr = ref.generate_voice_clone(text, language="english", ref_audio=(wav, sr), ref_text=REF_TEXT,
                                            non_streaming_mode=False, max_new_tokens=FRAMES + 1, do_sample=False,
                                            subtalker_dosample=False)
    n_ref = voice.ref_codes.shape[0]
    full = ours.decode(np.concatenate([voice.ref_codes.numpy(), got]))
    mine = full[int(n_ref / (n_ref + got.shape[0]) * full.shape[0]):]  # the wrapper's proportional cut
    assert out_sr == 24000 and wavs[0].shape == mine.shape
    assert float(np.max(np.abs(wavs[0] - mine))) <= 1e-5 * float(np.max(np.abs(mine)))
