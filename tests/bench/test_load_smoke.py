"""bench/load.py against a real gateway (Piper voice) on loopback, for a few seconds per mode."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from audio_metrics import pausing_player
from load import llm_pieces, loopback_only, poisson_schedule, stall_causes
from support.servers import serve

from engine import Engine
from sessions import hash_api_key

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


# -- whose a gap was -----------------------------------------------------------------------------------


def _two_utterances(second_arrives: float, second_sent: float) -> list[tuple[str, float | None]]:
    # Utterance 0: one 0.5 s frame at t=0 (plays out at 0.5); utterance 1: one 0.5 s frame at `second_arrives`.
    arrivals = [0.0, second_arrives]
    player = pausing_player(arrivals, [500, 500], 1000)
    assert player.resumed_by == [1] * len(player.stalls)
    causes = stall_causes(player, arrivals, {0: 0, 1: 1}, [0.0, second_sent])
    return [(c.whose, None if c.lead_s is None else round(c.lead_s, 3)) for c in causes]


def test_a_gap_before_text_the_client_sent_late_is_the_clients() -> None:
    # The listener ran dry at 0.5; the client sent the next sentence at 0.8: no server could fill 0.5–0.8.
    assert _two_utterances(second_arrives=1.0, second_sent=0.8) == [("text", -0.3)]


def test_a_gap_before_text_the_server_had_in_time_is_the_servers() -> None:
    # The text went out at 0.2, 0.3 s before the listener ran dry: however short, the gap is the server's.
    assert _two_utterances(second_arrives=1.0, second_sent=0.2) == [("server", 0.3)]
    assert _two_utterances(second_arrives=0.4, second_sent=0.2) == []  # in time: no gap at all


def test_a_gap_inside_an_utterance_is_always_the_servers() -> None:
    arrivals = [0.0, 1.0, 1.2]  # utterance 0's second frame comes 0.5 s after the player ran dry
    player = pausing_player(arrivals, [500, 500, 500], 1000)
    causes = stall_causes(player, arrivals, {0: 0, 1: 2}, [0.0, 5.0])  # utterance 1's text even later
    assert [(c.whose, c.lead_s) for c in causes] == [("server", None)]


def test_an_utterance_with_no_audio_keeps_the_count_in_step() -> None:
    # Utterance 1 spoke nothing (no audio.start); utterance 2's audio came after its late text.
    arrivals = [0.0, 1.0]
    player = pausing_player(arrivals, [500, 500], 1000)
    causes = stall_causes(player, arrivals, {0: 0, 2: 1}, [0.0, 0.1, 0.7])
    assert [(c.whose, round(c.lead_s or 0, 3)) for c in causes] == [("text", -0.2)]


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
        # Audio made inside the 2 s arrival window: `none` speaks only after the whole text, so on a slow
        # box its first audio may fall after the window (the responses' own audio is checked below).
        assert r["asked_audio_s_per_s"] > 0 and r["produced_audio_s_per_s"] >= 0
        assert r["inflight_max"] >= 1
        resp = r["responses"][0]
        assert resp["frames"] and sum(n for _, n in resp["frames"]) > 0
        assert all(n % 2 == 0 for _, n in resp["frames"])  # whole s16le samples
        assert r["empty_frames"] == sum(1 for x in r["responses"] for _, n in x["frames"] if n == 0)
        assert resp["audio_s"] == pytest.approx(sum(n for _, n in resp["frames"]) / 2 / 24000, rel=1e-3)
    # `none` speaks only after input.done; sentence mode splits per sentence; auto starts mid-text.
    assert runs["none"]["ttfa_last_s"]["p50"] > 0
    assert all(x["utterances"] >= 2 for x in runs["sentence"]["responses"])
    for r in runs.values():  # the server's share leaves out only the client's gaps
        assert r["server_gap_free_share"] >= r["gap_free_share"]
        assert r["server_stall_s_total"] <= r["stall_s_total"] + 1e-9
        for x in r["responses"]:
            assert all(whose in ("text", "server") for _, _, whose, _ in x.get("stalls", []))
    # auto's first audio comes sooner after the text's end than none's (which waits for all of it); that it
    # comes before the end is a speed figure for the benchmark, not an assert for a loaded box.
    assert runs["auto"]["ttfa_last_s"]["p50"] < runs["none"]["ttfa_last_s"]["p50"]
    assert runs["auto"]["ttfa_first_s"]["p50"] < runs["none"]["ttfa_first_s"]["p50"]
    assert {k["mode"] for k in result["ratios_vs_auto"]} == {"none", "sentence"}
    assert set(result["knees"]) == {"none", "sentence", "auto"}
    if result.get("plot"):
        assert Path(result["plot"]).stat().st_size > 1000


# -- the tenants mode: two API keys with weights 2:1 -----------------------------------------------------


@pytest.fixture(scope="module")
def two_tenant_gateway(piper_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Piper gateway whose API-keys file gives tenant a weight 2 and tenant b weight 1."""
    config = {"tenants": {"a": {"key_sha256": [hash_api_key("key-a")], "weight": 2},
                          "b": {"key_sha256": [hash_api_key("key-b")], "weight": 1}}}  # fmt: skip
    path = tmp_path_factory.mktemp("keys") / "api_keys.json"
    path.write_text(json.dumps(config))
    for addr in serve(piper_engine, api_keys=str(path)):
        yield f"http://{addr}"


@pytest.mark.slow
def test_tenants_mode_against_piper(two_tenant_gateway: str, tmp_path: Path) -> None:
    out = tmp_path / "tenants.json"
    cmd = [
        sys.executable, str(REPO / "bench" / "load.py"), "--url", two_tenant_gateway, "--tenants", "a=key-a,b=key-b",
        "--weights", "a=2,b=1", "--tenant-sessions", "2", "--duration", "3", "--json", str(out), "--texts", "own",
        "--languages", "en", "--units-per-s", "40", "--drain", "20", "--response-timeout", "20", "--seed", "1",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| together | a | 2.0 |" in proc.stdout and "b alone:" in proc.stdout, proc.stdout
    result = json.loads(out.read_text())
    together, alone = result["runs"]
    assert (together["run"], alone["run"]) == ("together", "alone")
    assert set(together["tenants"]) == {"a", "b"} and set(alone["tenants"]) == {"b"}  # the lightest runs alone
    for run in result["runs"]:
        for name, t in run["tenants"].items():
            assert t["started"] >= 1 and t["completed"] >= 1, (name, t["errors"])
            assert t["served_audio_s"] > 0 and t["concurrency"] == (2 if run["run"] == "together" else 4)
            assert set(t["errors"]) <= {"queue_full"}, (name, t["errors"])  # refusals are the only failures
            assert all(g["underruns"] > 0 and g["stalls"] for g in t["gapped"])  # where each gap was, if any
    shares = [t["share"] for t in together["tenants"].values()]
    assert sum(shares) == pytest.approx(1.0)
    (pair,) = result["fairness"]["pairs"]
    assert pair["tenants"] == ["a", "b"] and pair["weight_ratio"] == 2.0
    served = together["tenants"]["a"]["served_audio_s"] / together["tenants"]["b"]["served_audio_s"]
    assert pair["served_ratio"] == pytest.approx(served)  # a measurement, reported; the ratio's target is bench's
    assert result["fairness"]["solo"]["tenant"] == "b" and "tenants" not in result["settings"]  # keys stay out
