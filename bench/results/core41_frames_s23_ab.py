"""Interleaved A/B of bench/engine_bench.py between two extracted trees (issue 41, session 23).

    git archive 635a8a3 | tar -x -C /tmp/base635; git archive HEAD | tar -x -C /tmp/head41
    python bench/results/core41_frames_s23_ab.py PAIRS OUT.json -- ENGINE_BENCH_ARGS...

Each pair runs both trees back to back, the order alternating pair by pair (A B, B A, ...), so the shared
box's drifting load falls on both alike; ratios are then taken pair by pair. BASE and HEAD (environment)
name the trees; each runs its own bench/engine_bench.py with its own tree first on the path.
"""

import json
import os
import subprocess
import sys
import time

PY = sys.executable
SIDES = {"base": os.environ.get("BASE", "/tmp/base635"), "head": os.environ.get("HEAD", "/tmp/head41")}


def main() -> None:
    pairs, out, args = int(sys.argv[1]), sys.argv[2], sys.argv[sys.argv.index("--") + 1:]
    runs = []
    for i in range(pairs):
        for side in (["base", "head"] if i % 2 == 0 else ["head", "base"]):
            root, result = SIDES[side], f"{out}.{side}.{i}.json"
            t0 = time.time()
            subprocess.run([PY, "bench/engine_bench.py", *args, "--json", result, "--png", f"{out}.{side}.png"],
                           cwd=root, env={**os.environ, "PYTHONPATH": root}, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with open(result) as f:
                d = json.load(f)
            rows = {r["n"]: {"frames_per_s": r["engine"]["frames_per_s"],
                             "frames_per_cpu_s": r["engine"]["frames_per_cpu_s"],
                             "ttfa_p50_s": r["engine"]["ttfa_p50_s"], "cycle_p50_ms": r["cancel"]["cycle_p50_ms"]}
                    for r in d["rows"]}
            runs.append({"pair": i, "side": side, "load_average": d["load_average"], "rows": rows,
                         "run_s": time.time() - t0})
            print(i, side, {n: round(v["frames_per_s"], 1) for n, v in rows.items()}, flush=True)
    with open(out, "w") as f:
        json.dump({"args": args, "pairs": pairs, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
