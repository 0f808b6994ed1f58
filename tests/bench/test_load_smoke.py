"""bench/load.py against a real gateway (Piper voice) on loopback, for a few seconds per mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from load import llm_pieces, loopback_only, poisson_schedule

REPO = Path(__file__).resolve().parents[2]


def test_llm_pieces_keep_the_text_and_look_like_tokens() -> None:
    assert llm_pieces("Hello there, world. ") == ["Hello ", "there, ", "world. "]
    zh = llm_pieces("今天下午可能会下雨，出门记得带伞。")
    assert "".join(zh) == "今天下午可能会下雨，出门记得带伞。"
    assert all(1 <= len(p) <= 2 for p in zh)
    assert llm_pieces(" Hi") == [" ", "Hi"]


def test_poisson_schedule_is_bounded_and_about_right() -> None:
    import random

    times = poisson_schedule(5.0, 200.0, 10_000, random.Random(3))
    assert times == sorted(times) and times[-1] < 200.0
    assert 900 < len(times) < 1100  # 1000 expected; sd ≈ 32
    assert len(poisson_schedule(5.0, 200.0, 7, random.Random(3))) == 7


def test_only_loopback_targets() -> None:
    assert loopback_only("http://127.0.0.1:8000")[0] == "ws://127.0.0.1:8000/v1/audio/speech/stream"
    assert loopback_only("http://localhost:9")[1] == "http://localhost:9"
    with pytest.raises(SystemExit):
        loopback_only("http://192.0.2.1:8000")
    with pytest.raises(SystemExit):
        loopback_only("ftp://127.0.0.1")


@pytest.mark.slow
def test_load_smoke_against_piper(piper_gateway: str, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [
        sys.executable, str(REPO / "bench" / "load.py"), "--url", piper_gateway, "--rates", "1.5",
        "--duration", "2", "--json", str(out), "--units-per-s", "20", "--texts", "own", "--languages", "en",
        "--sessions", "2", "--drain", "20", "--response-timeout", "20", "--seed", "1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    runs = {r["mode"]: r for r in result["runs"]}
    assert set(runs) == {"none", "sentence", "auto"}
    for mode, r in runs.items():
        assert r["started"] >= 1 and r["completed"] == r["started"], (mode, r["errors"])
        assert r["errors"] == {} and r["orphan_frames"] == 0
        ttfa = r["ttfa_first_s"]
        assert 0 < ttfa["p50"] < 10 and ttfa["p50"] <= ttfa["p95"] <= ttfa["p99"]
        assert r["audible_first_s"]["p50"] >= ttfa["p50"]  # audible never precedes the first byte
        assert r["gap_free_share"] is not None and r["vllm_continuous_share"] is not None
        assert r["asked_audio_s_per_s"] > 0 and r["produced_audio_s_per_s"] > 0
        assert r["inflight_max"] >= 1
        resp = r["responses"][0]
        assert resp["frames"] and sum(n for _, n in resp["frames"]) > 0
        assert all(n % 2 == 0 for _, n in resp["frames"])  # whole s16le samples
        assert r["empty_frames"] == sum(1 for x in r["responses"] for _, n in x["frames"] if n == 0)
        assert resp["audio_s"] == pytest.approx(sum(n for _, n in resp["frames"]) / 2 / 24000, rel=1e-3)
    # `none` speaks only after input.done; sentence mode splits per sentence; auto starts mid-text.
    assert runs["none"]["ttfa_last_s"]["p50"] > 0
    assert all(x["utterances"] >= 2 for x in runs["sentence"]["responses"])
    assert runs["auto"]["ttfa_last_s"]["p50"] < 0
    assert runs["auto"]["ttfa_first_s"]["p50"] < runs["none"]["ttfa_first_s"]["p50"]
    assert {k["mode"] for k in result["ratios_vs_auto"]} == {"none", "sentence"}
    assert set(result["knees"]) == {"none", "sentence", "auto"}
    if result.get("plot"):
        assert Path(result["plot"]).stat().st_size > 1000
