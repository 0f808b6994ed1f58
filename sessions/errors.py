"""Errors raised by the session store, each with a stable ``code`` the gateway sends to clients."""

from __future__ import annotations

from typing import ClassVar

# The code the gateway sends on the old socket when another connection takes its session over.
SESSION_TAKEN_OVER = "session_taken_over"


class SessionStoreError(Exception):
    """Base class; ``code`` is the protocol ``error`` code for this failure."""

    code: ClassVar[str] = "session_error"


class StateUnavailable(SessionStoreError):
    """Redis could not be reached (or answered too slowly) during an operation."""

    code = "state_unavailable"


class StoreBusy(SessionStoreError):
    """Every connection this replica may open to the store stayed in use for ``pool_wait_s``: the
    replica is at capacity (a burst of callers), not the store away. A capacity refusal, with the
    admission's code: retry in ``retry_after_s``."""

    code = "queue_full"
    retry_after_s: ClassVar[int] = 1


# The store could not serve the call now, and may a moment later: a write is kept to replay, a renewal retried.
RETRYABLE: tuple[type[SessionStoreError], ...] = (StateUnavailable, StoreBusy)


class InvalidId(SessionStoreError, ValueError):
    """A tenant, session or voice id that cannot be a key component."""

    code = "invalid_id"


class SessionNotFound(SessionStoreError):
    """No such session for this tenant (a foreign tenant's session is 'not found' too)."""

    code = "session_not_found"


class SessionExists(SessionStoreError):
    code = "session_exists"


class SessionBusy(SessionStoreError):
    """Another live connection owns the session and the policy is ``refuse``."""

    code = "session_busy"


class VoiceNotFound(SessionStoreError):
    code = "voice_not_found"


class VoiceExists(SessionStoreError):
    code = "voice_exists"


class VoiceLimitExceeded(SessionStoreError):
    """The tenant already holds the configured maximum number of voices, or the voice is too large."""

    code = "voice_limit"


class VoiceQuotaExceeded(VoiceLimitExceeded):
    """The tenant's voices would hold more than ``max_voice_bytes_per_tenant`` bytes."""

    code = "voice_quota_exceeded"


class StreamLimitExceeded(SessionStoreError):
    """The tenant already has ``limit`` live streams."""

    code = "stream_limit"

    def __init__(self, tenant: str, limit: int, active: int) -> None:
        super().__init__(f"tenant {tenant!r} has {active} of {limit} concurrent streams in use")
        self.tenant = tenant
        self.limit = limit
        self.active = active
