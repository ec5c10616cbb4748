"""The FastAPI application around one engine: routes, error bodies, API key, draining.

:func:`build_app` starts the engine when the application starts (in the server's event loop)
and shuts it down when the application stops. Every error leaves as an OpenAI-style body:
malformed JSON is a 400, a body of the wrong shape a 422 naming each field, an unknown route a
404, and an unexpected failure a 500 for that request only. ``/v1`` routes need
``Authorization: Bearer KEY`` when a key is set (compared in constant time); ``/health`` and
``/metrics`` stay open for probes and scrapers.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hwrun import __version__
from hwrun.serve.errors import APIError, error_body
from hwrun.serve.metrics import ServerMetrics
from hwrun.serve.routes import ServerState, router

log = logging.getLogger("hwrun.serve")


def build_app(
    engine: Any,
    *,
    api_key: str | None = None,
    model_name: str | None = None,
    shutdown_timeout: float = 30.0,
) -> FastAPI:
    """The server's application; ``shutdown_timeout`` bounds the engine's drain when the
    application stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        state.created = int(time.time())
        yield
        state.draining = True
        await engine.shutdown(drain_timeout=shutdown_timeout)

    app = FastAPI(title="hwrun", version=__version__, lifespan=lifespan)
    state = ServerState(
        engine=engine,
        metrics=ServerMetrics(engine),
        model_name=model_name or engine.model_name,
        api_key=api_key or None,
    )
    app.state.hwrun = state
    app.include_router(router)
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)
    app.add_middleware(Gate, state=state)
    return app


class Gate:
    """In front of every route: the API key and draining for ``/v1``, and the count of responses
    by endpoint and status. Plain ASGI, so streaming responses and disconnects pass untouched."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        status = 500

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            refusal = self._refusal(scope) if path.startswith("/v1") else None
            if refusal is not None:
                response = JSONResponse(refusal.body(), refusal.status, headers=refusal.headers)
                await response(scope, receive, counting_send)
            else:
                await self.app(scope, receive, counting_send)
        finally:
            if path.startswith("/v1"):
                endpoint = path if path in _ENDPOINTS else "other"
                self.state.metrics.http_requests.labels(endpoint=endpoint, status=status).inc()

    def _refusal(self, scope: Scope) -> APIError | None:
        if self.state.api_key and not _authorized(scope, self.state.api_key):
            return APIError(
                401,
                "missing or wrong API key: send the server's key as 'Authorization: Bearer KEY'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if self.state.draining:
            return APIError(
                503,
                "the server is shutting down and takes no new requests; retry on another replica",
                headers={"Retry-After": "5"},
            )
        return None


_ENDPOINTS = {"/v1/models", "/v1/completions", "/v1/chat/completions"}


def _authorized(scope: Scope, api_key: str) -> bool:
    header = dict(scope["headers"]).get(b"authorization", b"")
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(token.strip(), api_key.encode())


async def _api_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, APIError)
    return JSONResponse(err.body(), err.status, headers=err.headers)


async def _validation_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestValidationError)
    problems = list(err.errors())
    if any(p.get("type") == "json_invalid" for p in problems):
        detail = problems[0].get("ctx", {}).get("error", "")
        message = f"the request body is not valid JSON ({detail}); send a JSON object"
        return JSONResponse(error_body(400, message.replace(" ()", "")), 400)
    raw = next((p["input"] for p in problems if isinstance(p.get("input"), bytes)), None)
    if raw is not None and not _is_json(raw):
        return JSONResponse(
            error_body(400, "the request body is not valid JSON; send a JSON object"), 400
        )
    parts: dict[str, str] = {}
    for problem in problems:
        fields = [str(p) for p in problem.get("loc", ()) if p != "body"]
        received = problem.get("input")
        if not fields and isinstance(received, bytes):
            parts["body"] = "the request body must be sent with Content-Type: application/json"
        elif fields and problem.get("type") == "missing":
            parts[fields[0]] = f"{'.'.join(_member(fields))}: Field required"
        elif not fields and problem.get("type") == "missing":
            parts["body"] = "the request has no body; send a JSON object"
        elif not fields:
            parts["body"] = f"the request body must be a JSON object, got {_short(received)}"
        elif fields[0] in UNION_FIELDS:
            parts.setdefault(fields[0], f"{fields[0]} must be {UNION_FIELDS[fields[0]]}")
        else:
            where = ".".join(_member(fields))
            parts[where] = f"{where}: {problem.get('msg', 'invalid')} (got {_short(received)})"
    param = next(iter(parts))
    return JSONResponse(error_body(422, "; ".join(parts.values()), param=param), 422)


# Fields whose type is a union: pydantic reports every member's failure, one sentence is clearer.
UNION_FIELDS = {
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts",
}


def _member(fields: list[str]) -> list[str]:
    """The path without pydantic's union-member tags (``str``, ``list[int]``, ...)."""
    return [f for f in fields if not (f in {"str", "int", "float"} or f.startswith("list["))]


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except ValueError:
        return False
    return True


async def _http_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, StarletteHTTPException)
    message = str(err.detail)
    if err.status_code == 404:
        message = f"no route {request.method} {request.url.path}; the API is under /v1"
    elif err.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    return JSONResponse(error_body(err.status_code, message), err.status_code, headers=err.headers)


async def _unexpected_error(request: Request, err: Exception) -> JSONResponse:
    log.exception("request %s %s failed", request.method, request.url.path, exc_info=err)
    message = f"internal error while serving this request: {type(err).__name__}: {err}"
    return JSONResponse(error_body(500, message), 500)


def _short(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
