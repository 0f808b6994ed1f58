"""bench/engine_bench.py end to end on the tiny model, at its smallest size (--smoke)."""

from __future__ import annotations

import json
from pathlib import Path

import engine_bench


def test_engine_bench_smoke_measures_engine_baseline_and_cancels(tmp_path: Path) -> None:
    out = tmp_path / "engine.json"
    assert engine_bench.main(["--smoke", "--json", str(out), "--png", str(tmp_path / "engine.png")]) == 0
    report = json.loads(out.read_text())
    assert [r["n"] for r in report["rows"]] == [1, 2]
    for row in report["rows"]:
        for who in ("engine", "baseline"):
            run = row[who]
            assert run["streams"] == run["ended_done"] == row["n"]
            # Whole frames of audio, at most the frame cap (EOS may end a stream earlier).
            assert run["frames"] == int(run["frames"]) and 0 < run["frames"] <= 8 * row["n"]
            assert run["ttfa_p95_s"] >= run["ttfa_p50_s"] > 0
        assert row["cancel"]["core_p50_ms"] is not None
    assert sum(report["bytes_per_slot"].values()) > 0
    assert (tmp_path / "engine.png").stat().st_size > 0
