"""Prompt layouts, checked row by row against the reference's construction (prompt.py's module doc)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.qwen3 import Qwen3TTSModel, VoiceClone, load_model, make_tiny_checkpoint

T, C = "text", "codec"


def _rows(model: Qwen3TTSModel, spec: list[tuple[int | None, int | None]]) -> torch.Tensor:
    """Expected rows: text_projection(text_embedding(t)) + codec_embedding(c), either part optional."""
    out = []
    with torch.no_grad():
        for t, c in spec:
            row = torch.zeros(model.talker.cfg.hidden_size)
            if t is not None:
                row = row + model.talker.text_rows(torch.tensor(t))
            if c is not None:
                row = row + model.talker.codec_rows(torch.tensor(c))
            out.append(row)
    return torch.stack(out)


def _ids(model: Qwen3TTSModel) -> dict[str, int]:
    cfg, tc = model.cfg, model.cfg.talker_config
    return {"pad": cfg.tts_pad_token_id, "bos": cfg.tts_bos_token_id, "eos": cfg.tts_eos_token_id,
            "cpad": tc.codec_pad_id, "cbos": tc.codec_bos_id, "think": tc.codec_think_id,
            "nothink": tc.codec_nothink_id, "tbos": tc.codec_think_bos_id, "teos": tc.codec_think_eos_id}


def _head(model: Qwen3TTSModel, codec: list[int]) -> list[tuple[int | None, int | None]]:
    """Role rows, then the codec prefix paired with tts_pad … tts_bos (the last codec id, bos, is held back)."""
    i = _ids(model)
    role = [(t, None) for t in model.tokenizer.role_ids()]
    texts = [i["pad"]] * (len(codec) - 2) + [i["bos"]]
    return role + list(zip(texts, codec[:-1], strict=True))


def test_custom_voice_streaming_text_layout(tiny_model: Qwen3TTSModel) -> None:
    i, tc = _ids(tiny_model), tiny_model.cfg.talker_config
    text = tiny_model.tokenizer.content_ids("Hello there.")
    assert len(text) >= 3
    p = tiny_model.build_prompt("Hello there.", voice="ryan", language="english")
    codec = [i["think"], i["tbos"], 2050, i["teos"], tc.speaker_id("ryan"), i["cpad"], i["cbos"]]
    expected = [*_head(tiny_model, codec), (text[0], i["cbos"])]
    assert p.rows.shape[0] == 10  # 3 role + 6 codec-prefix + 1 first-text rows
    assert torch.allclose(p.rows, _rows(tiny_model, expected), atol=1e-5)
    assert torch.allclose(p.trailing, _rows(tiny_model, [(t, None) for t in [*text[1:], i["eos"]]]), atol=1e-5)
    assert torch.allclose(p.pad, _rows(tiny_model, [(i["pad"], None)])[0], atol=1e-6)


def test_custom_voice_non_streaming_text_layout(tiny_model: Qwen3TTSModel) -> None:
    i, tc = _ids(tiny_model), tiny_model.cfg.talker_config
    text = tiny_model.tokenizer.content_ids("Hello there.")
    p = tiny_model.build_prompt("Hello there.", voice="vivian", language="auto", streaming_text=False)
    codec = [i["nothink"], i["tbos"], i["teos"], tc.speaker_id("vivian"), i["cpad"], i["cbos"]]
    expected = (_head(tiny_model, codec) + [(t, i["cpad"]) for t in [*text, i["eos"]]]
                + [(i["pad"], i["cbos"])])
    assert torch.allclose(p.rows, _rows(tiny_model, expected), atol=1e-5)
    assert p.trailing.shape[0] == 0


@pytest.mark.parametrize(("language", "lang_id"), [("chinese", 2074), ("auto", 2074), ("english", 2050)])
def test_dialect_speaker_swaps_in_the_dialect_for_chinese_and_auto(tiny_model: Qwen3TTSModel, language: str,
                                                                   lang_id: int) -> None:
    i, tc = _ids(tiny_model), tiny_model.cfg.talker_config
    p = tiny_model.build_prompt("你好。", voice="dylan", language=language)  # dylan speaks beijing_dialect
    codec = [i["think"], i["tbos"], lang_id, i["teos"], tc.speaker_id("dylan"), i["cpad"], i["cbos"]]
    first = tiny_model.tokenizer.content_ids("你好。")[0]
    expected = [*_head(tiny_model, codec), (first, i["cbos"])]
    assert torch.allclose(p.rows, _rows(tiny_model, expected), atol=1e-5)


def test_live_text_leaves_eos_off_and_appends_rows(tiny_model: Qwen3TTSModel) -> None:
    whole = tiny_model.build_prompt("Hello there.", voice="ryan", language="english")
    live = tiny_model.build_prompt("Hello there.", voice="ryan", language="english", final=False)
    assert torch.equal(live.rows, whole.rows)
    tail = torch.cat([live.trailing, tiny_model.prompts.eos_row()])
    assert torch.allclose(tail, whole.trailing, atol=1e-6)


def test_0b6_custom_voice_drops_instructions_like_the_reference(tiny_model: Qwen3TTSModel) -> None:
    a = tiny_model.build_prompt("Hi.", voice="ryan", language="english", instructions="Whisper.")
    b = tiny_model.build_prompt("Hi.", voice="ryan", language="english")
    assert torch.equal(a.rows, b.rows)


def _variant(tiny_dir: Path, tmp_path: Path, **fields: str) -> Qwen3TTSModel:
    d = tmp_path / "variant"
    shutil.copytree(tiny_dir, d)
    cfg = json.loads((d / "config.json").read_text()) | fields
    (d / "config.json").write_text(json.dumps(cfg))
    return load_model(d)


def test_voice_design_puts_the_instruction_turn_first(tiny_dir: Path, tmp_path: Path) -> None:
    model = _variant(tiny_dir, tmp_path, tts_model_type="voice_design", tts_model_size="1b7")
    i = _ids(model)
    p = model.build_prompt("Hi.", voice=None, language="english", instructions="A calm low voice.")
    instruct = model.tokenizer.instruct_ids("A calm low voice.")
    codec = [i["think"], i["tbos"], 2050, i["teos"], i["cpad"], i["cbos"]]  # no speaker row
    expected = ([(t, None) for t in instruct] + _head(model, codec)
                + [(model.tokenizer.content_ids("Hi.")[0], i["cbos"])])
    assert torch.allclose(p.rows, _rows(model, expected), atol=1e-5)
    with pytest.raises(ValueError, match="no named voices"):
        model.build_prompt("Hi.", voice="ryan")


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Qwen3TTSModel:
    return load_model(make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-base"), seed=0, model_type="base"))


def test_base_x_vector_and_icl_layouts(base_model: Qwen3TTSModel) -> None:
    model = base_model
    i, h = _ids(model), model.talker.cfg.hidden_size
    xvec = torch.randn(h, generator=torch.Generator().manual_seed(1))
    p = model.build_prompt("Hello there.", voice=VoiceClone(xvec), language="english")
    text = model.tokenizer.content_ids("Hello there.")
    head = _head(model, [i["think"], i["tbos"], 2050, i["teos"], 0, i["cpad"], i["cbos"]])
    expected = _rows(model, [*head, (text[0], i["cbos"])])
    expected[7] += xvec - model.talker.codec_rows(torch.tensor(0)).detach()  # the speaker row is the x-vector
    assert torch.allclose(p.rows, expected, atol=1e-5)

    ref_codes = torch.randint(0, 2048, (3, 16), generator=torch.Generator().manual_seed(2))
    clone = VoiceClone(xvec, ref_text="Good morning.", ref_codes=ref_codes)
    ref = model.tokenizer.ref_ids("Good morning.")
    icl = model.build_prompt("Hello there.", voice=clone, language="english")
    with torch.no_grad():
        frames = torch.stack([model.talker.codec_rows(ref_codes[:, 0])]
                             + [e(ref_codes[:, k + 1]) for k, e in enumerate(model.predictor.model.codec_embedding)],
                             dim=1).sum(1)
    text_rows = _rows(model, [(t, None) for t in [*ref, *text, i["eos"]]])
    codec_rows = torch.cat([_rows(model, [(None, i["cbos"])]), frames])  # codec_bos, then Σ16 per ref frame
    n = codec_rows.shape[0]
    assert text_rows.shape[0] > n  # text longer than the reference audio: the rest becomes the queue
    assert torch.allclose(icl.rows[:9], expected[:9], atol=1e-5)  # role + prefix (with x-vector) as before
    assert torch.allclose(icl.rows[9:], text_rows[:n] + codec_rows, atol=1e-5)
    assert torch.allclose(icl.trailing, text_rows[n:], atol=1e-5)
    assert icl.ref_codes is not None and torch.equal(icl.ref_codes, ref_codes)
    with pytest.raises(ValueError, match="VoiceClone"):
        model.build_prompt("Hi.", voice="ryan")


def test_base_clones_a_voice_from_reference_audio(base_model: Qwen3TTSModel, tiny_model: Qwen3TTSModel) -> None:
    t = np.arange(24000 * 2) / 24000
    wav = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    voice = base_model.clone_voice(wav)
    assert voice.speaker_embedding.shape == (base_model.talker.cfg.hidden_size,)
    assert torch.equal(voice.speaker_embedding, base_model.clone_voice(wav).speaker_embedding)
    other = base_model.clone_voice(np.roll(wav, 3000) * 0.5 + 0.1 * np.sin(2 * np.pi * 990 * t).astype(np.float32))
    assert not torch.allclose(voice.speaker_embedding, other.speaker_embedding)
    resampled = base_model.clone_voice(wav[::3].copy(), sample_rate=8000)
    assert resampled.speaker_embedding.shape == voice.speaker_embedding.shape
    codes = base_model.generate("Hello there.", voice=voice, language="english", greedy=True, max_frames=30)
    assert codes.shape == (3, 16)  # the tiny talker ends after its 3 text tokens
    with pytest.raises(ValueError, match="no speaker encoder"):
        tiny_model.clone_voice(wav)
