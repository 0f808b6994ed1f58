"""Session and voice state shared by gateway replicas (a session resumes on any of them). Imports no gateway, engine
or segmentation code."""

from .attached import AttachedSession
from .auth import DEFAULT_TENANT, ApiKeys, Tenant, bind_allowed, hash_api_key, is_loopback, key_from_headers
from .backends import embedded_server
from .breaker import CircuitBreaker
from .control import ControlSubscription
from .errors import (
    SESSION_TAKEN_OVER,
    InvalidId,
    SessionBusy,
    SessionExists,
    SessionNotFound,
    SessionStoreError,
    StateUnavailable,
    StoreBusy,
    StreamLimitExceeded,
    VoiceExists,
    VoiceLimitExceeded,
    VoiceNotFound,
    VoiceQuotaExceeded,
)
from .leases import OwnershipLease, StreamSlot
from .records import ControlMessage, SessionRecord, SpokenEntry, Voice, VoiceInfo
from .store import SessionStore, StoreHealth, StoreSettings
from .writebehind import WriteBehind

__all__ = [
    "DEFAULT_TENANT",
    "SESSION_TAKEN_OVER",
    "ApiKeys",
    "AttachedSession",
    "CircuitBreaker",
    "ControlMessage",
    "ControlSubscription",
    "InvalidId",
    "OwnershipLease",
    "SessionBusy",
    "SessionExists",
    "SessionNotFound",
    "SessionRecord",
    "SessionStore",
    "SessionStoreError",
    "SpokenEntry",
    "StateUnavailable",
    "StoreBusy",
    "StoreHealth",
    "StoreSettings",
    "StreamLimitExceeded",
    "StreamSlot",
    "Tenant",
    "Voice",
    "VoiceExists",
    "VoiceInfo",
    "VoiceLimitExceeded",
    "VoiceNotFound",
    "VoiceQuotaExceeded",
    "WriteBehind",
    "bind_allowed",
    "embedded_server",
    "hash_api_key",
    "is_loopback",
    "key_from_headers",
]
