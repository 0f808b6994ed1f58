"""Talker + code predictor throughput of the Qwen3-TTS model at batch sizes 1..N (greedy, fixed frames).

    python bench/qwen3_generate_bench.py                       # the tiny test model
    python bench/qwen3_generate_bench.py --model PATH --batches 1,8 --frames 50

Reports frames/s per batch and the real-time factor of the whole batch (12.5 frames = 1 s of audio per
stream), plus exact-streaming codec cost at chunk 4.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.qwen3 import GenerationRequest, SamplingParams, generate, load_model, make_tiny_checkpoint

TEXTS = ["Hello there, how are you doing today?", "The quick brown fox jumps over the lazy dog.",
         "Streaming speech should start quickly.", "你好，今天天气很好。"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--sampled", action="store_true", help="sample (seeded) instead of greedy")
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    path = make_tiny_checkpoint(tmp.name) if args.model == "tiny" else Path(args.model)
    model = load_model(path)
    voice = model.speakers[0] if model.speakers else None

    def requests(b: int) -> list[GenerationRequest]:
        # Non-streaming text: the tiny talker then runs to max_frames instead of ending after its text.
        return [GenerationRequest(model.build_prompt(TEXTS[i % len(TEXTS)], voice=voice, streaming_text=False),
                                  SamplingParams.from_defaults(model.gen, greedy=not args.sampled, seed=i), args.frames)
                for i in range(b)]

    generate.generate_batch(model, requests(2))  # warm-up
    for b in (int(x) for x in args.batches.split(",")):
        t0 = time.perf_counter()
        out = generate.generate_batch(model, requests(b))
        dt = time.perf_counter() - t0
        frames = sum(o.shape[0] for o in out)
        print(f"batch {b:>2}: {frames / dt:8.1f} frames/s total, {frames / dt / 12.5:6.2f}x real time "
              f"({dt / max(1, frames // b) * 1000:.1f} ms per batched step)")
    codes = out[0]
    dec = model.stream_decoder()
    dec.step(codes[:4])
    t0 = time.perf_counter()
    for s in range(4, codes.shape[0], 4):
        dec.step(codes[s:s + 4])
    dt = time.perf_counter() - t0
    print(f"codec exact streaming, chunk 4: {dt / ((codes.shape[0] - 4) / 12.5) * 1000:.1f} ms per audio-second")


if __name__ == "__main__":
    main()
