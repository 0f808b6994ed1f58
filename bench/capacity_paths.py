"""The gateway's paths whole (bench/capacity_rig.py: a reply, a text piece, an audio chunk), this tree
against git refs' trees side by side: each round runs every tree's part in a fresh process in turn, so a
shared box's drift falls on all alike; medians of the rounds and the median of each round's ratio.

    python bench/capacity_paths.py [--baseline-ref main] [--parts reply,delta,chunk] [--rounds 5]
        [--others 64] [--out bench/results/capacity_paths_s25]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.capacity import source_tree  # noqa: E402


def run_part(tree: Path, part: str, others: int, n: int) -> dict[str, Any]:
    cmd = [sys.executable, str(tree / "bench" / "capacity_rig.py"), "--part", part, "--others", str(others)]
    if n:
        cmd += ["--n", str(n)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline-ref", default="main", help="comma-separated git refs")
    p.add_argument("--parts", default="reply,delta,chunk")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--others", type=int, default=64)
    p.add_argument("--n", type=int, default=0, help="operations per run (default: the part's)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "capacity_paths_s25"))
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="capacity-paths-"))
    trees: dict[str, Path] = {}
    for ref in filter(None, args.baseline_ref.split(",")):
        tree = source_tree(ref, work)
        shutil.copy(REPO / "bench" / "capacity_rig.py", tree / "bench" / "capacity_rig.py")  # the same rig
        trees[ref] = tree
    trees["this"] = REPO
    load = [os.getloadavg()[0]]
    rows: dict[str, Any] = {}
    try:
        for part in filter(None, args.parts.split(",")):
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(run_part(tree, part, args.others, args.n))
            base = next(iter(trees))
            row: dict[str, Any] = {}
            for name in trees:
                us = [r["us"] for r in runs[name]]
                row[name] = {"us": round(statistics.median(us), 3), "runs": us}
                if "split_us" in runs[name][0]:
                    row[name]["split_us"] = {k: round(statistics.median(r["split_us"][k] for r in runs[name]), 3)
                                             for k in runs[name][0]["split_us"]}  # fmt: skip
                    row[name]["split_ops"] = runs[name][0]["split_ops"]
                ratios = [b["us"] / a["us"] for a, b in zip(runs[base], runs[name], strict=True)]
                row[name]["over_" + base] = round(statistics.median(ratios), 3)
            rows[part] = row
            print(part, json.dumps({k: {x: v[x] for x in v if x != "runs"} for k, v in row.items()}), flush=True)
            load.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"load": load, "others": args.others, "rounds": args.rounds, "refs": list(trees), "parts": rows}
    Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
