"""The codec decoder alone, for a client that decodes codec frames on the device (an edge box, a phone).

`load_stream_decoder(dir)` reads only the checkpoint's `speech_tokenizer/` folder; `decoder_id(dir)`
names those weights, so a client can tell whether its local decoder matches the server's
(`codec.start.decoder_id`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from engine.qwen3.codec import CodecDecoder
from engine.qwen3.config import SpeechTokenizerConfig, read_json
from engine.qwen3.model import StreamDecoder, _materialize
from engine.qwen3.weights import check_routed, load_module, read_tensors

_WHOLE_FILE = 64 << 20  # hash small weight files whole; large ones by header, size and their two ends


def _speech_tokenizer(path: str | Path) -> Path:
    root = Path(path)
    return root if (root / "config.json").is_file() and not (root / "speech_tokenizer").is_dir() else (
        root / "speech_tokenizer"
    )


def decoder_id(path: str | Path) -> str:
    """A stable name for the codec decoder of a checkpoint (or of its `speech_tokenizer/` folder)."""
    folder = _speech_tokenizer(path)
    h = hashlib.sha256((folder / "config.json").read_bytes())
    for weights in sorted(folder.glob("*.safetensors")):
        size = weights.stat().st_size
        h.update(str(size).encode())
        with weights.open("rb") as f:
            if size <= _WHOLE_FILE:
                h.update(f.read())
            else:
                h.update(f.read(1 << 20))
                f.seek(size - (1 << 20))
                h.update(f.read())
    return "qwen3-tts-12hz-" + h.hexdigest()[:16]


def load_stream_decoder(path: str | Path, device: str = "cpu") -> StreamDecoder:
    """A streaming decoder (exact carried state) built from the codec weights alone."""
    folder = _speech_tokenizer(path)
    cfg = SpeechTokenizerConfig.from_dict(read_json(folder / "config.json"))
    cfg.validate()
    with torch.device("meta"):
        codec = CodecDecoder(cfg.decoder_config)
    tensors = read_tensors(folder)
    check_routed(tensors, ("decoder.",), ("encoder.",), "speech_tokenizer/model.safetensors")
    load_module(codec, tensors, "decoder.", dtype=torch.float32, source=str(folder))
    _materialize(codec)
    codec.refresh()
    codec.to(device).eval().requires_grad_(False)
    return StreamDecoder(codec)
