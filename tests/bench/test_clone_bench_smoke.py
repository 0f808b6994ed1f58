"""bench/clone_bench.py end to end on the tiny Base checkpoint, at its smallest size (--smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import clone_bench


def test_clone_bench_smoke_times_voice_making_and_first_audio(tmp_path: Path) -> None:
    out = tmp_path / "clone.json"
    assert clone_bench.main(["--smoke", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["ref_s"] == 2.0 and row["ref_frames"] == 25
    for mode in ("xvector", "icl"):
        for what in ("first_use_s", "cached_s", "streamed_ttfa_s"):
            assert 0 < row[f"{mode}_{what}"] < 30
