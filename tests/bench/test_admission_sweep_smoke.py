"""bench/admission_slo.py's sweep: its numbers from load runs, and the smallest sweep end to end (two real
gateways of this tree started in turn, bench/load.py against each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from admission_slo import _per_model, cell, compare_trees, sweep_table

REPO = Path(__file__).resolve().parents[2]


def _response(ok: bool, *, heard_s: float | None = None, refused_s: float | None = None) -> dict[str, Any]:
    if refused_s is not None:
        return {"ok": False, "errors": ["queue_full"], "refused_after_s": refused_s}
    return {"ok": ok, "errors": [] if ok else ["engine_error"], "commit_to_audio_s": heard_s}


def _run(mode: str, rate: float, responses: list[dict[str, Any]], gap_free: float | None = 1.0) -> dict[str, Any]:
    refused = sum(1 for r in responses if r["errors"] == ["queue_full"])
    return {"mode": mode, "rate": rate, "started": len(responses), "admitted": len(responses) - refused,
            "completed": sum(r["ok"] for r in responses), "failed": 0, "gap_free_share": gap_free,
            "server_gap_free_share": gap_free, "responses": responses}  # fmt: skip


def test_a_cell_judges_the_admitted_first_audio_against_the_slo_and_times_the_refusals() -> None:
    run = _run("auto", 2.0, [_response(True, heard_s=0.4), _response(True, heard_s=1.2),
                             _response(False, refused_s=0.05), _response(False, refused_s=0.15),
                             _response(False)], gap_free=0.5)  # fmt: skip
    c = cell(run, slo_s=1.5)
    assert (c["asked"], c["refused"], c["first_audio_p95_s"], c["within_slo"]) == (5, 2, 1.2, True)
    assert (c["refusal_answer_p95_s"], c["refusal_answer_max_s"], c["gap_free_pct"]) == (0.15, 0.15, 50.0)
    assert cell(run, slo_s=1.0)["within_slo"] is False
    assert cell(_run("auto", 2.0, [_response(False, refused_s=0.1)], gap_free=None), 1.5)["within_slo"] is None


def test_refusals_are_compared_with_the_base_at_and_below_the_knee_only() -> None:
    head = [cell(_run("auto", r, [_response(False, refused_s=0.1)] * n), 1.5) for r, n in ((1.0, 1), (4.0, 3))]
    base = [cell(_run("auto", r, [_response(True, heard_s=0.5)]), 1.5) for r in (1.0, 4.0)]
    rows = compare_trees({"head": head, "base": base}, knee=2.0)
    assert [row.get("refusals_vs_base") for row in rows] == [1, None]
    table = sweep_table({"models": {"piper": rows}})
    assert "| piper | auto | 1 | head | 1 | 1 |" in table and table.count("| base |") == 2
    assert _per_model("piper=2,4;cpu=0.5") == {"piper": [2.0, 4.0], "cpu": [0.5]}


@pytest.mark.slow
def test_the_smallest_sweep_runs_against_two_gateways(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, str(REPO / "bench" / "admission_slo.py"), "sweep", "--smoke", "--base", str(REPO),
           "--out", str(tmp_path / "runs"), "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| piper | auto | 1 | head |" in proc.stdout and "| piper | auto | 1 | base |" in proc.stdout, proc.stdout
    (row,) = json.loads(out.read_text())["models"]["piper"]
    for tree in ("head", "base"):
        c = row[tree]
        assert c["asked"] >= 1 and c["failed"] == 0 and c["asked"] == c["completed"] + c["refused"], c
    assert "refusals_vs_base" in row  # the smoke's one rate is the knee's
