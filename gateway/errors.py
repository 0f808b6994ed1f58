"""HTTP errors in OpenAI's body shape, so client libraries surface them properly."""

from __future__ import annotations

from typing import Any

from litestar import Response


def api_error(status: int, code: str, message: str, param: str | None = None) -> Response[dict[str, Any]]:
    body = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return Response({"error": body}, status_code=status)


class ApiError(Exception):
    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value", status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def response(self) -> Response[dict[str, Any]]:
        return api_error(self.status, self.code, self.message, self.param)
