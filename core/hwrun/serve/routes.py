"""The endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/health``,
``/metrics``.

A handler checks the request (model, fields, prompts), turns it into engine requests, and
answers with the whole response or an SSE stream. While the client waits, its disconnect cancels
the work: the engine requests are aborted and their KV blocks freed.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hwrun.serve.chat import ChatResponder
from hwrun.serve.completions import CompletionResponder
from hwrun.serve.deltas import SSE_DONE, sse
from hwrun.serve.errors import APIError
from hwrun.serve.metrics import CONTENT_TYPE, ServerMetrics
from hwrun.serve.prompts import TokenText, chat_prompt, completion_prompts
from hwrun.serve.protocol import ChatCompletionRequest, CompletionRequest
from hwrun.serve.streams import (
    ENGINE_DEAD,
    ClientDisconnected,
    EngineRequest,
    RequestGroup,
    until_disconnected,
)

CLIENT_CLOSED = 499  # nginx's status for a request whose client went away (never sent)

router = APIRouter()


@dataclass
class ServerState:
    """What every handler reads: the engine, its metrics, and the name it is served under."""

    engine: Any
    metrics: ServerMetrics
    model_name: str
    api_key: str | None = None
    draining: bool = False
    engine_failure: str | None = None  # set when a request found the engine dead
    created: int = 0


def state_of(request: Request) -> ServerState:
    return request.app.state.hwrun


@router.get("/health")
async def health(request: Request) -> Response:
    state = state_of(request)
    if state.engine_failure:
        return JSONResponse({"status": "engine dead", "error": state.engine_failure}, 503)
    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    return {"object": "list", "data": [_model_card(state_of(request))]}


@router.get("/v1/models/{model:path}")
async def get_model(model: str, request: Request) -> dict:
    state = state_of(request)
    _check_model(state, model)
    return _model_card(state)


@router.post("/v1/completions")
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    state = state_of(request)
    engine = state.engine
    _check_model(state, body.model)
    body.check_common()
    prompts = completion_prompts(
        body.prompt, engine.tokenizer, engine.vocab_size, engine.max_model_len
    )
    tokens = TokenText(engine.tokenizer, body.return_tokens_as_token_ids)
    responder = CompletionResponder(body, prompts, tokens, state.model_name)
    requests = responder.engine_requests(engine.max_model_len)
    return await _respond(request, state, responder, requests, body.stream)


@router.post("/v1/chat/completions")
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    state = state_of(request)
    engine = state.engine
    _check_model(state, body.model)
    body.check_common()
    prompt = chat_prompt(
        body.message_dicts(), engine.tokenizer, engine.vocab_size, engine.max_model_len
    )
    tokens = TokenText(engine.tokenizer, body.return_tokens_as_token_ids)
    responder = ChatResponder(body, prompt, tokens, state.model_name)
    requests = responder.engine_requests(engine.max_model_len)
    return await _respond(request, state, responder, requests, body.stream)


async def _respond(
    request: Request,
    state: ServerState,
    responder: CompletionResponder | ChatResponder,
    requests: list[EngineRequest],
    stream: bool,
) -> Response:
    group = RequestGroup(state.engine, state.metrics, requests)
    try:
        await until_disconnected(request, group.start())
    except ClientDisconnected:
        await group.aclose()
        return Response(status_code=CLIENT_CLOSED)
    except APIError as err:
        _note_engine_death(state, err)
        raise
    if stream:
        return StreamingResponse(
            _events(state, responder, group),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        finals = await until_disconnected(request, group.final_outputs())
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    except APIError as err:
        _note_engine_death(state, err)
        raise
    finally:
        await group.aclose()
    return JSONResponse(responder.response(finals))


async def _events(
    state: ServerState, responder: CompletionResponder | ChatResponder, group: RequestGroup
) -> AsyncIterator[str]:
    """The SSE stream; an engine failure mid-stream becomes an error event, then [DONE]. When the
    client disconnects Starlette cancels this generator: the group is closed shielded, so the
    engine requests are aborted even under that cancellation."""
    try:
        async for event in responder.stream(group):
            yield event
    except APIError as err:
        _note_engine_death(state, err)
        yield sse(json.dumps(err.body()))
        yield SSE_DONE
    finally:
        with anyio.CancelScope(shield=True):
            await group.aclose()


def _note_engine_death(state: ServerState, err: APIError) -> None:
    """A dead engine fails every request from now on: /health says so, for the orchestrator."""
    if err.code == ENGINE_DEAD:
        state.engine_failure = err.message


def _check_model(state: ServerState, model: str) -> None:
    if model != state.model_name:
        raise APIError(
            404,
            f"the model {model!r} does not exist on this server; it serves "
            f"{state.model_name!r} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def _model_card(state: ServerState) -> dict:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created or int(time.time()),
        "owned_by": "hwrun",
        "max_model_len": state.engine.max_model_len,
    }
