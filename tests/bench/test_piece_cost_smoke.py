"""The piece-cost benchmark runs the CPU voice on the text whole and cut, and reports each cut."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_piece_cost_smoke_cuts_the_text_and_times_each_cut(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="CPU voices need the cpu extra")
    out = tmp_path / "cost.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "piece_cost.py"), "--backends", "piper", "--limits", "200,24",
         "--repeat", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["limit"]) for r in rows] == [("piper", 200), ("piper", 24)]
    whole, cut = rows
    assert whole["pieces"] == 1 and cut["pieces"] > 3  # really cut, by the engine's cutter
    assert all(r["run_s"] > 0 and r["audio_s"] > 1 and r["rtf"] > 0 for r in rows)  # really spoken
    assert "| piper | 24 |" in proc.stdout
