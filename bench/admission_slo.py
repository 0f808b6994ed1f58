"""The first-audio SLO under load, side by side with another tree, in one run on the same box.

Burst (the default): the overload burst of tests/gateway/test_overload_slo.py (12 callers asking 3
replies each, 4 HTTP requests, a canary session of another tenant) against Piper admitting 4 streams,
SLO off (a stream waits up to max_queue_wait_s) and on:

    PYTHONPATH=$PWD python bench/admission_slo.py --json bench/results/admission_slo_s22.json

Reports, per side: admitted first audio p50/p95/max (from the ask), refusals %, a refusal's answer time,
the canary's worst gap and wait, /health's worst latency and the server's memory growth.

Sweep: the load harness (bench/load.py, open-loop Poisson replies) at rising rates against this tree's
gateway and another tree's (`--base`, e.g. a worktree of the commit before the redesign), each started
in turn on a free loopback port with the same flags:

    PYTHONPATH=$PWD python bench/admission_slo.py sweep --base /tmp/base635 --models piper,cpu \
        --rates "piper=2,4,8;cpu=0.25,0.5,1" --knees piper=4,cpu=0.5 --modes sentence,auto --duration 12 \
        --json bench/results/admission_sweep_s23.json

Reports per model, mode, rate and tree: admitted first audio p95 from the ask (the stream's first
commit, when it asks admission) and whether it is within the SLO, refusals and their answer time
p95/max, % of admitted replies gap-free, and, at and below the knee, refusals against the base's.
`--smoke` runs the smallest sweep (Piper, one rate, `auto`, 2 s) for CI. `--rounds N` runs every tree N
times, the order turned each round, and pools them (each round's refusals in brackets): on a shared box
the knee moves between one tree's runs and the other's (the same code refused 1 to 15 of 39 at Piper's
knee across runs: bench/results/admission_sweep_s28.md), so one round says little at the knee.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "gateway"), str(REPO / "tests"), str(REPO / "bench")]

from processes import stop  # noqa: E402  (bench/, put on the path above)


def _q(values: list[float], f: float) -> float | None:
    return values[min(len(values) - 1, int(f * len(values)))] if values else None


def burst(argv: Sequence[str]) -> int:
    from attack import run
    from support.servers import serve
    from test_overload_slo import KEYS  # registers the slo_burst attack

    from engine import load_engine
    from gateway.connection import Limits
    from sessions import hash_api_key

    p = argparse.ArgumentParser()
    p.add_argument("--slo", type=float, default=1.5)
    p.add_argument("--rounds", type=int, default=1,
                   help="run every tree this many times, the order turned each round (base, head; head, base; "
                        "...), and report the rounds pooled: the box drifts between one tree's runs and the other's")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    engine = load_engine("piper")
    keys = pathlib.Path(tempfile.mkdtemp()) / "keys.json"
    keys.write_text(json.dumps({"tenants": {t: {"key_sha256": [hash_api_key(k)]} for t, k in KEYS.items()}}))
    limits = Limits(utterance_idle_timeout=20.0, utterance_idle_under_pressure=20.0)
    out: dict[str, Any] = {}
    for side, slo in (("slo_off_main_rule", 0.0), (f"slo_on_{args.slo:g}s", args.slo)):
        for addr in serve(engine, limits, api_keys=str(keys), max_active_streams=4, first_audio_slo_s=slo):
            r = asyncio.run(run(addr, "slo_burst", key=KEYS["canary"], flood_key=KEYS["flood"]))
        asked = r.seen["replies"] + r.seen["speech"]
        heard = sorted(x["heard_s"] for x in asked if "heard_s" in x and x.get("status", 200) == 200)
        refused = sorted(x["answered_s"] for x in asked if "answered_s" in x)
        share = round(100 * len(refused) / len(asked), 1)
        out[side] = {"asked": len(asked), "admitted": len(heard), "refused_pct": share,
                     "first_audio_p50_s": _q(heard, 0.5), "first_audio_p95_s": _q(heard, 0.95),
                     "first_audio_max_s": heard[-1] if heard else None, "refusal_answer_p50_s": _q(refused, 0.5),
                     "refusal_answer_max_s": refused[-1] if refused else None, "canary": r.canary.__dict__,
                     "health_worst_s": r.health_worst_s, "rss_growth_mb": r.rss_growth_mb}  # fmt: skip
        print(side, out[side], flush=True)
    engine.close()
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


# -- the sweep ------------------------------------------------------------------------------------------


def _per_model(spec: str) -> dict[str, list[float]]:
    """"piper=2,4,8;cpu=0.5,1" → {"piper": [2, 4, 8], "cpu": [0.5, 1]}."""
    out = {}
    for part in filter(None, spec.replace(" ", "").split(";")):
        name, _, values = part.partition("=")
        out[name] = [float(v) for v in values.split(",")]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def gateway(tree: pathlib.Path, model: str, flags: Sequence[str], log: pathlib.Path) -> Iterator[str]:
    """`tree`'s gateway serving `model` in-process on a free loopback port; its URL. Stopped on exit
    (SIGTERM, then SIGKILL after 20 s)."""
    port = _free_port()
    cmd = [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())", "serve",
           "--model", model, "--in-process", "--host", "127.0.0.1", "--port", str(port), *flags]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc, grace_s=20)


def load_run(url: str, rates: Sequence[float], args: argparse.Namespace, out: pathlib.Path) -> dict[str, Any]:
    """bench/load.py (this tree's) against `url`: every mode at every rate; its JSON."""
    cmd = [sys.executable, str(REPO / "bench" / "load.py"), "--url", url, "--rates", ",".join(f"{r:g}" for r in rates),
           "--modes", args.modes, "--duration", str(args.duration), "--languages", "en", "--texts", "own",
           "--sessions", str(args.sessions), "--seed", str(args.seed), "--drain", str(args.drain),
           "--response-timeout", str(args.drain), "--wait-ready", "180", "--no-frames", "--json", str(out),
           "--plot", str(out.with_suffix(".png"))]  # fmt: skip
    bound = 240 + len(rates) * len(args.modes.split(",")) * (args.duration + args.drain + 10)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=bound, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench/load.py failed against {url}:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def cell(run: dict[str, Any], slo_s: float) -> dict[str, Any]:
    """One load run's sweep numbers: admitted first audio from the ask (a stream asks admission as its
    first segment commits), refusals and their answer time, % of admitted replies gap-free."""
    per = run["responses"]
    heard = sorted(m["commit_to_audio_s"] for m in per if m.get("ok") and m.get("commit_to_audio_s") is not None)
    # Whether its first utterance waited for admission (the server's timing): a first audio past the SLO
    # after no wait is the engine's own time to first audio on this box, not admission's prediction.
    waited = sorted(m["commit_to_audio_s"] for m in per if m.get("ok") and m.get("commit_to_audio_s") is not None
                    and ((m.get("timings") or [None])[0] or {}).get("queue_wait_ms", 0) > 0)  # fmt: skip
    refused = [m for m in per if m.get("errors") and all(e in ("queue_full", "http_429") for e in m["errors"])]
    answers = sorted(m["refused_after_s"] for m in refused if m.get("refused_after_s") is not None)
    p95 = _q(heard, 0.95)
    return {"mode": run["mode"], "rate": run["rate"], "asked": run["started"], "admitted": run["admitted"],
            "refused_rounds": run.get("refused_rounds"),
            "completed": run["completed"], "refused": len(refused), "failed": run["failed"],
            "first_audio_p50_s": _q(heard, 0.5), "first_audio_p95_s": p95, "admitted_after_a_wait": len(waited),
            "first_audio_max_after_a_wait_s": waited[-1] if waited else None,
            "within_slo": None if p95 is None else p95 <= slo_s,
            "refusal_answer_p95_s": _q(answers, 0.95), "refusal_answer_max_s": answers[-1] if answers else None,
            "gap_free_pct": None if run["gap_free_share"] is None else round(100 * run["gap_free_share"], 1),
            "server_gap_free_pct": None if run["server_gap_free_share"] is None
            else round(100 * run["server_gap_free_share"], 1)}  # fmt: skip


def pooled(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One load run of the same mode and rate from several rounds' (their responses together, counts
    summed, gap-free shares weighted by the replies admitted): the cell's numbers over every round,
    and each round's refusals (`refused_rounds`: how much the box moved between rounds)."""
    if len(runs) == 1:
        return runs[0]
    admitted = sum(r["admitted"] for r in runs)

    def share(key: str) -> float | None:
        known = [r for r in runs if r[key] is not None]
        weight = sum(r["admitted"] for r in known)
        return None if not known or not weight else sum(r[key] * r["admitted"] for r in known) / weight

    return {"mode": runs[0]["mode"], "rate": runs[0]["rate"], "started": sum(r["started"] for r in runs),
            "admitted": admitted, "completed": sum(r["completed"] for r in runs),
            "failed": sum(r["failed"] for r in runs), "responses": [m for r in runs for m in r["responses"]],
            "gap_free_share": share("gap_free_share"), "server_gap_free_share": share("server_gap_free_share"),
            "refused_rounds": [r["refused"] for r in runs]}  # fmt: skip


def compare_trees(cells: dict[str, list[dict[str, Any]]], knee: float | None) -> list[dict[str, Any]]:
    """Per mode and rate, the head's cell beside the base's: at and below the knee, refusals against the
    base's (the head may refuse no more there)."""
    base = {(c["mode"], c["rate"]): c for c in cells.get("base", [])}
    rows = []
    for c in cells["head"]:
        b = base.get((c["mode"], c["rate"]))
        row = {"mode": c["mode"], "rate": c["rate"], "head": c, "base": b}
        if b is not None and knee is not None and c["rate"] <= knee:
            row["refusals_vs_base"] = c["refused"] - b["refused"]
        rows.append(row)
    return rows


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def sweep_table(result: dict[str, Any]) -> str:
    lines = ["| model | mode | rate /s | tree | asked | refused | admitted first audio p50 / p95 s (≤ SLO?) "
             "| waited: n, first audio max s | refusal answer p95 / max s | admitted gap-free % "
             "| refusals vs base (≤ knee) |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for model, rows in result["models"].items():
        for row in rows:
            for tree in ("base", "head"):
                c = row[tree]
                if c is None:
                    continue
                ok = "" if c["within_slo"] is None or tree == "base" else (" ✓" if c["within_slo"] else " ✗")
                vs = row.get("refusals_vs_base") if tree == "head" else None
                rounds = c.get("refused_rounds")
                refused = f"{c['refused']}" + (f" ({', '.join(map(str, rounds))})" if rounds else "")
                lines.append(f"| {model} | {c['mode']} | {c['rate']:g} | {tree} | {c['asked']} | {refused} | "
                             f"{_s(c['first_audio_p50_s'])} / {_s(c['first_audio_p95_s'])}{ok} | "
                             f"{c.get('admitted_after_a_wait', '–')}, {_s(c.get('first_audio_max_after_a_wait_s'))} | "
                             f"{_s(c['refusal_answer_p95_s'])} / {_s(c['refusal_answer_max_s'])} | "
                             f"{c['gap_free_pct'] if c['gap_free_pct'] is not None else '–'} | "
                             f"{'' if vs is None else f'{vs:+d}'} |")  # fmt: skip
    return "\n".join(lines)


def sweep(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="admission_slo.py sweep")
    p.add_argument("--base", default=None, help="the other tree (a worktree); none: this tree alone")
    p.add_argument("--models", default="piper,cpu")
    p.add_argument("--rates", default="piper=2,4,8;cpu=0.25,0.5,1", help="per model, responses/s")
    p.add_argument("--knees", default="piper=4;cpu=0.5", help="per model, the capacity knee (responses/s)")
    p.add_argument("--modes", default="sentence,auto")
    p.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals per rate and mode")
    p.add_argument("--drain", type=float, default=30.0)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo", type=float, default=1.5, help="this tree's first_audio_slo_s (the base: its own rule)")
    p.add_argument("--smoke", action="store_true", help="Piper, one rate, auto, 2 s: the harness works")
    p.add_argument("--out", default=None, help="where the load runs' JSON and server logs go (default: a temp dir)")
    p.add_argument("--from-runs", action="store_true", help="read --out's saved load runs instead of running")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every tree this many times, the order turned each round (base, head; head, base; "
                        "...), and report the rounds pooled: the box drifts between one tree's runs and the other's")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.smoke:
        args.models, args.rates, args.modes = "piper", "piper=1", "auto"
        args.duration, args.drain, args.sessions = 2.0, 20.0, 2
    rates, knees = _per_model(args.rates), {m: v[0] for m, v in _per_model(args.knees.replace(",", ";")).items()}
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="admission_sweep_"))
    out.mkdir(parents=True, exist_ok=True)
    trees = {"head": REPO} | ({"base": pathlib.Path(args.base).resolve()} if args.base else {})
    result: dict[str, Any] = {"settings": vars(args), "trees": {k: str(v) for k, v in trees.items()}, "models": {}}
    for model in args.models.split(","):
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for i in range(args.rounds):  # base first, then head: the same box, in turn (turned each round)
            for name, tree in sorted(trees.items(), reverse=i % 2 == 1):
                flags = ["--first-audio-slo", str(args.slo)] if name == "head" else []
                suffix = f"_r{i}" if args.rounds > 1 else ""
                t, saved = time.monotonic(), out / f"load_{model}_{name}{suffix}.json"
                if args.from_runs:  # the tables again from a sweep's saved runs: no traffic
                    run = json.loads(saved.read_text())
                else:
                    with gateway(tree, model, flags, out / f"server_{model}_{name}{suffix}.log") as url:
                        run = load_run(url, rates[model], args, saved)
                runs[name] += run["runs"]
                print(f"{model} {name}{suffix}: {len(run['runs'])} runs in {time.monotonic() - t:.0f} s",
                      file=sys.stderr)  # fmt: skip
        cells = {name: [cell(pooled([r for r in got if (r["mode"], r["rate"]) == key]), args.slo)
                        for key in dict.fromkeys((r["mode"], r["rate"]) for r in got)]
                 for name, got in runs.items()}  # fmt: skip
        result["models"][model] = compare_trees(cells, knees.get(model))
    print(sweep_table(result))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["sweep"]:
        return sweep(argv[1:])
    return burst(argv)


if __name__ == "__main__":
    raise SystemExit(main())
