"""Several models in one gateway (gateway/models.py): `model` in session.config and in POST /v1/audio/speech
picks one, `GET /v1/models` lists them, voices per model; and the admin plane (gateway/admin.py): memory
report, load and unload with a stream open, its key, a canary beside repeated load/unload.

The second model is the session's Piper engine served under another name (`Shared`: an unload closes
nothing the other tests use), except where a test loads a fresh engine of its own."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from support.servers import serve
from support.wsclient import call, open_session, refused_at_handshake, until, utterance

from engine import Engine, load_engine
from gateway.connection import Limits
from gateway.models import in_process
from gateway.settings import ModelSpec
from sessions import hash_api_key

LONG = " ".join(f"Sentence {i} of a long answer keeps the stream speaking for a while." for i in range(60))


class Shared:
    """An engine served under a second model name; closing it (an unload) leaves the engine open."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def spare_engine() -> Iterator[Engine]:
    """A second Piper engine: what a model spoke is told by its own engine's busy time."""
    engine = load_engine("piper")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def two(piper_engine: Engine, spare_engine: Engine) -> Iterator[str]:
    """piper (the default) and spare, each its own engine (spare's reloads share the session's); churn, and
    fresh: models loaded at run time (fresh with an engine of its own)."""
    def factory(spec: ModelSpec) -> Engine:
        return in_process(spec) if spec.name == "fresh" else Shared(piper_engine)  # type: ignore[return-value]

    models = (ModelSpec(name="spare", kind="piper"), ModelSpec(name="churn", kind="piper", preload=False),
              ModelSpec(name="fresh", kind="piper", preload=False))  # fmt: skip
    yield from serve(piper_engine, model="piper,spare,churn,fresh", models=models, factory=factory,
                     engines={"spare": spare_engine}, engine_processes=False,
                     model_aliases={"Qwen/Qwen3-TTS": "spare"})  # fmt: skip


def get(addr: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(f"http://{addr}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def wait_state(addr: str, name: str, wanted: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status, record = get(addr, f"/v1/admin/models/{name}")
        assert status == 200, record
        if record["state"] == wanted:
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.05)


def metric(addr: str, prefix: str) -> float:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        body = r.read().decode()
    return next((float(line.removeprefix(prefix)) for line in body.splitlines() if line.startswith(prefix)), 0.0)


def ttfa_count(addr: str, model: str) -> float:
    return metric(addr, f'voxgate_response_ttfa_seconds_count{{model="{model}",tenant="default"}} ')


def busy_s(addr: str, model: str) -> float:
    """The seconds the model's own engine has synthesised (each engine measures its own)."""
    return metric(addr, f'voxgate_engine_busy_seconds_total{{model="{model}"}} ')


async def test_one_socket_switches_model_between_utterances(two: str) -> None:
    before = {m: ttfa_count(two, m) for m in ("piper", "spare")}
    ws, ready = await open_session(two, model="piper")
    assert ready["type"] == "session.ready", ready
    events, audio = await utterance(ws, "The first model speaks.")
    assert events[-1]["type"] == "session.done" and audio, events
    busy = {m: busy_s(two, m) for m in ("piper", "spare")}
    await ws.send(json.dumps({"type": "session.config", "model": "spare"}))
    assert (await until(ws, "session.ready"))[-1]["type"] == "session.ready"
    events, audio = await utterance(ws, "The second model speaks.")
    assert events[-1]["type"] == "session.done" and audio, events
    assert busy_s(two, "spare") > busy["spare"] and busy_s(two, "piper") == busy["piper"]  # spare's engine spoke
    await ws.send(json.dumps({"type": "session.config", "model": "nope"}))
    error = (await until(ws, "error"))[-1]
    assert error["code"] == "unknown_model" and "piper" in error["message"], error
    events, audio = await utterance(ws, "Still the second model.")  # a refused config changes nothing
    assert events[-1]["type"] == "session.done" and audio, events
    await ws.close()
    assert ttfa_count(two, "piper") == before["piper"] + 1
    assert ttfa_count(two, "spare") == before["spare"] + 2


@pytest.fixture(scope="module")
def one_slot(piper_engine: Engine, spare_engine: Engine) -> Iterator[str]:
    """piper and spare, each admitting one stream at a time (an utterance that holds it: no pressure rule)."""
    limits = Limits(utterance_idle_timeout=20.0, utterance_idle_under_pressure=20.0)
    yield from serve(piper_engine, limits, model="piper,spare", engines={"spare": spare_engine},
                     engine_processes=False, max_active_streams=1, continuation_lead_s=60.0,
                     first_audio_slo_s=0)  # it waits, by design  # fmt: skip


async def test_an_utterance_waiting_for_admission_stays_on_the_model_it_began_on(one_slot: str) -> None:
    """A session's utterance waits in piper's admission; the session switches to spare meanwhile. Admitted,
    the utterance speaks on piper's engine (its admission's), never spare's; the next one speaks on spare."""
    holder, ready = await open_session(one_slot, model="piper")
    assert ready["type"] == "session.ready", ready
    await holder.send(json.dumps({"type": "input.text", "text": "I am holding the engine for a moment. "}))
    await until(holder, "audio.start")  # piper's one stream is held (no input.done yet)
    ws, ready = await open_session(one_slot, model="piper")
    await ws.send(json.dumps({"type": "input.text", "text": "Spoken by the model I began on."}))
    await ws.send(json.dumps({"type": "input.done"}))
    waiting = (await until(ws, "audio.waiting"))[-1]
    assert waiting["reason"] == "queue", waiting
    await ws.send(json.dumps({"type": "session.config", "model": "spare"}))  # while it waits
    assert (await until(ws, "session.ready"))[-1]["type"] == "session.ready"
    spare_busy = busy_s(one_slot, "spare")
    await holder.send(json.dumps({"type": "input.done"}))  # piper's stream is free: the waiter goes
    await until(holder, "session.done")
    await holder.close()
    events, audio = [], 0
    while not events or events[-1]["type"] != "session.done":
        m = await asyncio.wait_for(ws.recv(), 30)
        if isinstance(m, bytes):
            audio += len(m)
        else:
            events.append(json.loads(m))
    assert audio > 8000 and not [e for e in events if e["type"] == "error"], events
    assert busy_s(one_slot, "spare") == spare_busy  # spare's engine said nothing of it
    events, chunks = await utterance(ws, "Now the second model speaks.")
    assert events[-1]["type"] == "session.done" and chunks, events
    assert busy_s(one_slot, "spare") > spare_busy
    await ws.close()


async def test_an_unknown_model_in_the_first_config_is_refused_by_code(two: str) -> None:
    ws, first = await open_session(two, model="x" * 300)
    assert first["type"] == "error" and first["code"] == "invalid_config", first  # the 256-character bound
    ws, first = await open_session(two, model="qwen-large")
    assert first["type"] == "error" and first["code"] == "unknown_model", first
    await ws.close()


def test_http_speech_and_models_through_the_openai_client(two: str) -> None:
    with openai.OpenAI(base_url=f"http://{two}/v1", api_key="unused", max_retries=0) as oai:
        assert [m.id for m in oai.models.list()] == ["piper", "spare", "churn", "fresh"]
        assert oai.models.retrieve("spare").owned_by == "voxgate"
        for model in ("spare", "piper", "tts-1", "Qwen/Qwen3-TTS"):  # OpenAI's names: the default; an alias
            audio = oai.audio.speech.create(model=model, voice="alloy", input="Hi.", response_format="pcm")
            assert len(audio.content) > 1000, model
        with pytest.raises(openai.NotFoundError) as err:
            oai.audio.speech.create(model="nope", voice="alloy", input="Hi.", response_format="pcm")
        assert err.value.body["code"] == "unknown_model" and err.value.body["param"] == "model", err.value.body
        with pytest.raises(openai.APIStatusError) as err:  # registered, not loaded
            oai.audio.speech.create(model="churn", voice="alloy", input="Hi.", response_format="pcm")
        assert err.value.status_code == 503 and err.value.body["code"] == "model_not_loaded", err.value.body
    status, voices = get(two, "/v1/audio/voices?model=spare")
    assert status == 200 and "joe" in json.dumps(voices), voices
    status, body = get(two, "/v1/audio/voices?model=nope")
    assert status == 404 and body["error"]["code"] == "unknown_model", body


def test_health_and_the_admin_report_say_each_model(two: str) -> None:
    t0 = time.perf_counter()
    status, health = get(two, "/health")
    assert time.perf_counter() - t0 < 1.0
    assert status == 200 and health["model"] == "piper", health
    assert health["models"]["piper"] == "ready" and health["models"]["churn"] == "unloaded", health
    assert health["status"] == "degraded"  # a model configured is not serving
    status, listing = get(two, "/v1/admin/models")
    assert status == 200 and listing["object"] == "list", listing
    record = {r["id"]: r for r in listing["data"]}
    piper = record["piper"]
    assert piper["default"] and piper["state"] == "ready" and piper["pid"] == os.getpid(), piper
    assert piper["streams"] == {"active": 0, "waiting": 0}, piper
    assert piper["capabilities"]["sample_rate"] > 0 and piper["capabilities"]["voices"] >= 1, piper
    memory = piper["memory"]
    assert 50 * 2**20 < memory["rss_bytes"] < 64 * 2**30 and memory["shared_process"], memory
    assert {"torch_allocated_bytes", "cuda_allocated_bytes", "kv_bytes", "slot_bytes"} <= set(memory), memory
    assert "slots_in_use" in piper["telemetry"], piper
    assert record["churn"]["state"] == "unloaded" and record["churn"]["memory"] is None, record["churn"]
    with urllib.request.urlopen(f"http://{two}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'voxgate_model_state{model="churn",state="unloaded"} 1.0' in metrics
    assert 'voxgate_admission_waiting{model="spare"} 0.0' in metrics
    assert 'voxgate_engine_slots_in_use{model="piper"}' in metrics


async def test_unload_drains_cuts_after_grace_and_refuses_new_sessions(two: str) -> None:
    ws, ready = await open_session(two, model="spare")
    assert ready["type"] == "session.ready"
    await ws.send(json.dumps({"type": "input.text", "text": LONG}))
    await ws.send(json.dumps({"type": "input.done"}))
    await until(ws, "audio.start")
    status, record = call(two, "POST", "/v1/admin/models/spare/unload", None, {"grace_s": 0.5})
    assert status == 202 and record["state"] == "unloading" and record["streams"]["active"] >= 1, record
    other, refused = await open_session(two, model="spare")
    assert refused["type"] == "error" and refused["code"] == "model_unloading", refused
    events = await until(ws, "session.done", timeout=10)  # cut after the grace, told why
    errors = [e for e in events if e["type"] == "error"]
    # model_unloaded once the pump forwards StreamEnd.code (engine_error with the reason before that)
    assert errors and errors[0]["code"] in ("model_unloaded", "engine_error"), events
    assert "unloaded" in errors[0]["message"], errors
    wait_state(two, "spare", "unloaded", timeout=5)
    await ws.send(json.dumps({"type": "session.config", "model": "spare"}))
    assert (await until(ws, "error"))[-1]["code"] == "model_not_loaded"
    await ws.send(json.dumps({"type": "session.config", "model": "piper"}))  # the socket goes on elsewhere
    await until(ws, "session.ready")
    events, audio = await utterance(ws, "The default still speaks.")
    assert events[-1]["type"] == "session.done" and audio
    status, again = call(two, "POST", "/v1/admin/models/spare/unload", None, {})
    assert status == 409 and again["error"]["code"] == "model_not_loaded", again
    assert call(two, "POST", "/v1/admin/models/spare/load", None)[0] == 202
    wait_state(two, "spare", "ready")
    await ws.close()
    await other.close()


async def test_an_open_stream_finishes_within_the_grace(two: str) -> None:
    ws, _ = await open_session(two, model="spare")
    await ws.send(json.dumps({"type": "input.text", "text": "A short answer finishes."}))
    await ws.send(json.dumps({"type": "input.done"}))
    await until(ws, "audio.start")
    assert call(two, "POST", "/v1/admin/models/spare/unload", None, {"grace_s": 20})[0] == 202
    events = await until(ws, "session.done", timeout=20)
    assert not [e for e in events if e["type"] == "error"], events
    wait_state(two, "spare", "unloaded", timeout=10)
    call(two, "POST", "/v1/admin/models/spare/load", None)
    wait_state(two, "spare", "ready")
    await ws.close()


async def test_a_model_loaded_at_run_time_speaks_and_unloads(two: str) -> None:
    assert call(two, "POST", "/v1/admin/models/nope/load", None)[0] == 404
    status, record = call(two, "POST", "/v1/admin/models/fresh/load", None)
    assert status == 202 and record["state"] == "warming", record
    ready = await asyncio.to_thread(wait_state, two, "fresh", "ready", 60)
    assert ready["warm_up_s"] > 0 and ready["loaded_at"] > 0, ready
    ws, _ = await open_session(two, model="fresh")
    events, audio = await utterance(ws, "A model loaded just now.")
    assert events[-1]["type"] == "session.done" and audio, events
    await ws.close()
    assert call(two, "POST", "/v1/admin/models/fresh/unload", None, {"grace_s": 1})[0] == 202
    await asyncio.to_thread(wait_state, two, "fresh", "unloaded", 10)


async def test_a_canary_beside_repeated_load_and_unload(two: str) -> None:
    from attack import run

    result = await run(f"http://{two}", "model_churn", model="churn", seconds=2.0)
    print(result)
    assert result.seen.get("load:ready", 0) >= 2 and result.seen.get("unload:unloaded", 0) >= 2, result.seen
    assert set(result.seen) <= {"load:202", "load:ready", "unload:202", "unload:unloaded"}, result.seen
    assert result.canary.failure is None and not result.canary.errors, result.canary
    assert result.canary.worst_wait_s < 3.0 and result.health_worst_s < 1.5, result
    assert result.rss_growth_mb < 50, result


def walked(obj: object) -> bool:
    """Whether the cyclic collector's full passes still walk `obj` (engine/heap.py freezes it out)."""
    return any(o is obj for o in gc.get_objects())


async def test_what_lives_from_start_up_and_a_model_loaded_later_leave_the_full_gc_passes(
    piper_engine: Engine,
) -> None:
    made: list[Shared] = []

    def factory(spec: ModelSpec) -> Engine:
        made.append(Shared(piper_engine))
        return made[-1]  # type: ignore[return-value]

    before = Shared(piper_engine)
    assert walked(before)
    later = (ModelSpec(name="later", kind="piper", preload=False),)
    for addr in serve(piper_engine, model="piper,later", models=later, factory=factory, engine_processes=False):
        assert not walked(before)  # alive when serving began: frozen, never walked again
        since = Shared(piper_engine)
        assert walked(since)  # what serving makes is still collected
        assert call(addr, "POST", "/v1/admin/models/later/load", None)[0] == 202
        await asyncio.to_thread(wait_state, addr, "later", "ready", 30)
        assert len(made) == 1 and not walked(made[0])  # the model's heap, frozen once it is served
        assert not walked(since)  # and what was alive beside it (engine/heap.py: once per load)


# -- the admin key -----------------------------------------------------------------------------------


ADMIN, TENANT = "admin-secret", "tenant-secret"


@pytest.fixture(scope="module")
def keyed(piper_engine: Engine) -> Iterator[str]:
    yield from serve(piper_engine, admin_key=hashlib.sha256(ADMIN.encode()).hexdigest(),
                     api_keys=f"acme={hash_api_key(TENANT)}", admin_open_loopback=False)  # fmt: skip


def test_the_admin_key_is_required_and_a_tenant_key_is_not_it(keyed: str) -> None:
    assert get(keyed, "/v1/admin/models")[0] == 401
    status, body = get(keyed, "/v1/admin/models", {"Authorization": f"Bearer {TENANT}"})
    assert status == 401 and body["error"]["code"] == "unauthorized", body
    assert get(keyed, "/v1/admin/models", {"X-API-Key": ADMIN})[0] == 200
    assert get(keyed, "/v1/models", {"Authorization": f"Bearer {ADMIN}"})[0] == 401  # nor the admin key a tenant's
    assert get(keyed, "/v1/models", {"Authorization": f"Bearer {TENANT}"})[0] == 200
    # /metrics names every tenant: the admin plane's, behind the same key.
    assert get(keyed, "/metrics")[0] == 401
    with urllib.request.urlopen(urllib.request.Request(f"http://{keyed}/metrics", headers={"X-API-Key": ADMIN})) as r:
        assert r.status == 200


def _outside_address() -> str | None:
    """This host's address on a non-loopback interface, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the outgoing interface
            host = s.getsockname()[0]
        except OSError:
            return None
    return None if host.startswith("127.") else host


def test_the_loopback_opt_in_answers_only_direct_loopback_callers(piper_engine: Engine) -> None:
    # admin_open_loopback (a developer's machine; tests' servers opt in): loopback callers only, never a
    # forwarded request. allowed_hosts "*": the outside caller's Host is not what is refused here.
    outside = _outside_address()
    for addr in serve(piper_engine, host="0.0.0.0", insecure=True, admin_open_loopback=True, allowed_hosts="*"):
        port = addr.rsplit(":", 1)[1]
        assert get(f"127.0.0.1:{port}", "/v1/admin/models")[0] == 200
        status, body = get(f"127.0.0.1:{port}", "/v1/admin/models", {"X-Forwarded-For": "203.0.113.9"})
        assert status == 403 and body["error"]["code"] == "admin_loopback_only", body
        if outside is not None:
            status, body = get(f"{outside}:{port}", "/v1/admin/models")
            assert status == 403 and body["error"]["code"] == "admin_loopback_only", body


def test_without_the_opt_in_or_a_key_loopback_is_no_credential(piper_engine: Engine) -> None:
    for addr in serve(piper_engine, admin_open_loopback=False):
        for path in ("/v1/admin/models", "/metrics"):
            status, body = get(addr, path)
            assert status == 403 and body["error"]["code"] == "admin_key_required", body


# -- a model in its own process (the server's default) ------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_model_in_a_child_process_reports_it_speaks_and_its_unload_ends_the_process(
    piper_engine: Engine,
) -> None:
    for addr in serve(piper_engine, model="piper,kid", models=(ModelSpec(name="kid", kind="piper"),)):
        record = await asyncio.to_thread(wait_state, addr, "kid", "ready", 120)
        pid = record["pid"]
        assert pid != os.getpid() and _alive(pid) and not record["memory"]["shared_process"], record
        assert record["memory"]["rss_bytes"] > 20 * 2**20 and record["warm_up_s"] is not None, record
        assert record["capabilities"]["sample_rate"] > 0, record
        ws, ready = await open_session(addr, model="kid")
        assert ready["type"] == "session.ready", ready
        events, audio = await utterance(ws, "Spoken by another process.")
        assert events[-1]["type"] == "session.done" and audio, events
        await ws.close()
        assert call(addr, "POST", "/v1/admin/models/kid/unload", None, {"grace_s": 1})[0] == 202
        await asyncio.to_thread(wait_state, addr, "kid", "unloaded", 20)
        deadline = time.monotonic() + 10
        while _alive(pid):
            assert time.monotonic() < deadline, "the engine process outlived its unload"
            await asyncio.sleep(0.05)


def test_each_batch_item_picks_its_model(two: str) -> None:
    body = {"voice": "joe", "response_format": "pcm",
            "items": [{"input": "One."}, {"input": "Two.", "model": "spare"}, {"input": "Three.", "model": "nope"}]}
    status, out = call(two, "POST", "/v1/audio/speech/batch", None, body)
    assert status == 200 and [r["status"] for r in out["results"]] == ["success", "success", "error"], out
    assert out["results"][2]["code"] == "unknown_model", out


# -- the model list in the settings -------------------------------------------------------------------


def test_the_model_list_from_flags_and_the_toml_file(tmp_path: Any) -> None:
    from gateway.settings import Settings, load_settings

    assert [(s.name, s.source) for s in Settings(model="piper, tiny,/ckpt/Qwen3-0.6B/").model_specs()] == [
        ("piper", "piper"), ("tiny", "tiny"), ("Qwen3-0.6B", "/ckpt/Qwen3-0.6B/")]
    path = tmp_path / "voxgate.toml"
    path.write_text('[voxgate]\nport = 9000\n[voxgate.model_aliases]\n"Qwen/Qwen3-TTS" = "qwen"\n'
                    '[[models]]\nname = "qwen"\npath = "/ckpt/q"\noptions = { max_streams = 4 }\n'
                    '[[models]]\nname = "fast"\nkind = "piper"\npreload = false\n')  # fmt: skip
    settings = load_settings(path, env={})
    specs = settings.model_specs()
    assert [s.name for s in specs] == ["qwen", "fast"] and specs[0].options == {"max_streams": 4}
    assert not specs[1].preload and settings.model_aliases == {"Qwen/Qwen3-TTS": "qwen"}
    assert [s.name for s in load_settings(path, env={}, model="fast").model_specs()] == ["fast"]  # a flag picks
    for bad, why in (({"model": "a,a"}, "named twice"), ({"model": "bad name"}, "letters, digits"),
                     ({"admin_key": "secret"}, "sha256"), ({"model": " , "}, "names no model")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            Settings(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="array of tables"):
        load_settings(None, env={}, models={"name": "x"})


async def test_with_every_model_unloaded_health_says_so_and_sessions_are_refused(piper_engine: Engine) -> None:
    for addr in serve(piper_engine, factory=lambda spec: Shared(piper_engine)):  # type: ignore[arg-type,return-value]
        assert call(addr, "POST", "/v1/admin/models/piper/unload", None, {"grace_s": 0})[0] == 202
        await asyncio.to_thread(wait_state, addr, "piper", "unloaded", 10)
        status, health = get(addr, "/health")
        assert status == 503 and health["status"] == "unavailable" and health["models"] == {"piper": "unloaded"}
        status, _, body = await refused_at_handshake(addr)  # before the upgrade: a balancer tries elsewhere
        assert status == 503 and body["error"]["code"] == "engine_not_ready", body
        status, body = call(addr, "POST", "/v1/audio/speech", None, {"input": "Hi.", "voice": "joe"})
        assert status == 503 and body["error"]["code"] == "model_not_loaded", body
        assert call(addr, "POST", "/v1/admin/models/piper/load", None)[0] == 202
        await asyncio.to_thread(wait_state, addr, "piper", "ready", 10)
        assert get(addr, "/health")[1]["status"] == "ok"


async def test_a_resumed_session_keeps_its_model(two: str) -> None:
    ws, ready = await open_session(two, model="spare")
    await ws.close()
    before = ttfa_count(two, "spare")
    ws, resumed = await open_session(two, session_id=ready["session_id"])  # model not sent: the stored one
    assert resumed["type"] == "session.ready" and resumed["resumed"], resumed
    events, audio = await utterance(ws, "Resumed on the same model.")
    assert events[-1]["type"] == "session.done" and audio, events
    await ws.close()
    assert ttfa_count(two, "spare") == before + 1
