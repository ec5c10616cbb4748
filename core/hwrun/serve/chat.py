"""``/v1/chat/completions`` responses: the whole response, or its SSE chunks.

The messages go through the model's chat template (one prompt); each of the ``n`` choices is one
engine request. Streaming sends the assistant role in each choice's first chunk, then content
deltas; ``logprobs`` / ``top_logprobs`` give the chat form (``content`` entries with ``token``,
``logprob``, ``bytes`` and the ``top_logprobs`` most likely alternatives).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from hwrun.engine.outputs import Logprobs, RequestOutput
from hwrun.serve.deltas import SSE_DONE, Deltas, sse
from hwrun.serve.prompts import Prompt, TokenText, max_tokens_for
from hwrun.serve.protocol import ChatCompletionRequest
from hwrun.serve.streams import EngineRequest, RequestGroup


class ChatResponder:
    """The responses of one chat request."""

    def __init__(
        self, request: ChatCompletionRequest, prompt: Prompt, tokens: TokenText, model: str
    ):
        self.request = request
        self.prompt = prompt
        self.tokens = tokens
        self.model = model
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def engine_requests(self, max_model_len: int) -> list[EngineRequest]:
        request = self.request
        max_tokens = max_tokens_for(
            request.requested_max_tokens, None, len(self.prompt.token_ids), max_model_len
        )
        return [
            EngineRequest(
                i,
                0,
                self.prompt.token_ids,
                request.sampling_params(
                    max_tokens=max_tokens,
                    seed=request.choice_seed(i),
                    logprobs=request.engine_logprobs,
                ),
                f"{self.id}-{i}",
            )
            for i in range(request.n)
        ]

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        choices = []
        for index, output in enumerate(finals):
            completion = output.outputs[0]
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": completion.text},
                "logprobs": self._logprobs(completion.token_ids, completion.logprobs),
                "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason,
            }
            if self.request.return_token_ids:
                choice["token_ids"] = completion.token_ids
            choices.append(choice)
        completion_tokens = sum(len(o.outputs[0].token_ids) for o in finals)
        body = self._envelope("chat.completion", choices)
        body["usage"] = self._usage(completion_tokens)
        if self.request.return_token_ids:
            body["prompt_token_ids"] = self.prompt.token_ids
        return body

    async def stream(self, group: RequestGroup) -> AsyncIterator[str]:
        deltas = Deltas()
        async for index, output in group.outputs():
            delta = deltas.next(index, output)
            if not (delta.text or delta.token_ids or delta.finish_reason or delta.first):
                continue
            message: dict[str, Any] = {"content": delta.text}
            if delta.first:
                message["role"] = "assistant"
            choice: dict[str, Any] = {
                "index": index,
                "delta": message,
                "logprobs": self._logprobs(delta.token_ids, delta.logprobs),
                "finish_reason": delta.finish_reason,
                "stop_reason": delta.stop_reason,
            }
            if self.request.return_token_ids:
                choice["token_ids"] = delta.token_ids
            yield sse(json.dumps(self._envelope("chat.completion.chunk", [choice])))
        if self.request.stream_options and self.request.stream_options.include_usage:
            usage_chunk = self._envelope("chat.completion.chunk", [])
            usage_chunk["usage"] = self._usage(deltas.completion_tokens())
            yield sse(json.dumps(usage_chunk))
        yield SSE_DONE

    def _envelope(self, kind: str, choices: list[dict]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        prompt_tokens = len(self.prompt.token_ids)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _logprobs(
        self, token_ids: list[int], logprobs: list[Logprobs] | None
    ) -> dict[str, list] | None:
        if not self.request.logprobs or logprobs is None:
            return None
        top_n = self.request.top_logprobs or 0
        content = []
        for token_id, entry in zip(token_ids, logprobs, strict=True):
            ranked = sorted(entry.items(), key=lambda item: -item[1])[:top_n]
            content.append(
                {
                    **self._token(token_id, entry[token_id]),
                    "top_logprobs": [self._token(t, lp) for t, lp in ranked],
                }
            )
        return {"content": content}

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        token = self.tokens.token(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
