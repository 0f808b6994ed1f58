"""Random-weight Qwen3-TTS checkpoints at the real sizes (no weights can be downloaded on a lent GPU
machine): the tiny checkpoint's layout, ids, tokenizer and wiring (engine/qwen3/tiny.py), with the
talker, code predictor and codec decoder at the official 0.6B or 1.7B CustomVoice sizes.

    python bench/random_checkpoint.py 0.6b /tmp/ckpt-0.6b      # or 1.7b

The speech is noise, the costs are real: for throughput and latency benchmarks only.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.qwen3.config import CodecDecoderConfig, CodePredictorConfig, TalkerConfig  # noqa: E402
from engine.qwen3.tiny import make_tiny_checkpoint, tiny_configs  # noqa: E402

# Talker width and MLP per size; everything else is the configs' defaults (the official 0.6B values).
SIZES = {"0.6b": (1024, 3072, "0b6"), "1.7b": (2048, 6144, "1b7")}


def make_random_checkpoint(path: str | Path, size: str = "0.6b", seed: int = 0) -> Path:
    hidden, intermediate, tag = SIZES[size]
    cfg, codec_cfg, gen = tiny_configs()
    tiny = cfg.talker_config
    real = TalkerConfig(hidden_size=hidden, intermediate_size=intermediate,
                        code_predictor_config=CodePredictorConfig())
    # Keep the tiny ids, speakers and languages; take the real sizes.
    real.codec_language_id, real.spk_id, real.spk_is_dialect = (tiny.codec_language_id, tiny.spk_id,
                                                                tiny.spk_is_dialect)
    real.rope_scaling = {"mrope_section": [16, 24, 24], "interleaved": True, "rope_type": "default"}
    cfg.talker_config, cfg.tts_model_size = real, tag
    codec_cfg.decoder_config = CodecDecoderConfig()
    return make_tiny_checkpoint(path, seed=seed, configs=(cfg, codec_cfg, gen))


if __name__ == "__main__":
    print(make_random_checkpoint(sys.argv[2], sys.argv[1]))
