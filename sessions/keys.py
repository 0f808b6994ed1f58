"""Redis key layout. Versioned and prefixed so a schema change never reads old data.

Every key of a tenant carries the tenant inside a ``{hash tag}``, so all keys a script or transaction
touches land in one slot on a Redis Cluster as well.
"""

from __future__ import annotations

import re

from .errors import InvalidId

PREFIX = "voxgate:v1"

# Ids become key components: no ':' '{' '}' or whitespace, bounded length.
_ID = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")


def check_id(kind: str, value: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        shown = repr(value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value)[:60]
        raise InvalidId(f"invalid {kind} id {shown}: use 1-128 of [A-Za-z0-9_.@-]")  # never echo a megabyte
    return value


def _tenant(tenant: str) -> str:
    return f"{PREFIX}:{{{check_id('tenant', tenant)}}}"


def session(tenant: str, session_id: str) -> str:
    return f"{_tenant(tenant)}:session:{check_id('session', session_id)}"


def spoken(tenant: str, session_id: str) -> str:
    return session(tenant, session_id) + ":spoken"


def lease(tenant: str, session_id: str) -> str:
    return session(tenant, session_id) + ":lease"


def control(tenant: str, session_id: str) -> str:
    return session(tenant, session_id) + ":control"


def voice(tenant: str, voice_id: str) -> str:
    return f"{_tenant(tenant)}:voice:{check_id('voice', voice_id)}"


def voice_index(tenant: str) -> str:
    return f"{_tenant(tenant)}:voices"


def voice_sizes(tenant: str) -> str:
    """A hash of the tenant's voice ids → bytes stored, for its byte quota."""
    return f"{_tenant(tenant)}:voices:bytes"


def streams(tenant: str) -> str:
    return f"{_tenant(tenant)}:streams"
