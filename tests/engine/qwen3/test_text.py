from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.qwen3 import ConfigError, Qwen3TTSModel
from engine.qwen3.text import TextTokenizer

SAMPLES = ["Hello there, how are you?", "你好，今天天气很好。", "  spaces\n\nand lines 123.45", "Ünïcödé é vs é"]


def test_template_pieces_are_single_tokens(tiny_model: Qwen3TTSModel) -> None:
    cfg, tok = tiny_model.cfg, tiny_model.tokenizer
    ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert ids[0] == cfg.im_start_token_id and ids[-3] == cfg.im_start_token_id
    assert ids[-5] == cfg.im_end_token_id
    assert tok.role_ids() == ids[:3]
    assert tok.content_ids("Hi") == ids[3:-5] == tok.encode("Hi")
    assert tok.decode(tok.content_ids(SAMPLES[1])) == SAMPLES[1]


def test_special_tokens_match_the_config(tiny_model: Qwen3TTSModel) -> None:
    cfg, tok = tiny_model.cfg, tiny_model.tokenizer
    assert tok.encode("<tts_pad><tts_text_bos><tts_text_eod>") == [
        cfg.tts_pad_token_id, cfg.tts_bos_token_id, cfg.tts_eos_token_id]


def test_ref_and_instruct_slices(tiny_model: Qwen3TTSModel) -> None:
    tok = tiny_model.tokenizer
    assert tok.ref_ids("Hello there.") == tok.encode("Hello there.")
    ins = tok.instruct_ids("Speak slowly.")
    assert ins[0] == tiny_model.cfg.im_start_token_id
    assert tok.decode(ins) == "<|im_start|>user\nSpeak slowly.<|im_end|>\n"


def test_vocab_merges_and_tokenizer_json_agree(tiny_dir: Path, tmp_path: Path, tiny_model: Qwen3TTSModel) -> None:
    d = tmp_path / "tok"
    d.mkdir()
    tiny_model.tokenizer.tok.save(str(d / "tokenizer.json"))
    from_json = TextTokenizer.from_dir(d)
    for s in SAMPLES:
        assert from_json.content_ids(s) == tiny_model.tokenizer.content_ids(s)


def test_added_token_id_mismatch_is_an_error(tiny_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "tok"
    d.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, d / name)
    conf = json.loads((d / "tokenizer_config.json").read_text())
    vocab = json.loads((d / "vocab.json").read_text())
    last = max(conf["added_tokens_decoder"], key=int)
    taken = next(t for t, i in vocab.items() if i == 300)  # a content the BPE vocabulary already owns
    conf["added_tokens_decoder"][str(int(last) + 1)] = dict(conf["added_tokens_decoder"][last], content=taken)
    (d / "tokenizer_config.json").write_text(json.dumps(conf))
    with pytest.raises(ConfigError, match="got id 300"):
        TextTokenizer.from_dir(d)


def test_missing_tokenizer_files_are_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"vocab\.json"):
        TextTokenizer.from_dir(tmp_path)


def test_gaps_in_added_token_ids_keep_every_id(tiny_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "tok"
    d.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(tiny_dir / name, d / name)
    conf = json.loads((d / "tokenizer_config.json").read_text())
    last = max(conf["added_tokens_decoder"], key=int)
    spec = dict(conf["added_tokens_decoder"][last], content="<|audio_pad|>")
    conf["added_tokens_decoder"][str(int(last) + 3)] = spec  # ids last+1, last+2 unused, as real files may do
    (d / "tokenizer_config.json").write_text(json.dumps(conf))
    tok = TextTokenizer.from_dir(d)
    assert tok.encode("<|audio_pad|>") == [int(last) + 3]
    assert tok.encode("<|im_start|>") == [int(min(conf["added_tokens_decoder"], key=int)) + 1]
