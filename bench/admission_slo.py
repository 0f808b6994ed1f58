"""The first-audio SLO side by side with today's rule (SLO off: a stream waits up to max_queue_wait_s), in
one run, on the same box: the overload burst of tests/gateway/test_overload_slo.py (12 callers asking 3
replies each, 4 HTTP requests, a canary session of another tenant) against Piper admitting 4 streams.

    PYTHONPATH=$PWD python bench/admission_slo.py --json bench/results/admission_slo_s22.json

Reports, per side: admitted first audio p50/p95/max (from the ask), refusals %, a refusal's answer time,
the canary's worst gap and wait, /health's worst latency and the server's memory growth.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import tempfile
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "gateway"), str(REPO / "tests"), str(REPO / "bench")]

from attack import run  # noqa: E402
from support.servers import serve  # noqa: E402
from test_overload_slo import KEYS  # noqa: E402  (registers the slo_burst attack)

from engine import load_engine  # noqa: E402
from gateway.connection import Limits  # noqa: E402
from sessions import hash_api_key  # noqa: E402


def _q(values: list[float], f: float) -> float | None:
    return values[min(len(values) - 1, int(f * len(values)))] if values else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--slo", type=float, default=1.5)
    p.add_argument("--json", default=None)
    args = p.parse_args()
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


if __name__ == "__main__":
    raise SystemExit(main())
