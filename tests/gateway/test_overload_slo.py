"""The first-audio SLO at a real gateway (Piper, loopback, real clients), under an overload burst with a
canary session speaking beside it (bench/attack.py `run`): a reply that would be heard past
`first_audio_slo_s` is refused at once — `queue_full` with bound "slo" on the WebSocket, 429 with
Retry-After on HTTP — instead of waiting up to `max_queue_wait_s` in silence; the admitted ones are heard
within the SLO; the canary, /health and the server's memory are undisturbed (tests/support/undisturbed.py).

The gateway admits four streams at once (`max_active_streams=4`), so the burst overloads it whatever the
shared box's speed.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets
from attack import ATTACKS, Context, attack, run
from support.servers import serve
from support.undisturbed import assert_undisturbed

from engine import Engine
from gateway.connection import Limits
from sessions import hash_api_key

pytestmark = pytest.mark.slow

SLO_S = 1.5
REFUSED_WITHIN_S = 0.5  # a refusal at once: answered within this of the ask (≤ 0.2 s on a quiet box; 2 shared cores)
KEYS = {"flood": "key-flood", "canary": "key-canary"}
REPLY = "Thank you for calling. Your appointment is confirmed for Tuesday at three in the afternoon."


@pytest.fixture(scope="module")
def overloaded(piper_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path: Path = tmp_path_factory.mktemp("slo") / "keys.json"
    path.write_text(json.dumps({"tenants": {t: {"key_sha256": [hash_api_key(k)]} for t, k in KEYS.items()}}))
    limits = Limits(utterance_idle_timeout=20.0, utterance_idle_under_pressure=20.0)
    yield from serve(piper_engine, limits, api_keys=str(path), max_active_streams=4, first_audio_slo_s=SLO_S)


async def _reply(url: str, key: str, rounds: int, go: asyncio.Event | None = None) -> list[dict[str, Any]]:
    """One caller asking `rounds` replies one after another (from `go`), as a voice agent would: for each,
    when it was first answered after its input.done (its first audio, or its refusal) and how; refused,
    it asks again after the refusal's retry_after_s (at most 3 s)."""
    from canary import auth_headers, ws_url

    out: list[dict[str, Any]] = []
    async with websockets.connect(ws_url(url), max_size=None, additional_headers=auth_headers(key),
                                  open_timeout=30) as ws:  # fmt: skip
        await ws.send(json.dumps({"type": "session.config", "voice": "joe", "language": "en"}))
        await asyncio.wait_for(ws.recv(), 30)
        if go is not None:
            await asyncio.wait_for(go.wait(), 60)
        for _ in range(rounds):
            await ws.send(json.dumps({"type": "input.text", "text": REPLY}))
            await ws.send(json.dumps({"type": "input.done"}))
            asked, seen = time.monotonic(), {}
            while True:
                msg = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(msg, bytes):
                    seen.setdefault("heard_s", time.monotonic() - asked)
                    continue
                ev = json.loads(msg)
                if ev["type"] == "error" and "answered_s" not in seen:
                    seen.update(answered_s=time.monotonic() - asked, error=ev)
                if ev["type"] == "session.done":
                    break
            out.append(seen)
            if "error" in seen:
                await asyncio.sleep(min(float(seen["error"].get("retry_after_s", 1.0)), 3.0))
    return out


def _speech(url: str, key: str) -> dict[str, Any]:
    from canary import auth_headers, http_url

    body = json.dumps({"model": "piper", "input": REPLY, "voice": "joe", "response_format": "pcm"}).encode()
    request = urllib.request.Request(f"{http_url(url)}/v1/audio/speech", body, method="POST",
                                     headers={"Content-Type": "application/json", **auth_headers(key)})  # fmt: skip
    asked = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            r.read(1)
            return {"status": r.status, "heard_s": time.monotonic() - asked}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "answered_s": time.monotonic() - asked, "retry_after": e.headers.get("Retry-After"),
                "error": json.loads(e.read())["error"]}  # fmt: skip


@attack("slo_burst")
async def slo_burst(ctx: Context) -> dict[str, Any]:
    """`sockets` callers at once, each asking `rounds` replies, and `requests` HTTP speech requests."""
    sockets, rounds, requests = (int(ctx.options.get(k, d)) for k, d in (("sockets", 12), ("rounds", 3),
                                                                          ("requests", 4)))  # fmt: skip
    key, go = ctx.options["flood_key"], asyncio.Event()
    ws_runs = asyncio.gather(*(_reply(ctx.url, key, rounds, go) for _ in range(sockets)))
    await asyncio.sleep(1.0)  # the sockets are open and configured: the burst asks at once
    go.set()
    http_runs = asyncio.gather(*(asyncio.to_thread(_speech, ctx.url, key) for _ in range(requests)))
    replies, speech = await asyncio.gather(ws_runs, http_runs)
    return {"replies": [r for caller in replies for r in caller], "speech": list(speech)}


assert "slo_burst" in ATTACKS


async def test_an_overload_burst_is_refused_at_once_by_the_slo_and_the_admitted_are_heard_within_it(
    overloaded: str,
) -> None:
    r = await run(overloaded, "slo_burst", key=KEYS["canary"], flood_key=KEYS["flood"])
    replies, speech = r.seen["replies"], r.seen["speech"]
    refused = [x for x in replies if "error" in x]
    heard = sorted(x["heard_s"] for x in replies if "error" not in x)
    print(r.canary, [x.get("error", {}).get("bound") for x in replies])
    print({"replies": len(replies), "refused": len(refused), "heard_p50": statistics.median(heard or [0.0]),
           "heard_max": max(heard, default=None),
           "refused_worst": max((x["answered_s"] for x in refused), default=None),
           "speech": speech})  # fmt: skip
    assert refused and heard, r.seen  # an overload: some refused, some heard
    for x in refused:
        e = x["error"]
        assert e["code"] == "queue_full" and e["bound"] == "slo", e
        assert e["first_audio_slo_s"] == SLO_S and e["retry_after_s"] >= 1 and "first_audio_slo_s" in e["message"], e
        assert x["answered_s"] < SLO_S + 0.5, x  # never later than the SLO itself (a waiter's budget)
    # Some at once, as they ask (WebSocket or HTTP); the rest as soon as their wait says they will miss
    # (above: never later than the SLO). How soon is a measurement, not an assert: bench/admission_slo.py's
    # sweep reports the answer time (p95), bench/results/admission_sweep_s27.md. In this burst on a fresh
    # server no reply has ended when the first callers ask, so their wait is forecast from the streams
    # ended so far (the canary's short sentences): the WebSocket refusals came 0.3–1.4 s after the ask.
    answered = sorted([x["answered_s"] for x in refused] + [s["answered_s"] for s in speech if s["status"] == 429])
    assert answered[0] < REFUSED_WITHIN_S, answered
    # The admitted are heard within the SLO at its tail (the prediction's error, on a shared box: a margin).
    assert heard[int(0.95 * (len(heard) - 1))] < SLO_S + 1.0, heard
    # HTTP speech as the WebSocket replies: each refusal never later than the SLO itself.
    for s in speech:
        if s["status"] == 429:
            assert s["error"]["code"] == "queue_full" and int(s["retry_after"]) >= 1, s
            assert "first_audio_slo_s" in s["error"]["message"] and s["answered_s"] < SLO_S + 0.5, s
        else:
            assert s["status"] == 200 and s["heard_s"] < SLO_S + 1.0, s
    assert_undisturbed(r, rss_mb=150.0)


async def test_with_the_slo_off_a_reply_waits_its_turn_as_before(piper_engine: Engine) -> None:
    # SLO off (first_audio_slo_s = 0): nobody is refused by it; a reply waits its turn (main's rule).
    for addr in serve(piper_engine, max_active_streams=1, first_audio_slo_s=0):
        replies = await asyncio.gather(*(_reply(addr, "", 1) for _ in range(3)))
        flat = [x for caller in replies for x in caller]
        assert all("error" not in x for x in flat), flat
        assert max(x["heard_s"] for x in flat) > min(x["heard_s"] for x in flat)  # one waited for another
