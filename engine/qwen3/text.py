"""The text side: the checkpoint's Qwen2 byte-level BPE tokenizer and the chat templates.

Official checkpoints ship `vocab.json` + `merges.txt` + `tokenizer_config.json` (special tokens under
`added_tokens_decoder`); some exports also carry `tokenizer.json`, which is used as is when present.
Content ids are cut out of the full template exactly as the reference does (`ids[3:-5]`), so BPE merges
at the template boundaries match it.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from engine.qwen3.config import ConfigError

# Qwen2's pre-tokenizer split (transformers' Qwen2TokenizerFast conversion).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


def instruct_text(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def qwen2_bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Tokenizer:
    """A byte-level BPE tokenizer configured like Qwen2TokenizerFast (NFC, Qwen2 split, no prefix space)."""
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def read_merges(path: Path) -> list[tuple[str, str]]:
    merges = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#version"):
            continue
        a, b = line.split(" ")
        merges.append((a, b))
    return merges


class TextTokenizer:
    """Text → ids with the checkpoint's vocabulary and special tokens."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        # The reference slices the template by token counts; that only works if its pieces are one token each.
        if len(self.encode(assistant_text(""))) != 8:
            raise ConfigError("tokenizer: the chat template must tokenize as <|im_start|> assistant \\n … (8 ids)")

    @classmethod
    def from_dir(cls, path: str | Path) -> TextTokenizer:
        root = Path(path)
        if (root / "tokenizer.json").exists():
            return cls(Tokenizer.from_file(str(root / "tokenizer.json")))
        vocab_path, merges_path = root / "vocab.json", root / "merges.txt"
        if not vocab_path.exists() or not merges_path.exists():
            raise ConfigError(f"{root}: no tokenizer.json and no vocab.json + merges.txt")
        tok = qwen2_bpe(json.loads(vocab_path.read_text(encoding="utf-8")), read_merges(merges_path))
        config_path = root / "tokenizer_config.json"
        added = json.loads(config_path.read_text(encoding="utf-8")).get("added_tokens_decoder", {}) \
            if config_path.exists() else {}
        for id_str, spec in sorted(added.items(), key=lambda kv: int(kv[0])):
            # Added tokens get the next free id; fill any gap in the file's numbering with unmatchable
            # placeholders so every listed token keeps exactly its id.
            while tok.get_vocab_size(with_added_tokens=True) < int(id_str):
                tok.add_special_tokens([f"<|voxgate_unused_{tok.get_vocab_size(with_added_tokens=True)}|>"])
            token = AddedToken(spec["content"], single_word=spec.get("single_word", False),
                               lstrip=spec.get("lstrip", False), rstrip=spec.get("rstrip", False),
                               normalized=spec.get("normalized", False), special=spec.get("special", True))
            if spec.get("special", True):
                tok.add_special_tokens([token])
            else:
                tok.add_tokens([token])
            got = tok.token_to_id(spec["content"])
            if got != int(id_str):
                raise ConfigError(f"{config_path}: added token {spec['content']!r} got id {got}, file says {id_str}")
        return cls(tok)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def content_ids(self, text: str) -> list[int]:
        """The ids of `text` as they sit inside the assistant template (the reference's `ids[3:-5]`)."""
        return self.encode(assistant_text(text))[3:-5]

    def ref_ids(self, text: str) -> list[int]:
        """Reference-transcript ids for voice-clone ICL (the reference's `ref_ids[3:-2]`)."""
        return self.encode(ref_text(text))[3:-2]

    def instruct_ids(self, instruct: str) -> list[int]:
        """The whole instruct turn; every id becomes a text-only prompt row."""
        return self.encode(instruct_text(instruct))

    def role_ids(self) -> list[int]:
        """`<|im_start|>assistant\\n`: the three text-only rows before the codec prefix."""
        return self.encode(assistant_text(""))[:3]
