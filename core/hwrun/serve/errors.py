"""Every refusal the server gives, as an OpenAI-style error body with its HTTP status.

A client's mistake is always a 4xx that says what to fix (the ``param`` names the field); only a
failure inside hwrun is a 500, and it fails that request alone. The body is what the OpenAI API
returns, so the official client raises the matching exception (``BadRequestError``,
``NotFoundError``, ``AuthenticationError``, ``UnprocessableEntityError``, ...):

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}
"""

from __future__ import annotations

from typing import Any

# The ``type`` OpenAI gives each status.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """A request refused with ``status``; ``message`` says what was asked and what to change."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    error_type = ERROR_TYPES.get(status) or (
        "server_error" if status >= 500 else "invalid_request_error"
    )
    return {
        "error": {
            "message": message,
            "type": error_type,
            "param": param,
            "code": code,
        }
    }


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)
