from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.qwen3 import CheckpointError, Qwen3TTSModel, load_model, make_tiny_checkpoint
from engine.qwen3.weights import read_tensors


def _copy(tiny_dir: Path, dst: Path) -> Path:
    shutil.copytree(tiny_dir, dst)
    return dst


def test_every_stored_tensor_lands_in_the_model_unchanged(tiny_dir: Path, tiny_model: Qwen3TTSModel) -> None:
    stored = load_file(str(tiny_dir / "model.safetensors"))
    ours = {f"talker.{k}": v for k, v in tiny_model.talker.state_dict().items()}
    ours |= {f"talker.code_predictor.{k}": v for k, v in tiny_model.predictor.state_dict().items()}
    assert ours.keys() == stored.keys()
    for k, v in stored.items():
        assert torch.equal(ours[k], v), k
    codec_stored = load_file(str(tiny_dir / "speech_tokenizer" / "model.safetensors"))
    # The file's `encoder.*` (Mimi) serves only Base voice cloning: test_mimi.py checks it on a Base model.
    codec_stored = {k: v for k, v in codec_stored.items() if not k.startswith("encoder.")}
    codec_ours = {f"decoder.{k}": v for k, v in tiny_model.codec.state_dict().items()}
    assert codec_ours.keys() == codec_stored.keys()
    assert all(torch.equal(codec_ours[k], v) for k, v in codec_stored.items())


def test_names_follow_the_official_checkpoint(tiny_dir: Path) -> None:
    names = set(load_file(str(tiny_dir / "model.safetensors")))
    for expected in ("talker.model.layers.1.self_attn.q_norm.weight", "talker.model.codec_embedding.weight",
                     "talker.model.text_embedding.weight", "talker.text_projection.linear_fc2.bias",
                     "talker.codec_head.weight", "talker.code_predictor.model.codec_embedding.14.weight",
                     "talker.code_predictor.lm_head.14.weight", "talker.code_predictor.small_to_mtp_projection.bias",
                     "talker.code_predictor.model.norm.weight"):
        assert expected in names
    codec = set(load_file(str(tiny_dir / "speech_tokenizer" / "model.safetensors")))
    for expected in ("decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum",
                     "decoder.quantizer.rvq_rest.vq.layers.14._codebook.cluster_usage",
                     "decoder.quantizer.rvq_rest.input_proj.weight", "decoder.pre_conv.conv.weight",
                     "decoder.pre_transformer.layers.1.self_attn_layer_scale.scale", "decoder.upsample.1.0.conv.bias",
                     "decoder.upsample.0.1.dwconv.conv.weight", "decoder.upsample.0.1.gamma",
                     "decoder.decoder.4.block.4.conv1.conv.weight", "decoder.decoder.1.block.0.alpha",
                     "decoder.decoder.5.beta", "decoder.decoder.6.conv.weight"):
        assert expected in codec


def test_missing_tensor_is_named(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_dir, tmp_path / "ckpt")
    t = load_file(str(d / "model.safetensors"))
    del t["talker.model.layers.0.mlp.up_proj.weight"]
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing 1: talker\.model\.layers\.0\.mlp\.up_proj\.weight"):
        load_model(d)


def test_unexpected_and_misshapen_tensors_are_named(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_dir, tmp_path / "ckpt")
    t = load_file(str(d / "model.safetensors"))
    t["talker.model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected 1: talker\.model\.layers\.0\.mlp\.extra\.weight"):
        load_model(d)
    t.pop("talker.model.layers.0.mlp.extra.weight")
    t["stray.weight"] = torch.zeros(1)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"outside.*stray\.weight"):
        load_model(d)
    t.pop("stray.weight")
    t["talker.codec_head.weight"] = torch.zeros(3, 3)
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"wrong shape: codec_head\.weight \(3, 3\)"):
        load_model(d)


def test_codec_file_is_checked_strictly_but_encoder_weights_are_skipped(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy(tiny_dir, tmp_path / "ckpt")
    path = d / "speech_tokenizer" / "model.safetensors"
    t = load_file(str(path))
    t["encoder.some.layer.weight"] = torch.ones(4)  # the Mimi encoder ships in the same file
    save_file(t, str(path))
    load_model(d)
    del t["decoder.pre_conv.conv.bias"]
    save_file(t, str(path))
    with pytest.raises(CheckpointError, match=r"decoder\.pre_conv\.conv\.bias"):
        load_model(d)


def test_sharded_index_loads_the_same_model(tiny_dir: Path, tmp_path: Path, tiny_model: Qwen3TTSModel) -> None:
    d = _copy(tiny_dir, tmp_path / "ckpt")
    t = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: t[k] for k in keys}, str(d / file))
        weight_map |= dict.fromkeys(keys, file)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert read_tensors(d).keys() == t.keys()
    m = load_model(d)
    assert torch.equal(m.talker.codec_head.weight, tiny_model.talker.codec_head.weight)


def test_bf16_talker_keeps_an_fp32_codec(tiny_dir: Path) -> None:
    m = load_model(tiny_dir, dtype=torch.bfloat16)
    assert m.talker.codec_head.weight.dtype == torch.bfloat16
    assert m.predictor.lm_head[0].weight.dtype == torch.bfloat16
    assert m.codec.pre_conv.conv.weight.dtype == torch.float32
    codes = m.generate("Hi there.", voice="ryan", language="english", greedy=True, max_frames=4)
    assert codes.shape == (4, 16)


def test_tiny_checkpoint_is_deterministic_per_seed(tiny_dir: Path, tmp_path: Path) -> None:
    again = make_tiny_checkpoint(tmp_path / "again", seed=0)
    other = make_tiny_checkpoint(tmp_path / "other", seed=1)
    files = sorted(p.relative_to(tiny_dir) for p in tiny_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for f in files:
        assert (tiny_dir / f).read_bytes() == (again / f).read_bytes(), f
    assert (other / "model.safetensors").read_bytes() != (tiny_dir / "model.safetensors").read_bytes()


def test_bf16_stored_weights_load_into_an_fp32_model(tiny_dir: Path, tmp_path: Path) -> None:
    """Official checkpoints store the talker in bf16; on CPU the loader upcasts to fp32 by default."""
    d = _copy(tiny_dir, tmp_path / "ckpt")
    t = {k: v.to(torch.bfloat16) for k, v in load_file(str(d / "model.safetensors")).items()}
    save_file(t, str(d / "model.safetensors"))
    m = load_model(d)
    w = m.talker.model.layers[0].mlp.up_proj.weight
    assert w.dtype == torch.float32
    assert torch.equal(w, t["talker.model.layers.0.mlp.up_proj.weight"].float())
    assert m.generate("Hi there.", voice="ryan", greedy=True, max_frames=4).shape[1] == 16
