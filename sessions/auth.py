"""API keys → tenants. Pure: no I/O beyond reading a config file when asked.

Keys are configured only as SHA-256 hex digests, so a leaked config does not leak keys. A presented
key is hashed and compared with every configured digest in constant time (no early exit), so timing
reveals neither which digest matched nor how much of one did.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .keys import check_id

DEFAULT_TENANT = "default"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_api_key(key: str) -> str:
    """The digest to put in the config for ``key``."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Tenant:
    name: str
    max_streams: int | None = None  # None: no per-tenant stream limit
    weight: float = 1.0  # the tenant's share of the engine under contention


class ApiKeys:
    """The configured keys. ``ApiKeys()`` (no keys) is open mode: every caller is the default tenant."""

    def __init__(self, digests: Mapping[str, Tenant | str] | None = None) -> None:
        self._entries: list[tuple[bytes, Tenant]] = []
        for digest, tenant in (digests or {}).items():
            d = digest.strip().lower().removeprefix("sha256:")
            if not _HEX64.match(d):
                raise ValueError(f"API key digests must be sha256 hex (64 chars), got {digest[:12]!r}…")
            t = tenant if isinstance(tenant, Tenant) else Tenant(tenant)
            check_id("tenant", t.name)
            self._entries.append((bytes.fromhex(d), t))

    @property
    def is_open(self) -> bool:
        return not self._entries

    @property
    def tenants(self) -> list[Tenant]:
        return list({t.name: t for _, t in self._entries}.values())

    @classmethod
    def from_spec(cls, spec: str) -> ApiKeys:
        """``"acme=<sha256hex>,beta=<sha256hex>"`` — the form of ``VOXGATE_API_KEYS``; ``"acme:2=<hex>"``
        gives acme the weight 2 (its share of the engine under contention; default 1)."""
        digests: dict[str, Tenant | str] = {}
        weights: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in spec.split(","))):
            tenant, sep, digest = item.partition("=")
            if not sep:
                raise ValueError(f"API key entry {item[:20]!r}… is not tenant=sha256hex")
            name, colon, weight = tenant.strip().partition(":")  # ':' is never part of a tenant id
            w = _weight(name, weight) if colon else 1.0
            if weights.setdefault(name, w) != w:
                raise ValueError(f"tenant {name[:40]!r} is given two weights")
            digests[digest.strip()] = Tenant(check_id("tenant", name), weight=w)
        return cls(digests)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ApiKeys:
        """``{"tenants": {"acme": {"key_sha256": ["<hex>", …], "max_streams": 4, "weight": 2}}}``."""
        digests: dict[str, Tenant | str] = {}
        for name, conf in config.get("tenants", {}).items():
            limit = conf.get("max_streams")
            weight = _weight(name, conf.get("weight", 1.0))
            tenant = Tenant(name, int(limit) if limit is not None else None, weight)
            hashes = conf.get("key_sha256", [])
            for digest in [hashes] if isinstance(hashes, str) else hashes:
                digests[digest] = tenant
        return cls(digests)

    @classmethod
    def from_file(cls, path: str | Path) -> ApiKeys:
        return cls.from_config(json.loads(Path(path).read_text()))

    def verify(self, presented: str | None) -> Tenant | None:
        """The tenant owning ``presented``, or None. Strict: open mode verifies nothing."""
        if not presented:
            return None
        digest = hashlib.sha256(presented.encode("utf-8")).digest()
        found: Tenant | None = None
        for expected, tenant in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = tenant
        return found

    def authenticate(self, presented: str | None) -> Tenant | None:
        """The policy the gateway applies: open mode → default tenant; otherwise ``verify``."""
        if self.is_open:
            return Tenant(DEFAULT_TENANT)
        return self.verify(presented)


MAX_WEIGHT = 1000.0  # a weight is a share: past this it would only overflow the fairness arithmetic


def _weight(tenant: str, value: object) -> float:
    """A tenant's configured weight: a finite number in (0, MAX_WEIGHT]."""
    try:
        weight = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        weight = math.nan
    if isinstance(value, bool) or not 0 < weight <= MAX_WEIGHT:  # NaN fails too
        raise ValueError(f"tenant {tenant[:40]!r}: weight must be a number > 0 and ≤ {MAX_WEIGHT:g}")
    return weight


def key_from_headers(authorization: str | None, x_api_key: str | None = None) -> str | None:
    """``Authorization: Bearer <key>`` (OpenAI clients) or ``X-API-Key: <key>``."""
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return x_api_key.strip() if x_api_key and x_api_key.strip() else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_allowed(host: str, *, keys: ApiKeys, insecure: bool) -> bool:
    """Open mode (no keys) may only listen on loopback unless ``--insecure`` is given."""
    return not keys.is_open or insecure or is_loopback(host)


if __name__ == "__main__":  # the digest command's old name: say the new one rather than print nothing
    raise SystemExit("python -m sessions.auth is now `voxgate key-digest KEY`")
