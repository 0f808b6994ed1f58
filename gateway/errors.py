"""HTTP errors in OpenAI's body shape, so client libraries surface them properly.

Handlers raise; `EXCEPTION_HANDLERS`, one table for the whole app, turns each failure into its status,
stable code and the field it names (`param`): a handler never needs a try/except ladder.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import ClientException, SerializationException, ValidationException
from litestar.exceptions.http_exceptions import RequestEntityTooLarge

from engine import EngineError
from gateway.admission import QueueFull
from sessions import (
    InvalidId,
    SessionNotFound,
    SessionStoreError,
    StateUnavailable,
    StoreBusy,
    StreamLimitExceeded,
    VoiceExists,
    VoiceLimitExceeded,
    VoiceQuotaExceeded,
)
from sessions.lexicon import LexiconLimitExceeded

MAX_MESSAGE = 200  # msgspec quotes an enum's given value: a client's string is never echoed whole


def api_error(status: int, code: str, message: str, param: str | None = None) -> Response[dict[str, Any]]:
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return Response({"error": body}, status_code=status)


class ApiError(Exception):
    """An error answered with `status` and OpenAI's body; `retry_after_s`: a `Retry-After` header (whole
    seconds, at least 1) for a refusal that a later try, or another replica, may get past."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value", status: int = 400,
                 retry_after_s: float | None = None):  # fmt: skip
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status
        self.retry_after_s = retry_after_s

    def response(self) -> Response[dict[str, Any]]:
        response = api_error(self.status, self.code, self.message, self.param)
        if self.retry_after_s is not None:
            response.headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return response

    @classmethod
    def of(cls, exc: Exception) -> ApiError:
        """`exc` as the ApiError the table answers it with (a batch item reports it in its body)."""
        for kind in type(exc).__mro__:
            if kind in _AS_API_ERROR:
                return _AS_API_ERROR[kind](exc)
        raise exc


def _validation(exc: ValidationException) -> ApiError:
    """A body that does not match its Struct: the first field named (Litestar gives it as `key`)."""
    extra = exc.extra[0] if isinstance(exc.extra, list) and exc.extra else {}
    field = extra.get("key") if isinstance(extra, dict) else None
    message = str(extra.get("message") or exc.detail)[:MAX_MESSAGE] if isinstance(extra, dict) else exc.detail
    # OpenAI's code for an over-long string; every other mismatch is an invalid value.
    code = "string_above_max_length" if "`str` of length <=" in message else "invalid_value"
    param = None if field in (None, "data") else str(field)
    if param is None and "required field `" in message:  # msgspec names a missing field only in its message
        param = message.split("`")[1]
    return ApiError(f"{param}: {message}" if param else message, param=param, code=code)


# The engine is down (its process restarting, engine/process/) or closed: try again later, not a bad request.
_ENGINE_DOWN = frozenset({"engine_unavailable", "engine_restarting", "engine_closed"})


def _engine(e: EngineError) -> ApiError:
    param = "ref_audio" if e.code == "invalid_reference_audio" else "voice" if "voice" in e.code else None
    return ApiError(str(e), param=param, code=e.code, status=503 if e.code in _ENGINE_DOWN else 400)


_STORE_STATUS: dict[type[SessionStoreError], int] = {VoiceExists: 409, VoiceLimitExceeded: 413,
                                                     VoiceQuotaExceeded: 413, InvalidId: 400, StateUnavailable: 503,
                                                     SessionNotFound: 404, LexiconLimitExceeded: 413,
                                                     StoreBusy: 429}  # fmt: skip


def _store(e: SessionStoreError) -> ApiError:
    if isinstance(e, StreamLimitExceeded):  # the tenant's max_streams: free again when one of its streams ends
        return ApiError(str(e), code=e.code, status=429, retry_after_s=1.0)
    return ApiError(str(e), code=e.code, status=_STORE_STATUS.get(type(e), 400))


def invalid(e: msgspec.ValidationError) -> ApiError:
    """A msgspec mismatch outside Litestar's decoding (a batch item): the field named, as `_validation`."""
    message, _, where = str(e).rpartition(" - at `$.")
    if not message:
        message, where = str(e), ""
    field = where.rstrip("`").split(".")[0] or None
    return _validation(ValidationException(extra=[{"message": message, "key": field}]))


def _too_large(request: Request, _: RequestEntityTooLarge) -> ApiError:
    limit = request.route_handler.request_max_body_size
    hint = request.route_handler.opt.get("too_large_hint", "")  # the route's advice, e.g. send a clip compressed
    return ApiError(f"the request body is limited to {limit} bytes{hint}", code="request_too_large", status=413)


_AS_API_ERROR: dict[type[Exception], Callable[[Any], ApiError]] = {
    ApiError: lambda e: e,
    ValidationException: _validation,
    EngineError: _engine,
    SessionStoreError: _store,
    QueueFull: lambda e: ApiError(e.message, code="queue_full", status=429),
}


def _malformed(exc: BaseException) -> bool:
    """A body that is not JSON at all: Litestar raises a plain ClientException from the SerializationException
    its decoder raised (a body that is JSON but not the Struct is a ValidationException instead); known by
    those types, never by their messages."""
    return type(exc) is ClientException and isinstance(exc.__cause__, SerializationException)


def _answer(request: Request, exc: Exception) -> Response[dict[str, Any]]:
    if isinstance(exc, RequestEntityTooLarge):
        return _too_large(request, exc).response()
    if _malformed(exc):
        return ApiError("the request body is not valid JSON", code="invalid_json").response()
    if isinstance(exc, ClientException) and not isinstance(exc, ValidationException):
        return ApiError(str(exc.detail)[:MAX_MESSAGE], status=exc.status_code).response()
    response = ApiError.of(exc).response()
    if isinstance(exc, QueueFull):
        response.headers["Retry-After"] = exc.retry_after_header
    elif isinstance(exc, StoreBusy):  # every connection to the store busy: capacity, retried as a full queue is
        response.headers["Retry-After"] = str(exc.retry_after_s)
    return response


# Litestar picks the most specific class of a raised exception from this table.
EXCEPTION_HANDLERS: dict[type[Exception], Callable[[Request, Any], Response[Any]]] = {
    kind: _answer for kind in (*_AS_API_ERROR, ClientException)
}
