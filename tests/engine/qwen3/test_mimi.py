"""The speech tokenizer's Mimi encoder (reference audio → ICL codes), on the tiny Base checkpoint through the
real loader. Code equality with the official encoder is in test_parity.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.qwen3 import CheckpointError, Qwen3TTSModel, load_model, make_tiny_checkpoint
from engine.qwen3.config import MimiEncoderConfig
from engine.qwen3.mimi import MimiEncoder, resample_to_24k

SR = 24000


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base-mimi"), seed=0, model_type="base")


@pytest.fixture(scope="module")
def base_model(base_dir: Path) -> Qwen3TTSModel:
    return load_model(base_dir)


def _voice(seconds: float, sr: int = SR, f0: float = 170.0) -> np.ndarray:
    t = np.arange(int(seconds * sr)) / sr
    tone = np.sin(2 * np.pi * f0 * t + 3 * np.sin(2 * np.pi * 2 * t)) * (1 + 0.5 * np.sin(2 * np.pi * 4 * t))
    noise = np.random.default_rng(int(f0)).standard_normal(t.shape)
    return (0.3 * tone + 0.02 * noise).astype(np.float32)


def test_the_base_loader_builds_the_encoder_and_others_skip_it(base_model: Qwen3TTSModel,
                                                               tiny_model: Qwen3TTSModel) -> None:
    assert isinstance(base_model.codec_encoder, MimiEncoder)
    assert base_model.codec_encoder.valid == 16 and not base_model.codec_encoder.training
    assert tiny_model.codec_encoder is None  # CustomVoice cannot clone: its file's encoder stays unloaded
    with pytest.raises(ValueError, match="no speech-tokenizer encoder"):
        tiny_model.encode_reference(_voice(1.0))


@pytest.mark.parametrize("samples", [1, 1919, 1920, 1921, SR * 2, SR * 5 + 777])
def test_codes_are_16_codebooks_per_1920_samples(base_model: Qwen3TTSModel, samples: int) -> None:
    wav = np.resize(_voice(6.0), samples)
    codes = base_model.encode_reference(wav)
    assert codes.dtype == np.int64 and codes.shape == (-(-samples // 1920), 16)
    assert codes.min() >= 0 and codes.max() < 2048


def test_encoding_is_deterministic_and_depends_on_the_audio(base_model: Qwen3TTSModel) -> None:
    wav = _voice(3.0)
    codes = base_model.encode_reference(wav)
    assert np.array_equal(codes, base_model.encode_reference(wav.copy()))
    other = base_model.encode_reference(_voice(3.0, f0=260.0))
    assert (codes != other).mean() > 0.5
    # Random codebooks fitted to the tiny encoder's spread: every codebook uses many entries.
    assert min(len(set(codes[:, i].tolist())) for i in range(16)) >= 10


def test_the_encoder_is_causal(base_model: Qwen3TTSModel) -> None:
    """A whole number of frames encodes to the prefix of the longer clip's codes: nothing looks ahead
    (left padding only; the right padding and replicate edge touch just the last, partial frame)."""
    wav = _voice(4.0)
    full = base_model.encode_reference(wav)
    assert np.array_equal(base_model.encode_reference(wav[: 20 * 1920]), full[:20])


def test_other_sample_rates_are_resampled_first(base_model: Qwen3TTSModel) -> None:
    wav16 = _voice(2.0, sr=16000)
    codes = base_model.encode_reference(wav16, 16000)
    assert codes.shape == (-(-int(np.ceil(wav16.shape[0] * 1.5)) // 1920), 16)
    assert np.array_equal(codes, base_model.encode_reference(resample_to_24k(wav16, 16000)))
    assert resample_to_24k(wav16[:1001], 16000).shape == (1502,)  # librosa's length: ceil(n · ratio)


def test_clone_with_a_transcript_encodes_the_reference_for_icl(base_model: Qwen3TTSModel) -> None:
    wav = _voice(2.0)
    voice = base_model.clone_voice(wav, ref_text="Good morning to you.")
    assert voice.icl and voice.ref_codes is not None
    assert torch.equal(voice.ref_codes, torch.from_numpy(base_model.encode_reference(wav)))
    assert voice.ref_codes.shape == (25, 16)
    assert not base_model.clone_voice(wav).icl  # no transcript: x-vector only, nothing encoded
    given = np.zeros((4, 16), np.int64)
    assert torch.equal(base_model.clone_voice(wav, ref_text="Hi.", ref_codes=given).ref_codes,
                       torch.from_numpy(given))  # caller's codes win
    prompt = base_model.build_prompt("Hello there.", voice=voice, language="english")
    assert prompt.ref_codes is not None and torch.equal(prompt.ref_codes, voice.ref_codes)
    x_only = base_model.build_prompt("Hello there.", voice=base_model.clone_voice(wav), language="english")
    assert prompt.rows.shape[0] == x_only.rows.shape[0] + 25  # one row per reference frame (ICL track)
    codes = base_model.generate("Hello there.", voice=voice, language="english", greedy=True, max_frames=12)
    assert codes.ndim == 2 and codes.shape[1] == 16 and 1 <= codes.shape[0] <= 12
    again = base_model.generate("Hello there.", voice=base_model.clone_voice(wav, ref_text="Good morning to you."),
                                language="english", greedy=True, max_frames=12)
    assert np.array_equal(codes, again)


def test_every_stored_encoder_tensor_lands_in_the_encoder_unchanged(base_dir: Path,
                                                                    base_model: Qwen3TTSModel) -> None:
    stored = {k: v for k, v in load_file(base_dir / "speech_tokenizer" / "model.safetensors").items()
              if k.startswith("encoder.")}
    assert base_model.codec_encoder is not None
    ours = {f"encoder.{k}": v for k, v in base_model.codec_encoder.state_dict().items()}
    assert ours.keys() == stored.keys()  # the tiny file holds exactly the 16 codebooks that are used
    assert all(torch.equal(ours[k], v) for k, v in stored.items())


def test_a_missing_encoder_tensor_is_a_checkpoint_error(base_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "broken"
    shutil.copytree(base_dir, d)
    path = d / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(path)
    del tensors["encoder.encoder_transformer.layers.0.mlp.fc1.weight"]
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"missing 1: encoder\.encoder_transformer\.layers\.0\.mlp\.fc1"):
        load_model(d)


def test_codebooks_past_the_valid_16_are_skipped(base_dir: Path, base_model: Qwen3TTSModel, tmp_path: Path) -> None:
    """Real files hold 32 quantizers of which 16 are used: the rest load as nothing, not as an error."""
    d = tmp_path / "more-codebooks"
    shutil.copytree(base_dir, d)
    cfg_path = d / "speech_tokenizer" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["encoder_config"]["num_quantizers"] = 20
    cfg_path.write_text(json.dumps(cfg))
    path = d / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(path)
    layer = "encoder.quantizer.acoustic_residual_vector_quantizer.layers"
    for i in range(15, 19):
        for name in ("initialized", "cluster_usage", "embed_sum"):
            tensors[f"{layer}.{i}.codebook.{name}"] = tensors[f"{layer}.0.codebook.{name}"].clone()
    save_file(tensors, str(path))
    model = load_model(d)
    assert model.codec_encoder is not None and model.codec_encoder.n_codebooks == 16
    wav = _voice(1.5)
    assert np.array_equal(model.encode_reference(wav), base_model.encode_reference(wav))


def test_real_size_encoder_shapes() -> None:
    """The published encoder config (512 wide, 8 layers, 32 × 256-dim codebooks) on the meta device."""
    cfg = MimiEncoderConfig.from_dict({"_frame_rate": 12.5})
    cfg.validate(16, 1920)
    with torch.device("meta"):
        full, used = MimiEncoder(cfg), MimiEncoder(cfg, n_codebooks=16)
    assert cfg.downsample_kernel == 4 and used.samples_per_frame == 1920
    state = full.state_dict()
    assert state["encoder.layers.0.conv.weight"].shape == (64, 1, 7)
    assert state["encoder.layers.12.conv.weight"].shape == (1024, 512, 16)
    assert state["quantizer.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum"].shape == (2048, 256)
    assert state["quantizer.semantic_residual_vector_quantizer.input_proj.weight"].shape == (256, 512, 1)
    assert sum(t.numel() for t in state.values()) == 56_234_304
    assert sum(t.numel() for t in used.state_dict().values()) == 47_812_912  # what load_model keeps
    assert len(used.unused_prefixes("encoder.")) == 16
