"""API keys → tenants, and the loopback rule for open mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions import ApiKeys, InvalidId, Tenant, bind_allowed, hash_api_key, is_loopback, key_from_headers


def test_hash_is_sha256_hex() -> None:
    assert hash_api_key("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_verify_maps_keys_to_their_tenants() -> None:
    keys = ApiKeys.from_spec(f"acme={hash_api_key('k1')}, beta=sha256:{hash_api_key('k2').upper()}")
    assert keys.verify("k1") == Tenant("acme")
    assert keys.verify("k2") == Tenant("beta")
    assert keys.verify("k3") is None
    assert keys.verify("") is None and keys.verify(None) is None
    assert keys.verify(hash_api_key("k1")) is None  # the digest itself is not a key
    assert keys.authenticate("k3") is None
    assert not keys.is_open


def test_open_mode_authenticates_everyone_as_default_but_verifies_nobody() -> None:
    keys = ApiKeys()
    assert keys.is_open
    assert keys.authenticate(None) == Tenant("default")
    assert keys.verify("anything") is None


def test_config_file_with_limits(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"tenants": {
        "acme": {"key_sha256": [hash_api_key("a1"), hash_api_key("a2")], "max_streams": 4},
        "beta": {"key_sha256": hash_api_key("b1")},
    }}))
    keys = ApiKeys.from_file(path)
    assert keys.verify("a2") == Tenant("acme", 4)
    assert keys.verify("b1") == Tenant("beta", None)
    assert sorted(t.name for t in keys.tenants) == ["acme", "beta"]


def test_malformed_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="sha256"):
        ApiKeys({"not-a-digest": "acme"})
    with pytest.raises(ValueError, match="tenant=sha256hex"):
        ApiKeys.from_spec("acme")
    with pytest.raises(InvalidId):
        ApiKeys({hash_api_key("k"): "bad tenant"})


@given(st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=8, unique=True))
def test_every_configured_key_verifies_and_no_other(raw: list[str]) -> None:
    keys = ApiKeys({hash_api_key(k): f"t{i}" for i, k in enumerate(raw)})
    for i, k in enumerate(raw):
        assert keys.verify(k) == Tenant(f"t{i}")
        assert keys.verify(k + "x") is None or k + "x" in raw


def test_key_from_headers() -> None:
    assert key_from_headers("Bearer sk-1") == "sk-1"
    assert key_from_headers("bearer  sk-1 ") == "sk-1"
    assert key_from_headers("Basic abc", "sk-2") == "sk-2"
    assert key_from_headers(None, None) is None


def test_open_mode_binds_loopback_only_unless_insecure() -> None:
    open_, keyed = ApiKeys(), ApiKeys({hash_api_key("k"): "acme"})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    assert bind_allowed("127.0.0.1", keys=open_, insecure=False)
    assert not bind_allowed("0.0.0.0", keys=open_, insecure=False)
    assert bind_allowed("0.0.0.0", keys=open_, insecure=True)
    assert bind_allowed("0.0.0.0", keys=keyed, insecure=False)
