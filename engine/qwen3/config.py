"""Configuration of a Qwen3-TTS 12Hz checkpoint: root, talker, code predictor and codec decoder.

Field names are those of the checkpoint's `config.json` and `speech_tokenizer/config.json`, so a
config round-trips through JSON unchanged. The class defaults of the reference code are NOT the
checkpoint values (e.g. its talker defaults to 20 layers and eos 4198); `real_config()` holds the real
sizes, and a checkpoint's own file always wins.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A checkpoint config that this implementation cannot run, with the field that is wrong."""


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    """Make dataclass `cls` from `data`, keeping unknown fields in `extra` so they round-trip."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names}
    try:
        obj = cls(**known)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}: {e}") from None
    obj.extra = extra
    return obj


def _dump(obj: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name == "extra":
            continue
        v = getattr(obj, f.name)
        out[f.name] = v.to_dict() if hasattr(v, "to_dict") else v
    out.update(obj.extra)
    return out


def _check_heads(where: str, hidden: int, heads: int, kv_heads: int, head_dim: int) -> None:
    if min(hidden, heads, kv_heads, head_dim) <= 0:
        raise ConfigError(f"{where}: sizes must be positive (hidden {hidden}, heads {heads}, kv {kv_heads})")
    if heads % kv_heads:
        raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if head_dim % 2:
        raise ConfigError(f"{where}: head_dim {head_dim} must be even for rotary embeddings")


@dataclass
class CodePredictorConfig:
    """The 'sub-talker': predicts codebooks 1..15 of a frame from the talker's hidden state."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 2048
    num_code_groups: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 65536
    hidden_act: str = "silu"
    attention_bias: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        where = "talker_config.code_predictor_config"
        _check_heads(where, self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim)
        if self.num_code_groups != 16:
            raise ConfigError(f"{where}: num_code_groups must be 16 (12Hz codec), got {self.num_code_groups}")
        if self.hidden_act != "silu":
            raise ConfigError(f"{where}: hidden_act {self.hidden_act!r} is not supported (silu only)")
        if self.attention_bias:
            raise ConfigError(f"{where}: attention_bias=true is not supported")

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)


@dataclass
class TalkerConfig:
    """The talker: a Qwen3 decoder over summed text+codec rows that predicts codebook 0."""

    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 3072
    text_vocab_size: int = 151936
    text_hidden_size: int = 2048
    num_code_groups: int = 16
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    # MRoPE with identical t/h/w positions is plain 1-D RoPE, so the sections are kept but unused.
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    attention_bias: bool = False
    codec_pad_id: int = 2148
    codec_bos_id: int = 2149
    codec_eos_token_id: int = 2150
    codec_think_id: int = 2154
    codec_nothink_id: int = 2155
    codec_think_bos_id: int = 2156
    codec_think_eos_id: int = 2157
    codec_language_id: dict[str, int] = field(default_factory=dict)
    spk_id: dict[str, Any] = field(default_factory=dict)  # name -> id (some exports write [id])
    spk_is_dialect: dict[str, Any] = field(default_factory=dict)  # name -> dialect language or false
    code_predictor_config: CodePredictorConfig = field(default_factory=CodePredictorConfig)
    extra: dict[str, Any] = field(default_factory=dict)

    def speaker_id(self, name: str) -> int:
        v = self.spk_id[name.lower()]
        return int(v[0]) if isinstance(v, list) else int(v)

    def speaker_dialect(self, name: str) -> str | None:
        d = self.spk_is_dialect.get(name.lower(), False)
        return d if isinstance(d, str) and d else None

    def validate(self) -> None:
        where = "talker_config"
        _check_heads(where, self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim)
        if self.num_code_groups != 16:
            raise ConfigError(f"{where}: num_code_groups must be 16 (12Hz codec), got {self.num_code_groups}")
        if self.hidden_act != "silu":
            raise ConfigError(f"{where}: hidden_act {self.hidden_act!r} is not supported (silu only)")
        if self.attention_bias:
            raise ConfigError(f"{where}: attention_bias=true is not supported")
        if self.extra.get("use_sliding_window"):
            raise ConfigError(f"{where}: use_sliding_window=true is not supported by this talker")
        # Control ids live above the 2048 real codes; sampling suppresses [vocab-1024, vocab) except EOS.
        specials = {
            "codec_pad_id": self.codec_pad_id, "codec_bos_id": self.codec_bos_id,
            "codec_eos_token_id": self.codec_eos_token_id, "codec_think_id": self.codec_think_id,
            "codec_nothink_id": self.codec_nothink_id, "codec_think_bos_id": self.codec_think_bos_id,
            "codec_think_eos_id": self.codec_think_eos_id,
        }
        specials |= {f"codec_language_id[{k}]": v for k, v in self.codec_language_id.items()}
        specials |= {f"spk_id[{k}]": self.speaker_id(k) for k in self.spk_id}
        for name, v in specials.items():
            if not 0 <= int(v) < self.vocab_size:
                raise ConfigError(f"{where}: {name}={v} is outside the codec vocab [0, {self.vocab_size})")
        for spk, dialect in self.spk_is_dialect.items():
            if dialect and dialect not in self.codec_language_id:
                raise ConfigError(f"{where}: speaker {spk!r} has dialect {dialect!r} missing from codec_language_id")
        cp = self.code_predictor_config
        cp.validate()
        if cp.num_code_groups != self.num_code_groups:
            raise ConfigError(f"{where}: code predictor has {cp.num_code_groups} code groups, "
                              f"talker {self.num_code_groups}")
        if not 0 < cp.vocab_size <= self.vocab_size - 1024:
            raise ConfigError(f"{where}: code predictor vocab {cp.vocab_size} overlaps the control ids")

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TalkerConfig:
        data = dict(data)
        cp = _build(CodePredictorConfig, data.pop("code_predictor_config", None) or {}, "code_predictor_config")
        cfg = _build(cls, data, "talker_config")
        cfg.code_predictor_config = cp
        return cfg


@dataclass
class Qwen3TTSConfig:
    """The root `config.json`."""

    talker_config: TalkerConfig = field(default_factory=TalkerConfig)
    tts_model_type: str = "custom_voice"  # custom_voice | voice_design | base
    tts_model_size: str = "0b6"  # 0b6 | 1b7
    tokenizer_type: str = "qwen3_tts_tokenizer_12hz"
    model_type: str = "qwen3_tts"
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    speaker_encoder_config: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.model_type != "qwen3_tts":
            raise ConfigError(f"config.json: model_type must be 'qwen3_tts', got {self.model_type!r}")
        if self.tokenizer_type != "qwen3_tts_tokenizer_12hz":
            raise ConfigError(f"config.json: tokenizer_type {self.tokenizer_type!r} is not supported (12Hz only)")
        if self.tts_model_type not in ("custom_voice", "voice_design", "base"):
            raise ConfigError(f"config.json: unknown tts_model_type {self.tts_model_type!r}")
        self.talker_config.validate()
        n = self.talker_config.text_vocab_size
        for name in ("im_start_token_id", "im_end_token_id", "tts_pad_token_id", "tts_bos_token_id",
                     "tts_eos_token_id"):
            v = getattr(self, name)
            if not 0 <= v < n:
                raise ConfigError(f"config.json: {name}={v} is outside the text vocab [0, {n})")

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Qwen3TTSConfig:
        data = dict(data)
        talker = TalkerConfig.from_dict(data.pop("talker_config", None) or {})
        cfg = _build(cls, data, "config.json")
        cfg.talker_config = talker
        return cfg


@dataclass
class CodecDecoderConfig:
    """`decoder_config` of `speech_tokenizer/config.json`: split RVQ → causal conv → windowed transformer →
    causal upsampling to 1920 samples per frame."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    latent_dim: int = 1024
    hidden_size: int = 512
    intermediate_size: int = 1024
    num_hidden_layers: int = 8
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    sliding_window: int = 72
    layer_scale_initial_scale: float = 0.01
    num_quantizers: int = 16
    num_semantic_quantizers: int = 1
    upsample_rates: list[int] = field(default_factory=lambda: [8, 5, 4, 3])
    upsampling_ratios: list[int] = field(default_factory=lambda: [2, 2])
    decoder_dim: int = 1536
    hidden_act: str = "silu"
    attention_bias: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_upsample(self) -> int:
        return math.prod(self.upsample_rates) * math.prod(self.upsampling_ratios)

    def validate(self) -> None:
        where = "speech_tokenizer/config.json decoder_config"
        _check_heads(where, self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim)
        if self.num_quantizers != 16:
            raise ConfigError(f"{where}: num_quantizers must be 16, got {self.num_quantizers}")
        if self.num_semantic_quantizers != 1:
            raise ConfigError(f"{where}: num_semantic_quantizers must be 1, got {self.num_semantic_quantizers}")
        if self.codebook_dim % 2:
            raise ConfigError(f"{where}: codebook_dim {self.codebook_dim} must be even (split into two halves)")
        if self.decoder_dim % 2 ** len(self.upsample_rates):
            raise ConfigError(f"{where}: decoder_dim {self.decoder_dim} must halve {len(self.upsample_rates)} times")
        if self.sliding_window < 1:
            raise ConfigError(f"{where}: sliding_window must be positive")
        if self.hidden_act != "silu" or self.attention_bias:
            raise ConfigError(f"{where}: only silu MLPs without attention bias are supported")

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)


@dataclass
class MimiEncoderConfig:
    """`encoder_config` of `speech_tokenizer/config.json`: the Mimi encoder that turns reference audio into
    codes (Base voice cloning). Defaults are transformers' `MimiConfig` defaults, which the official loader
    fills in for absent fields; the real checkpoints state 512 wide, 8 layers, 32 quantizers of 256 dims."""

    sampling_rate: int = 24000
    frame_rate: float | None = None  # real files spell it `_frame_rate` (a serialised private field)
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: list[int] = field(default_factory=lambda: [8, 6, 5, 4])
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    use_conv_shortcut: bool = False
    codebook_size: int = 2048
    codebook_dim: int = 256
    vector_quantization_hidden_dimension: int = 256
    num_quantizers: int = 32
    num_semantic_quantizers: int = 1
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None
    hidden_act: str = "gelu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8000
    sliding_window: int = 250
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MimiEncoderConfig:
        cfg = _build(cls, data, "encoder_config")
        if cfg.frame_rate is None and "_frame_rate" in cfg.extra:
            cfg.frame_rate = cfg.extra["_frame_rate"]
        cfg.upsampling_ratios = list(cfg.upsampling_ratios)
        return cfg

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def conv_hop(self) -> int:
        """Samples per frame of the convolutional encoder (before the transformer's downsampling)."""
        return math.prod(self.upsampling_ratios)

    @property
    def downsample_kernel(self) -> int:
        """Kernel of the stride-2 conv from the conv frame rate to `frame_rate` (MimiModel's formula)."""
        conv_rate = math.ceil(self.sampling_rate / self.conv_hop)
        return 2 * int(conv_rate / (self.frame_rate or conv_rate))

    def validate(self, valid_quantizers: int, downsample_rate: int) -> None:
        where = "speech_tokenizer/config.json encoder_config"
        _check_heads(where, self.hidden_size, self.num_attention_heads, self.num_key_value_heads,
                     self.attention_head_dim)
        unsupported = [
            name for name, ok in (
                ("use_causal_conv", self.use_causal_conv), ("pad_mode", self.pad_mode == "constant"),
                ("use_conv_shortcut", not self.use_conv_shortcut), ("hidden_act", self.hidden_act == "gelu"),
                ("attention_bias", not self.attention_bias), ("audio_channels", self.audio_channels == 1),
            ) if not ok
        ]
        if unsupported:
            raise ConfigError(f"{where}: unsupported setting of {unsupported} (causal, zero-padded, mono, gelu)")
        if self.frame_rate is None or self.downsample_kernel < 2:
            raise ConfigError(f"{where}: frame_rate must be below the conv frame rate (a downsampling layer)")
        if self.conv_hop * 2 != downsample_rate:
            raise ConfigError(f"{where}: {self.conv_hop} samples per conv frame × 2 != encode_downsample_rate "
                              f"{downsample_rate}")
        if not self.num_semantic_quantizers <= valid_quantizers <= self.num_quantizers:
            raise ConfigError(f"{where}: encoder_valid_num_quantizers {valid_quantizers} outside "
                              f"[{self.num_semantic_quantizers}, {self.num_quantizers}]")
        if self.vector_quantization_hidden_dimension != self.codebook_dim:
            raise ConfigError(f"{where}: vector_quantization_hidden_dimension must equal codebook_dim")

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)


@dataclass
class SpeechTokenizerConfig:
    """`speech_tokenizer/config.json`. `encoder_config` stays a plain dict so the file round-trips byte for
    byte; `encoder()` parses it (only Base voice cloning runs the encoder)."""

    decoder_config: CodecDecoderConfig = field(default_factory=CodecDecoderConfig)
    encoder_config: dict[str, Any] = field(default_factory=dict)
    model_type: str = "qwen3_tts_tokenizer_12hz"
    encoder_valid_num_quantizers: int = 16
    input_sample_rate: int = 24000
    output_sample_rate: int = 24000
    decode_upsample_rate: int = 1920
    encode_downsample_rate: int = 1920
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        self.decoder_config.validate()
        total = self.decoder_config.total_upsample
        if total != self.decode_upsample_rate:
            raise ConfigError(
                f"speech_tokenizer/config.json: upsampling product {total} != decode_upsample_rate "
                f"{self.decode_upsample_rate}"
            )
        if self.decode_upsample_rate != 1920 or self.output_sample_rate != 24000:
            raise ConfigError("speech_tokenizer/config.json: the 12Hz codec makes 1920 samples per frame at 24 kHz")

    def encoder(self) -> MimiEncoderConfig:
        cfg = MimiEncoderConfig.from_dict(self.encoder_config)
        cfg.validate(self.encoder_valid_num_quantizers, self.encode_downsample_rate)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeechTokenizerConfig:
        data = dict(data)
        dec = _build(CodecDecoderConfig, data.pop("decoder_config", None) or {}, "decoder_config")
        dec.upsample_rates = list(dec.upsample_rates)
        dec.upsampling_ratios = list(dec.upsampling_ratios)
        cfg = _build(cls, data, "speech_tokenizer/config.json")
        cfg.decoder_config = dec
        return cfg


@dataclass
class GenerationDefaults:
    """`generation_config.json` sampling defaults (the official wrapper's hard defaults when absent)."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _dump(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationDefaults:
        return _build(cls, data, "generation_config.json")


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None


def load_configs(path: str | Path) -> tuple[Qwen3TTSConfig, SpeechTokenizerConfig, GenerationDefaults]:
    """Read and validate the three config files of a checkpoint directory."""
    root = Path(path)
    cfg = Qwen3TTSConfig.from_dict(read_json(root / "config.json"))
    cfg.validate()
    codec = SpeechTokenizerConfig.from_dict(read_json(root / "speech_tokenizer" / "config.json"))
    codec.validate()
    gen_path = root / "generation_config.json"
    gen = GenerationDefaults.from_dict(read_json(gen_path)) if gen_path.exists() else GenerationDefaults()
    if codec.decoder_config.codebook_size > cfg.talker_config.vocab_size - 1024:
        raise ConfigError("codec codebook_size overlaps the talker's control ids")
    return cfg, codec, gen


def real_config(size: str, model_type: str = "custom_voice") -> tuple[Qwen3TTSConfig, SpeechTokenizerConfig]:
    """The published 0.6B / 1.7B shapes (for meta-device size checks; a checkpoint's files always win)."""
    if size not in ("0b6", "1b7"):
        raise ConfigError(f"unknown size {size!r}: use 0b6 or 1b7")
    hidden, inter = (1024, 3072) if size == "0b6" else (2048, 6144)
    talker = TalkerConfig(
        hidden_size=hidden, intermediate_size=inter,
        rope_scaling={"mrope_section": [24, 20, 20], "interleaved": True, "rope_type": "default"},
        codec_language_id={
            "chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
            "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
            "beijing_dialect": 2074, "sichuan_dialect": 2062,
        },
        spk_id={"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
                "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878},
        spk_is_dialect={"eric": "sichuan_dialect", "dylan": "beijing_dialect"},
    )
    cfg = Qwen3TTSConfig(talker_config=talker, tts_model_type=model_type, tts_model_size=size)
    return cfg, SpeechTokenizerConfig()
