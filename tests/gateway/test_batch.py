"""POST /v1/audio/speech/batch against a real gateway (Piper): vLLM-Omni's shape, per-item errors, bounds."""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import soundfile
from attack import run
from support.servers import serve
from support.undisturbed import HEALTH_S
from support.wsclient import call

from engine import Engine, Stream, StreamEnd, StreamEvent
from engine.types import Capacity
from gateway.batch import MAX_BATCH_BODY_BYTES, MAX_BATCH_CHARS, MAX_BATCH_ITEMS
from sessions import hash_api_key

PATH = "/v1/audio/speech/batch"


def batch(addr: str, body: dict[str, Any]) -> tuple[int, Any]:
    return call(addr, "POST", PATH, None, body)


def pcm_seconds(result: dict[str, Any], rate: int = 24000) -> float:
    return len(base64.b64decode(result["audio_data"])) / 2 / rate


def test_three_items_come_back_in_order_with_the_defaults_and_overrides(gateway: str) -> None:
    texts = ["Hi.", "This one is a little longer than the first.",
             "And this third sentence is the longest of them all, by quite a few words, as you can hear."]  # fmt: skip
    body = {"voice": "joe", "response_format": "pcm", "items": [{"input": t} for t in texts]}
    body["items"][1]["response_format"] = "wav"
    status, out = batch(gateway, body)
    assert status == 200, out
    assert out["id"].startswith("speech-batch-") and (out["total"], out["succeeded"], out["failed"]) == (3, 3, 0)
    assert [r["index"] for r in out["results"]] == [0, 1, 2]
    assert all(r["status"] == "success" and "error" not in r for r in out["results"])
    first, second, third = out["results"]
    assert first["media_type"] == third["media_type"] == "audio/pcm"
    assert second["media_type"] == "audio/wav"  # the item's override
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(second["audio_data"])))
    wav_s = len(samples) / rate
    assert 0 < pcm_seconds(first) < wav_s < pcm_seconds(third)  # each item's own text, in order
    assert first["usage"]["input_tokens"] == len(texts[0])
    for r in out["results"]:  # the single route's timing record, per item
        t = r["timing"]
        assert set(t) == {"queue_wait_ms", "ttfa_ms", "audible_ttfa_ms", "synthesis_ms", "audio_ms", "rtf",
                          "trimmed_ms"}  # fmt: skip
        assert 0 <= t["ttfa_ms"] <= t["synthesis_ms"] and t["audio_ms"] > 0 and t["trimmed_ms"] >= 0
    assert first["timing"]["audio_ms"] == pytest.approx(1000 * pcm_seconds(first), abs=1)


def test_an_item_with_a_bad_voice_fails_alone(gateway: str) -> None:
    items = [{"input": "Fine."}, {"input": "Not fine.", "voice": "no-such-voice"}, {"input": "Also fine."}]
    status, out = batch(gateway, {"response_format": "mp3", "items": items})
    assert status == 200, out
    assert (out["succeeded"], out["failed"]) == (2, 1)
    ok0, bad, ok2 = out["results"]
    assert ok0["status"] == ok2["status"] == "success" and ok0["media_type"] == "audio/mpeg"
    assert bad["status"] == "error" and bad["index"] == 1 and "audio_data" not in bad
    assert "voice" in bad["code"] and bad["param"] == "voice" and isinstance(bad["error"], str)


def test_an_invalid_item_fails_alone_with_the_speech_routes_code(gateway: str) -> None:
    items = [{"input": "w " * 2049}, {"input": "   "}, {"input": "Ok.", "speed": 9}, {"input": "Good."}]
    status, out = batch(gateway, {"items": items, "response_format": "pcm"})
    assert status == 200, out
    codes = [(r["status"], r.get("code"), r.get("param")) for r in out["results"]]
    assert codes == [("error", "string_above_max_length", "input"), ("error", "invalid_value", "input"),
                     ("error", "invalid_value", "speed"), ("success", None, None)]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"items": []}, "items"),
        ({"items": [{"input": "x"}] * (MAX_BATCH_ITEMS + 1)}, "items"),
        ({"items": "hello"}, "items"),
        ({"items": ["hello"]}, "items"),
        ({"input": "Hi.", "items": [{"input": "x"}]}, "input"),
        ({"speed": 10, "items": [{"input": "x"}]}, "speed"),
        ({"stream_format": "sse", "items": [{"input": "x"}]}, "stream_format"),
        ({"items": [{"input": "x", "stream": True}]}, "stream"),
        ({"items": [{"input": "w " * 2000}] * (MAX_BATCH_CHARS // 4000 + 1)}, "items"),
    ],
)
def test_a_malformed_batch_is_a_400_naming_the_field(gateway: str, body: dict[str, Any], param: str) -> None:
    status, out = batch(gateway, body)
    assert status == 400 and out["error"]["param"] == param, out
    assert set(out["error"]) == {"message", "type", "param", "code"}


def test_invalid_json_is_a_400(gateway: str) -> None:
    conn = http.client.HTTPConnection(gateway, timeout=30)
    conn.request("POST", PATH, b"{not json", {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 400 and json.loads(r.read())["error"]["code"] == "invalid_json"


def test_a_body_past_the_limit_is_a_413(gateway: str) -> None:
    # Announced: refused before a byte of it is read.
    conn = http.client.HTTPConnection(gateway, timeout=30)
    conn.putrequest("POST", PATH)
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(MAX_BATCH_BODY_BYTES + 1))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large"
    # Sent: a valid-looking body just past the bound (long instructions) is cut off at the limit.
    body = json.dumps({"instructions": "i" * MAX_BATCH_BODY_BYTES, "items": [{"input": "x"}]}).encode()
    conn = http.client.HTTPConnection(gateway, timeout=30)
    with contextlib.suppress(OSError):  # the server may answer and close while we are still sending
        conn.request("POST", PATH, body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 413


# -- items run concurrently: seen from the engine ---------------------------------------------------------


class _CountingStream:
    def __init__(self, inner: Stream, engine: _CountingEngine) -> None:
        self.inner, self.engine = inner, engine

    def append(self, text: str) -> None:
        self.inner.append(text)

    def finish(self) -> None:
        self.inner.finish()

    def cancel(self) -> None:
        self.inner.cancel()

    async def events(self) -> AsyncIterator[StreamEvent]:
        counted = False
        try:
            async for ev in self.inner.events():
                if isinstance(ev, StreamEnd):  # counted here: a consumer that breaks at the end never closes us
                    counted = True
                    self.engine.ended(abandoned=False)
                yield ev
        finally:
            if not counted:
                self.engine.ended(abandoned=True)


class _CountingEngine:
    """The real Piper engine, counting the streams open at once (how else to see overlap untimed)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.sample_rate = inner.sample_rate
        self.lock = threading.Lock()
        self.open = self.most_open = self.opened = self.abandoned = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def capacity(self) -> Capacity:
        """Room for the batch's items whatever this box's load makes of the measured cost (that judgement
        has tests of its own): what is checked here is the fan-out. max_active_streams still caps it."""
        return Capacity(streams=8, active=self.open)

    def open_stream(self, voice: str | None, language: str, **options: object) -> Stream:
        stream = self.inner.open_stream(voice, language, **options)
        with self.lock:
            self.open += 1
            self.opened += 1
            self.most_open = max(self.most_open, self.open)
        return _CountingStream(stream, self)

    def ended(self, abandoned: bool) -> None:
        with self.lock:
            self.open -= 1
            self.abandoned += abandoned


@pytest.fixture(scope="module")
def counted_gateway(cpu_engine: Engine) -> Iterator[tuple[str, _CountingEngine]]:
    engine = _CountingEngine(cpu_engine)
    for addr in serve(engine):  # type: ignore[arg-type]
        yield addr, engine


def test_items_are_synthesised_concurrently(counted_gateway: tuple[str, _CountingEngine]) -> None:
    addr, engine = counted_gateway
    text = "A sentence of a decent length, so that each item takes a while to speak aloud."
    status, out = batch(addr, {"response_format": "pcm", "items": [{"input": text}] * 3})
    assert status == 200 and out["succeeded"] == 3, out
    assert engine.open == 0  # every stream ended
    assert engine.most_open >= 2  # at least two were open at the same time: not one after another


def test_a_client_that_leaves_frees_its_items_streams(counted_gateway: tuple[str, _CountingEngine]) -> None:
    addr, engine = counted_gateway
    long = "This is a long paragraph for a batch item, spoken sentence after sentence at length. " * 24
    body = json.dumps({"response_format": "pcm", "items": [{"input": long}] * 3}).encode()
    opened, abandoned = engine.opened, engine.abandoned
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        head = f"POST {PATH} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        deadline = time.monotonic() + 20
        while engine.opened < opened + 3:  # every item has its stream
            assert time.monotonic() < deadline, "the batch's streams did not open"
            time.sleep(0.02)
    deadline = time.monotonic() + 20  # the socket is closed: the streams must end, unfinished
    while engine.open:
        assert time.monotonic() < deadline, "the batch's streams outlived their client"
        time.sleep(0.02)
    assert engine.abandoned - abandoned == 3


# -- admission: every item is a stream in the same queue ---------------------------------------------------


def post_with_headers(addr: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    conn = http.client.HTTPConnection(addr, timeout=60)
    conn.request("POST", PATH, json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = conn.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(r.read())


@pytest.fixture(scope="module")
def one_slot_gateway(cpu_engine: Engine) -> Iterator[tuple[str, _CountingEngine]]:
    """Room for one stream and one waiting: the third of three items finds the queue full."""
    engine = _CountingEngine(cpu_engine)
    # first_audio_slo_s off: the second item waits out the first (the SLO would refuse it at once)
    for addr in serve(engine, max_active_streams=1, max_waiting_per_model=1, first_audio_slo_s=0):  # type: ignore[arg-type]
        yield addr, engine


@pytest.fixture(scope="module")
def no_queue_gateway(cpu_engine: Engine) -> Iterator[tuple[str, _CountingEngine]]:
    """Room for one stream and none waiting."""
    engine = _CountingEngine(cpu_engine)
    for addr in serve(engine, max_active_streams=1, max_waiting_per_model=0):  # type: ignore[arg-type]
        yield addr, engine


def test_items_pass_admission_and_one_past_the_bound_is_refused_alone(
    one_slot_gateway: tuple[str, _CountingEngine],
) -> None:
    addr, engine = one_slot_gateway
    status, out = batch(addr, {"response_format": "pcm", "items": [{"input": f"Item number {n}."} for n in "123"]})
    assert status == 200, out
    first, second, third = out["results"]
    assert first["status"] == second["status"] == "success"  # one ran, one waited for its turn
    assert third["status"] == "error" and third["code"] == "queue_full" and third["bound"] == "model", third
    assert third["retry_after_s"] >= 1 and "waiting" in third["error"]
    assert engine.most_open == 1 and engine.open == 0  # admission's one slot, never two streams at once


def test_a_batch_nothing_of_which_can_queue_is_a_429(no_queue_gateway: tuple[str, _CountingEngine]) -> None:
    addr, engine = no_queue_gateway
    long = "A long item holds the only slot for a while, sentence after sentence after sentence. " * 12
    holder: list[tuple[int, Any]] = []
    thread = threading.Thread(target=lambda: holder.append(batch(addr, {"items": [{"input": long}]})))
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while engine.open < 1:  # the slot is taken
            assert time.monotonic() < deadline, "the first batch never started"
            time.sleep(0.02)
        status, headers, out = post_with_headers(addr, {"items": [{"input": "One."}, {"input": "Two."}]})
    finally:
        thread.join(60)
    assert status == 429 and out["error"]["code"] == "queue_full", out
    assert int(headers["retry-after"]) >= 1
    assert holder and holder[0][0] == 200 and holder[0][1]["succeeded"] == 1  # the holder was not disturbed


# -- a flood of batches beside a canary -------------------------------------------------------------------

FLOOD_KEYS = {"flood": "key-flood", "canary": "key-canary"}


@pytest.fixture(scope="module")
def keyed_gateway(cpu_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("batch_keys") / "keys.json"
    tenants = {t: {"key_sha256": [hash_api_key(k)]} for t, k in FLOOD_KEYS.items()}
    path.write_text(json.dumps({"tenants": tenants}))
    # At most 4 streams at once, whatever the measured capacity (on a quiet box it is above 16): a batch of
    # 16 items then fills them and the tenant's 8 waiting places, and the rest are refused.
    yield from serve(cpu_engine, api_keys=str(path), max_waiting_per_tenant=8, max_queue_wait_s=60.0,
                     max_active_streams=4, first_audio_slo_s=0)  # the waiting places, not the SLO, refuse


async def test_a_flood_of_batches_is_queued_or_refused_per_item_and_the_canary_keeps_speaking(
    keyed_gateway: str,
) -> None:
    r = await run(keyed_gateway, "batch_flood", key=FLOOD_KEYS["canary"], flood_key=FLOOD_KEYS["flood"],
                  batches=3, items=16, chars=120)  # fmt: skip
    print(r)
    # The first batch takes the capacity and the tenant's 8 waiting places; one that finds none is a 429.
    assert r.seen.get("http:200", 0) >= 1 and r.seen.get("http:200", 0) + r.seen.get("http:429", 0) == 3, r.seen
    # The 8 waiting places are all served; more when the measured capacity leaves room beside the canary
    # (on a loaded box it may be one stream, the canary's).
    assert r.seen.get("success", 0) >= 8, r.seen
    assert r.seen.get("error:queue_full:tenant", 0) >= 1, r.seen  # 48 items, 8 places to wait
    assert {k for k in r.seen if k.startswith("error:")} <= {"error:queue_full:tenant", "error:queue_full:model"}
    c = r.canary
    assert c.failure is None and not c.errors, c
    # One batch item's synthesis at most (6.6 s on a 2-core box at load 15); a canary starved by the flood
    # would wait behind the 8 queued items.
    assert c.worst_wait_s < 10.0, c
    assert r.health_worst_s < HEALTH_S and set(r.health_statuses) == {"ok"}, r
    assert r.rss_growth_mb < 200, r
