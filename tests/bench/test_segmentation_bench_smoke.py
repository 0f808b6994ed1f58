"""The segmentation benchmark runs in its smoke mode and meets its quality targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_segmentation_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "seg.json"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "segmentation_bench.py"), "--smoke", "--json", str(out)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    result = json.loads(out.read_text())
    targets = result["targets"]
    # Quality is deterministic; speed is reported, not asserted (shared, noisy machines).
    assert targets["zero_false_splits"] and targets["zero_missed_sentence_ends"]
    assert targets["lag_at_most_one_char"]
    peers = result["segmenters"]
    assert peers["vllm-omni/sentence"]["quality"]["all"]["false_splits"] > 0  # the peers are really run
