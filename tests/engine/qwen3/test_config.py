from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.qwen3 import ConfigError, Qwen3TTSConfig, SpeechTokenizerConfig, load_configs, real_config
from engine.qwen3.code_predictor import CodePredictor
from engine.qwen3.codec import CodecDecoder
from engine.qwen3.talker import Talker


def test_root_config_round_trips_through_json_with_unknown_fields(tiny_dir: Path) -> None:
    raw = json.loads((tiny_dir / "config.json").read_text())
    raw["some_future_field"] = {"x": 1}
    raw["talker_config"]["another_one"] = [1, 2]
    cfg = Qwen3TTSConfig.from_dict(raw)
    assert json.loads(json.dumps(cfg.to_dict())) == raw
    assert cfg.talker_config.code_predictor_config.hidden_size == raw["talker_config"]["code_predictor_config"][
        "hidden_size"]


def test_speech_tokenizer_config_round_trips(tiny_dir: Path) -> None:
    raw = json.loads((tiny_dir / "speech_tokenizer" / "config.json").read_text())
    cfg = SpeechTokenizerConfig.from_dict(raw)
    assert cfg.to_dict() == raw
    assert cfg.decoder_config.total_upsample == 1920


def test_speaker_ids_accept_list_form() -> None:
    cfg, _ = real_config("1b7")
    cfg.talker_config.spk_id["serena"] = [3066]  # some exports write ids as one-element lists
    cfg.validate()
    assert cfg.talker_config.speaker_id("Serena") == 3066


def _bad(mutate: object) -> str:
    cfg, _ = real_config("0b6")
    mutate(cfg)  # type: ignore[operator]
    with pytest.raises(ConfigError) as e:
        cfg.validate()
    return str(e.value)


def test_validation_names_the_broken_field() -> None:
    assert "num_key_value_heads" in _bad(lambda c: setattr(c.talker_config, "num_key_value_heads", 3))
    assert "codec_eos_token_id" in _bad(lambda c: setattr(c.talker_config, "codec_eos_token_id", 5000))
    assert "spk_id[ryan]" in _bad(lambda c: c.talker_config.spk_id.__setitem__("ryan", 4000))
    assert "num_code_groups" in _bad(lambda c: setattr(c.talker_config, "num_code_groups", 32))
    assert "tts_pad_token_id" in _bad(lambda c: setattr(c, "tts_pad_token_id", 200000))
    assert "dialect" in _bad(lambda c: c.talker_config.spk_is_dialect.__setitem__("ryan", "klingon_dialect"))
    assert "tts_model_type" in _bad(lambda c: setattr(c, "tts_model_type", "music"))


def test_codec_validation_requires_1920_samples_per_frame() -> None:
    _, st = real_config("0b6")
    st.validate()
    st.decoder_config.upsample_rates = [8, 5, 4, 4]
    with pytest.raises(ConfigError, match="1920"):
        st.validate()


def test_load_configs_reports_missing_and_broken_files(tmp_path: Path, tiny_dir: Path) -> None:
    with pytest.raises(ConfigError, match="missing"):
        load_configs(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_configs(tmp_path)


def _millions(module: torch.nn.Module, skip: tuple[str, ...] = ()) -> float:
    return sum(p.numel() for n, p in module.named_parameters() if not n.startswith(skip)) / 1e6


@pytest.mark.parametrize(("size", "talker_layers"), [("0b6", 440.5), ("1b7", 1409.4)])
def test_real_sizes_match_published_parameter_counts(size: str, talker_layers: float) -> None:
    cfg, st = real_config(size)
    cfg.validate()
    st.validate()
    tc = cfg.talker_config
    with torch.device("meta"):
        talker = Talker(tc)
        predictor = CodePredictor(tc.code_predictor_config, tc.hidden_size)
        codec = CodecDecoder(st.decoder_config)
    assert _millions(talker.model.layers) == pytest.approx(talker_layers, abs=0.1)
    assert _millions(talker.model.text_embedding) == pytest.approx(311.2, abs=0.1)
    assert _millions(predictor.model.layers) == pytest.approx(78.7, abs=0.1)
    assert _millions(codec) == pytest.approx(114.3, abs=0.1)
    assert _millions(codec.quantizer) == pytest.approx(9.0, abs=0.1)
    has_proj = not isinstance(predictor.small_to_mtp_projection, torch.nn.Identity)
    assert has_proj == (size == "1b7")  # 1.7B talker is wider than its 1024-wide predictor
