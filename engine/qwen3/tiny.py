"""`make_tiny_checkpoint(path, seed)`: a tiny, randomly initialised Qwen3-TTS 12Hz checkpoint directory.

Same architecture, tensor names, file layout and special ids as the real CustomVoice checkpoints, only
narrow: talker 64 wide × 2 layers, code predictor 32 wide × 2 layers (so `small_to_mtp_projection` is
exercised), codec decoder with the real strides (1920 samples/frame), window 72 and 16×2048 codebooks
but 32 channels, and the speech tokenizer's Mimi encoder (reference audio → ICL codes) 32 wide with
16-dim quantizers. The text tokenizer is a byte-level BPE with 512 learned tokens plus Qwen's special
tokens. Weights are scaled so activations stay O(1): logits are decisive (no argmax near-ties to flip
between batched and unbatched runs) and the waveform is not clamped flat.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from torch import nn

from engine.qwen3.code_predictor import CodePredictor
from engine.qwen3.codec import Codebook, CodecDecoder, LayerScale, ResidualUnit, SnakeBeta
from engine.qwen3.config import (
    CodecDecoderConfig,
    CodePredictorConfig,
    GenerationDefaults,
    Qwen3TTSConfig,
    SpeechTokenizerConfig,
    TalkerConfig,
)
from engine.qwen3.layers import RMSNorm
from engine.qwen3.mimi import SAMPLE_RATE, MimiEncoder
from engine.qwen3.mimi import Codebook as MimiCodebook
from engine.qwen3.mimi import LayerScale as MimiLayerScale
from engine.qwen3.speaker_encoder import SpeakerEncoder
from engine.qwen3.talker import Talker
from engine.qwen3.text import qwen2_bpe

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
                  "<tts_text_bos_single>"]
BPE_SIZE = 512

# Enough English and Mandarin for the BPE trainer to learn common merges (deterministic).
_CORPUS = [
    # The chat template's pieces must be single tokens, as in Qwen's vocabulary (the prompt slices by count).
    *["assistant\n", "user\n"] * 40,
    "Hello there, how are you doing today? I am doing well, thank you for asking.",
    "The quick brown fox jumps over the lazy dog. This is a test of the text to speech system.",
    "Streaming speech for voice agents should start quickly and never stop in the middle of a sentence.",
    "Numbers like 42 and 3.14 are read aloud; the weather is nice, and the meeting starts at ten.",
    "你好，今天天气很好。我们一起去公园散步吧。语音合成系统需要快速响应。",
    "谢谢你的帮助！请问现在几点了？我想听一段流畅自然的中文语音。",
]


TINY_SPEAKER_ENCODER = {"mel_dim": 128, "enc_dim": 64, "enc_channels": [32, 32, 32, 32, 96],
                        "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1],
                        "enc_attention_channels": 16, "enc_res2net_scale": 8, "enc_se_channels": 16,
                        "sample_rate": 24000}


def tiny_configs(model_type: str = "custom_voice", talker_head_dim: int = 16
                 ) -> tuple[Qwen3TTSConfig, SpeechTokenizerConfig, GenerationDefaults]:
    """`talker_head_dim` 32 gives a talker that vLLM's CPU attention can run (it supports head sizes 32,
    64, 80, …, not 16), for the vLLM talker's tests; 16 keeps the default checkpoint's bytes."""
    n_text = BPE_SIZE + len(SPECIAL_TOKENS)
    special = {tok: BPE_SIZE + i for i, tok in enumerate(SPECIAL_TOKENS)}
    talker = TalkerConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=talker_head_dim, text_vocab_size=n_text, text_hidden_size=32, max_position_embeddings=4096,
        rope_scaling={"mrope_section": [talker_head_dim // 4, talker_head_dim // 8, talker_head_dim // 8],
                      "interleaved": True, "rope_type": "default"},
        codec_language_id={"chinese": 2055, "english": 2050, "japanese": 2058, "beijing_dialect": 2074,
                           "sichuan_dialect": 2062},
        spk_id={"vivian": 3065, "ryan": 3061, "dylan": 2878, "eric": 2875},
        spk_is_dialect={"vivian": False, "ryan": False, "dylan": "beijing_dialect", "eric": "sichuan_dialect"},
        code_predictor_config=CodePredictorConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        ),
    )
    cfg = Qwen3TTSConfig(
        talker_config=talker, tts_model_type="custom_voice", tts_model_size="0b6",
        im_start_token_id=special["<|im_start|>"], im_end_token_id=special["<|im_end|>"],
        tts_pad_token_id=special["<tts_pad>"], tts_bos_token_id=special["<tts_text_bos>"],
        tts_eos_token_id=special["<tts_text_eod>"],
        extra={"architectures": ["Qwen3TTSForConditionalGeneration"], "transformers_version": "4.57.3"},
    )
    if model_type != "custom_voice":  # VoiceDesign and Base checkpoints carry no preset speakers
        cfg.tts_model_type = model_type
        talker.spk_id, talker.spk_is_dialect = {}, {}
    if model_type == "base":
        cfg.speaker_encoder_config = dict(TINY_SPEAKER_ENCODER)
    # A narrow Mimi encoder (reference audio → ICL codes): real strides (1920 samples per frame) and
    # 2048-entry codebooks, 32 wide. Quantizers are 16 wide, narrower than the model as in the real file
    # (256 vs 512), so the RVQ's input projections are exercised.
    mimi = {"hidden_size": 32, "num_filters": 4, "upsampling_ratios": [8, 6, 5, 4], "codebook_size": 2048,
            "codebook_dim": 16, "vector_quantization_hidden_dimension": 16, "num_quantizers": 16,
            "upsample_groups": 32, "num_hidden_layers": 1, "intermediate_size": 64, "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 250, "num_semantic_quantizers": 1,
            "sampling_rate": 24000, "frame_rate": 12.5, "audio_channels": 1}
    codec = SpeechTokenizerConfig(encoder_config=mimi, decoder_config=CodecDecoderConfig(
        codebook_dim=32, latent_dim=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, decoder_dim=32,
    ))
    return cfg, codec, GenerationDefaults()


def _init_(module: nn.Module, g: torch.Generator) -> None:
    """Deterministic O(1)-activation init for every parameter (the reference's default init leaves
    codebooks at zero, which would make the codec's output constant and its tests vacuous)."""

    def normal(t: torch.Tensor, std: float, mean: float = 0.0) -> None:
        t.copy_(torch.randn(t.shape, generator=g) * std + mean)

    for m in module.modules():
        if isinstance(m, nn.Linear):
            normal(m.weight, 1 / math.sqrt(m.in_features))
            if m.bias is not None:
                normal(m.bias, 0.05)
        elif isinstance(m, nn.Conv1d):
            normal(m.weight, 1 / math.sqrt(m.weight.shape[1] * m.weight.shape[2]))
            if m.bias is not None:
                normal(m.bias, 0.05)
        elif isinstance(m, nn.ConvTranspose1d):
            normal(m.weight, 1 / math.sqrt(m.weight.shape[0] * m.weight.shape[2] / m.stride[0]))
            if m.bias is not None:
                normal(m.bias, 0.05)
        elif isinstance(m, nn.Embedding):
            normal(m.weight, 1.0)
        elif isinstance(m, RMSNorm | nn.LayerNorm):
            normal(m.weight, 0.1, 1.0)
            if isinstance(m, nn.LayerNorm):
                normal(m.bias, 0.05)
        elif isinstance(m, Codebook):
            m.cluster_usage.copy_(torch.rand(m.cluster_usage.shape, generator=g) * 1.5 + 0.5)
            normal(m.embedding_sum, 1.0)
        elif isinstance(m, SnakeBeta):
            normal(m.alpha, 0.1)
            normal(m.beta, 0.1)
        elif isinstance(m, LayerScale | MimiLayerScale):
            normal(m.scale, 0.02, 0.3)
    for name, p in module.named_parameters():
        if name.endswith("gamma"):  # ConvNeXt residual scale
            normal(p, 0.02, 0.3)


def _wire_end_of_text(talker: Talker, cfg: Qwen3TTSConfig, g: torch.Generator) -> None:
    """Make the tiny talker end an utterance the way a trained one does: EOS right after it reads tts_eos.

    Random weights never choose EOS, so tiny streams would only end at max_frames. One hidden unit of the
    text projection becomes a tts_eos detector that writes a large vector along a direction d into the
    row's residual stream, and the codec head's EOS row reads d. Final-norm gain 5 sharpens all logits so
    sampling takes that EOS too; elsewhere EOS stays as unlikely as any code (its row is 0.6·d, |d| = 1).
    In streaming-text mode an utterance of n text tokens thus gives about n frames; non-streaming prompts
    have tts_eos mid-prompt, so they run to max_frames.
    """
    h = talker.cfg.hidden_size
    d = torch.randn(h, generator=g)
    d /= d.norm()
    e = talker.model.text_embedding.weight[cfg.tts_eos_token_id]
    fc1, fc2 = talker.text_projection.linear_fc1, talker.text_projection.linear_fc2
    fc1.weight[0] = e * (20 / e.dot(e))  # 20 on tts_eos; other tokens ~N(0, 3.5), below the 16 threshold
    assert fc1.bias is not None
    fc1.bias[0] = -16.0
    fc2.weight[:, 0] = d * 80.0
    talker.model.norm.weight.mul_(5.0)
    talker.codec_head.weight[talker.cfg.codec_eos_token_id] = d * 0.6


def _calibrate_codec(codec: CodecDecoder, g: torch.Generator) -> None:
    """Tame the residual stacks and scale the output conv so random codes give ~0.3 RMS, unclamped."""
    for m in codec.modules():
        if isinstance(m, ResidualUnit):
            m.conv2.conv.weight.mul_(0.3)
    codec.refresh()
    codes = torch.randint(0, codec.cfg.codebook_size, (1, 16, 24), generator=g)
    last = codec.decoder[-1].conv
    h = codes
    with torch.no_grad():
        x = codec.pre_conv(codec.quantizer.decode(h))
        x = codec.pre_transformer(x.transpose(1, 2)).transpose(1, 2)
        for trans, convnext in codec.upsample:
            x = convnext(trans(x))
        for m in codec.decoder:
            x = m(x)
    # Two significant digits: the measured std varies in its last bits with the thread count, and the
    # checkpoint's bytes must not.
    scale = float(f"{0.3 / float(x.std()):.2g}")
    last.weight.mul_(scale)
    assert last.bias is not None
    last.bias.mul_(scale)


def _mimi_encoder(codec_cfg: SpeechTokenizerConfig, seed: int) -> MimiEncoder:
    """The speech tokenizer's encoder, from its own generator so every other tensor keeps its bytes.

    Codebook k is scaled to what reaches it: the semantic and first acoustic codebooks to the projected
    embedding's spread, later acoustic ones to the residual left by the one before (×0.6 each), so random
    audio uses many entries of every codebook instead of collapsing onto a few.
    """
    g = torch.Generator().manual_seed(0x4D494D49 + seed)  # "MIMI"
    encoder = MimiEncoder(codec_cfg.encoder(), codec_cfg.encoder_valid_num_quantizers)
    with torch.no_grad():
        _init_(encoder, g)
        for m in encoder.modules():
            if isinstance(m, MimiCodebook):
                m.cluster_usage.copy_(torch.rand(m.cluster_usage.shape, generator=g) * 1.5 + 0.5)
                m.embed_sum.copy_(torch.randn(m.embed_sum.shape, generator=g) * m.cluster_usage[:, None])
        encoder.refresh()
        t = torch.arange(SAMPLE_RATE * 2) / SAMPLE_RATE
        probe = 0.3 * torch.sin(2 * torch.pi * (100 + 400 * t) * t) + 0.05 * torch.randn(t.shape, generator=g)
        h = encoder.encoder(probe[None, None])
        h = encoder.downsample(encoder.encoder_transformer(h.transpose(1, 2)).transpose(1, 2))
        q = encoder.quantizer
        for rvq in (q.semantic_residual_vector_quantizer, q.acoustic_residual_vector_quantizer):
            assert rvq.input_proj is not None
            x = rvq.input_proj(h)
            # Two significant digits, as in _calibrate_codec: the file's bytes must not follow thread counts.
            spread = float(f"{float(x.std()):.2g}")
            for k, vq in enumerate(rvq.layers):
                vq.codebook.embed_sum.mul_(spread * 0.6**k)
        encoder.refresh()
    return encoder


def _train_tokenizer() -> Tokenizer:
    tok = qwen2_bpe({}, [])
    tok.model = models.BPE()
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def _write_tokenizer(root: Path) -> None:
    tok = _train_tokenizer()
    vocab: dict[str, int] = dict(sorted(tok.get_vocab().items(), key=lambda kv: kv[1]))  # stable file bytes
    if len(vocab) > BPE_SIZE:
        raise RuntimeError(f"tiny BPE learned {len(vocab)} tokens, more than {BPE_SIZE}")
    # Pad the vocabulary to exactly BPE_SIZE with unreachable tokens so the special ids are fixed.
    for i in range(len(vocab), BPE_SIZE):
        vocab[f"<|unused_{i}|>"] = i
    model_json = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model_json["merges"]]
    (root / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (root / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    added = {
        str(BPE_SIZE + i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                             "single_word": False, "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    (root / "tokenizer_config.json").write_text(json.dumps({
        "add_prefix_space": False, "added_tokens_decoder": added, "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }, indent=2), encoding="utf-8")


def _state(module: nn.Module, prefix: str) -> dict[str, torch.Tensor]:
    return {prefix + k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}


def make_tiny_checkpoint(path: str | Path, seed: int = 0, model_type: str = "custom_voice",
                         talker_head_dim: int = 16,
                         configs: tuple[Qwen3TTSConfig, SpeechTokenizerConfig, GenerationDefaults] | None = None
                         ) -> Path:
    """Write a tiny checkpoint directory at `path` (created if needed) and return it. `model_type`:
    custom_voice (speakers vivian, ryan, dylan, eric), voice_design, or base (with a speaker encoder);
    `talker_head_dim` 32 for a checkpoint vLLM's CPU attention runs too (see `tiny_configs`). `configs`
    replaces the tiny sizes (bench/gpu_check.sh: random weights at the real 0.6B/1.7B sizes)."""
    root = Path(path)
    (root / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    cfg, codec_cfg, gen = configs or tiny_configs(model_type, talker_head_dim)
    g = torch.Generator().manual_seed(seed)
    tc = cfg.talker_config
    with torch.no_grad():
        talker = Talker(tc)
        predictor = CodePredictor(tc.code_predictor_config, tc.hidden_size)
        codec = CodecDecoder(codec_cfg.decoder_config)
        for m in (talker, predictor, codec):
            _init_(m, g)
        _calibrate_codec(codec, g)
        _wire_end_of_text(talker, cfg, g)
    tensors = _state(talker, "talker.") | _state(predictor, "talker.code_predictor.")
    if model_type == "base":
        encoder = SpeakerEncoder(cfg.speaker_encoder_config)
        with torch.no_grad():
            _init_(encoder, g)
        tensors |= _state(encoder, "speaker_encoder.")
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    codec_path = root / "speech_tokenizer" / "model.safetensors"
    codec_tensors = _state(codec, "decoder.") | _state(_mimi_encoder(codec_cfg, seed), "encoder.")
    save_file(codec_tensors, str(codec_path), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2), encoding="utf-8")
    (root / "generation_config.json").write_text(json.dumps(gen.to_dict(), indent=2), encoding="utf-8")
    st = codec_cfg.to_dict() | {"architectures": ["Qwen3TTSTokenizerV2Model"]}
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps(st, indent=2), encoding="utf-8")
    # What the official loader's AutoFeatureExtractor reads (the encoder side; unused by our decoder).
    (root / "speech_tokenizer" / "preprocessor_config.json").write_text(json.dumps({
        "chunk_length_s": None, "feature_extractor_type": "EncodecFeatureExtractor", "feature_size": 1,
        "overlap": None, "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
        "sampling_rate": 24000,
    }, indent=2), encoding="utf-8")
    _write_tokenizer(root)
    return root
