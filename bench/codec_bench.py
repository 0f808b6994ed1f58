"""Codec streaming cost: exact stateful decoding vs. left-context re-decoding, side by side.

Exact: `CodecDecoder.step` carries conv histories, trans-conv tails and the 72-frame attention window, so
each frame is decoded once and the output equals a full decode. Re-decode (the reference's
`chunked_decode`, vLLM-Omni, faster-qwen3-tts): decode `[25 context frames + chunk]` from scratch and keep
the chunk's samples — (25 + n)/n times the work and an error against the full decode, since the
transformer alone sees 8 × 71 = 568 frames back.

    python bench/codec_bench.py                    # tiny codec (the test model)
    python bench/codec_bench.py --size real        # real-size codec (114 M params), random weights
    python bench/codec_bench.py --frames 100 --chunks 1,4,12,25 --context 25 --json bench/out/codec.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.qwen3 import load_model, make_tiny_checkpoint
from engine.qwen3.codec import CodecDecoder
from engine.qwen3.config import CodecDecoderConfig
from engine.qwen3.tiny import _calibrate_codec, _init_

SAMPLES_PER_FRAME, RATE = 1920, 24000


def build_codec(size: str) -> CodecDecoder:
    if size == "tiny":
        with tempfile.TemporaryDirectory() as d:
            return load_model(make_tiny_checkpoint(d, seed=0)).codec
    codec = CodecDecoder(CodecDecoderConfig())  # the published 12Hz decoder shape
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        _init_(codec, g)
        _calibrate_codec(codec, g)  # same taming as the tiny model: ~0.3 RMS output, off the ±1 clamp
    codec.refresh()
    return codec.eval()


def schedule(total: int, n: int) -> list[tuple[int, int]]:
    return [(s, min(n, total - s)) for s in range(0, total, n)]


@torch.no_grad()
def exact(codec: CodecDecoder, codes: torch.Tensor, n: int) -> tuple[np.ndarray, float]:
    state = codec.new_state(1)
    t0 = time.perf_counter()
    out = [codec.step(codes[:, :, s:s + k], state) for s, k in schedule(codes.shape[-1], n)]
    return torch.cat(out, -1)[0].numpy(), time.perf_counter() - t0


@torch.no_grad()
def redecode(codec: CodecDecoder, codes: torch.Tensor, n: int, context: int) -> tuple[np.ndarray, float, int]:
    out, work = [], 0
    t0 = time.perf_counter()
    for s, k in schedule(codes.shape[-1], n):
        ctx = min(context, s)
        wav = codec(codes[:, :, s - ctx:s + k])
        out.append(wav[:, ctx * SAMPLES_PER_FRAME:])
        work += ctx + k
    return torch.cat(out, -1)[0].numpy(), time.perf_counter() - t0, work


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["tiny", "real"], default="tiny")
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--chunks", default="1,4,12,25")
    ap.add_argument("--context", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--float64", action="store_true", help="run in float64 (exactness check, not speed)")
    ap.add_argument("--exact-only", action="store_true", help="skip the (slow) re-decode columns")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    codec = build_codec(args.size)
    if args.float64:
        codec = codec.double()
        codec.refresh()
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, codec.cfg.codebook_size, (1, 16, args.frames), generator=g)
    audio_s = args.frames * SAMPLES_PER_FRAME / RATE
    chunks = [int(c) for c in args.chunks.split(",")]
    for n in chunks:  # warm every shape once (CPU kernels pay a first-call cost per shape)
        exact(codec, codes[:, :, : 2 * n], n)
        if not args.exact_only:
            redecode(codec, codes[:, :, : 2 * n + args.context], n, args.context)
    with torch.no_grad():
        t0 = time.perf_counter()
        full = codec(codes)[0].numpy()
        full_s = time.perf_counter() - t0
    peak = float(np.max(np.abs(full)))
    rows = []
    kind = f"{args.size} float64" if args.float64 else args.size
    print(f"codec {kind}, {args.frames} frames = {audio_s:.1f} s of audio, {args.threads} thread(s); "
          f"full decode {1000 * full_s / audio_s:.1f} ms per audio-second")
    print(f"{'chunk':>5} | {'exact ms/s':>10} {'exact err':>9} | {'redecode ms/s':>13} {'frames/frame':>12} "
          f"{'redecode err':>12} | {'speedup':>7}")
    for n in chunks:
        ex, ex_s = exact(codec, codes, n)
        rd, rd_s, work = (ex, float("nan"), 0) if args.exact_only else redecode(codec, codes, n, args.context)
        row = {
            "chunk": n, "exact_ms_per_audio_s": 1000 * ex_s / audio_s,
            "exact_rel_err": float(np.max(np.abs(ex - full))) / peak,
            "redecode_ms_per_audio_s": 1000 * rd_s / audio_s, "redecode_frames_per_frame": work / args.frames,
            "redecode_rel_err": float(np.max(np.abs(rd - full))) / peak, "speedup": rd_s / ex_s,
        }
        rows.append(row)
        print(f"{n:>5} | {row['exact_ms_per_audio_s']:>10.1f} {row['exact_rel_err']:>9.1e} | "
              f"{row['redecode_ms_per_audio_s']:>13.1f} {row['redecode_frames_per_frame']:>12.2f} "
              f"{row['redecode_rel_err']:>12.1e} | {row['speedup']:>6.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"size": args.size, "frames": args.frames, "context": args.context,
                                         "threads": args.threads, "float64": args.float64,
                                         "full_ms_per_audio_s": 1000 * full_s / audio_s,
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
