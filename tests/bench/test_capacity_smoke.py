"""bench/capacity.py against a real `voxgate serve --model synthetic` and a real Redis, tiny: one and four
sessions of one short reply, clients in two processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from capacity import add_overhead, pieces

REPO = Path(__file__).resolve().parents[2]


def test_the_knee_is_the_first_count_past_20_ms_at_p99() -> None:
    rows = [{"sessions": n, "ttfa_p50_ms": 100.0 + d, "ttfa_p99_ms": 110.0 + d} for n, d in
            ((1, 0.0), (64, 5.0), (128, 25.0), (256, 90.0))]  # fmt: skip
    assert add_overhead(rows) == 128
    assert [r["overhead_p99_ms"] for r in rows] == [0.0, 5.0, 25.0, 90.0]
    assert add_overhead(rows[:2]) is None
    assert "".join(pieces("Hi there, you. ")) == "Hi there, you. "


def test_smoke_run_reports_every_column(tmp_path: Path) -> None:
    out = tmp_path / "capacity"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "capacity.py"), "--smoke", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.with_name("capacity_smoke.json").read_text())
    rows = result["rows"]["this"]
    assert [r["sessions"] for r in rows] == [1, 4]
    for r in rows:
        assert r["ready"] == r["sessions"] and r["refusals"] == {}, r
        assert r["turns"] == r["sessions"] and r["audio_s"] > 1.0 * r["sessions"], r
        assert r["ttfa_p99_ms"] is not None and r["cpu_ms_per_audio_s"] > 0, r
        assert r["rss_per_idle_session_kb"] is not None and r["deficit_max_ms"] is not None, r
        # the gateway's own pauses, read from its /metrics: its loop woke its timer at least once a level
        assert r["loop_lag_p99_ms"] is not None and r["loop_lags_over_50ms"] >= 0 and r["gc_s"] >= 0, r
    assert out.with_name("capacity_smoke.md").read_text().startswith("## capacity: smoke")
