"""``/v1/completions`` responses: the whole response, or its SSE chunks.

Choice ``i`` of prompt ``p`` has index ``p * n + i``. With ``logprobs`` each choice carries the
legacy block (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``); with ``echo`` the
prompt's text comes first and, with logprobs, the prompt tokens' logprobs, the first one null (as
the OpenAI legacy API defines).
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
from hwrun.serve.protocol import DEFAULT_COMPLETION_MAX_TOKENS, CompletionRequest
from hwrun.serve.streams import EngineRequest, RequestGroup


class CompletionResponder:
    """The responses of one completion request."""

    def __init__(
        self, request: CompletionRequest, prompts: list[Prompt], tokens: TokenText, model: str
    ):
        self.request = request
        self.prompts = prompts
        self.tokens = tokens
        self.model = model
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def engine_requests(self, max_model_len: int) -> list[EngineRequest]:
        request = self.request
        want_prompt_logprobs = request.echo and request.logprobs is not None
        out = []
        for p, prompt in enumerate(self.prompts):
            max_tokens = max_tokens_for(
                request.max_tokens,
                DEFAULT_COMPLETION_MAX_TOKENS,
                len(prompt.token_ids),
                max_model_len,
            )
            for i in range(request.n):
                index = p * request.n + i
                params = request.sampling_params(
                    max_tokens=max_tokens,
                    seed=request.choice_seed(i),
                    logprobs=request.logprobs,
                    prompt_logprobs=request.logprobs if want_prompt_logprobs else None,
                )
                out.append(EngineRequest(index, p, prompt.token_ids, params, f"{self.id}-{index}"))
        return out

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        choices = []
        for index, output in enumerate(finals):
            completion = output.outputs[0]
            prompt = self.prompts[index // self.request.n]
            text = completion.text
            choice: dict[str, Any] = {"index": index}
            logprobs = None
            if self.request.echo:
                prompt_text = self._prompt_text(prompt)
                text = prompt_text + text
            if self.request.logprobs is not None:
                echo_of = output if self.request.echo else None
                logprobs = self._logprobs(
                    completion.token_ids, completion.logprobs or [], echo_of, prompt
                )
            choice.update(
                text=text,
                logprobs=logprobs,
                finish_reason=completion.finish_reason,
                stop_reason=completion.stop_reason,
            )
            if self.request.return_token_ids:
                choice.update(prompt_token_ids=prompt.token_ids, token_ids=completion.token_ids)
            choices.append(choice)
        completion_tokens = sum(len(o.outputs[0].token_ids) for o in finals)
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._usage(completion_tokens),
        }

    async def stream(self, group: RequestGroup) -> AsyncIterator[str]:
        """The SSE events: a chunk per new piece of a choice, usage if asked, then [DONE]."""
        deltas = Deltas()
        async for index, output in group.outputs():
            delta = deltas.next(index, output)
            prompt = self.prompts[index // self.request.n]
            text = delta.text
            echo_logprobs = None
            if delta.first and self.request.echo:
                text = self._prompt_text(prompt) + text
            if not (text or delta.token_ids or delta.finish_reason or delta.first):
                continue
            logprobs = None
            if self.request.logprobs is not None:
                offset = deltas.sent_text[index] - len(delta.text)
                if delta.first and self.request.echo:
                    echo_logprobs = output
                    offset = 0
                logprobs = self._logprobs(
                    delta.token_ids, delta.logprobs or [], echo_logprobs, prompt, offset
                )
            choice: dict[str, Any] = {
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": delta.finish_reason,
                "stop_reason": delta.stop_reason,
            }
            if self.request.return_token_ids:
                choice["token_ids"] = delta.token_ids
                if delta.first:
                    choice["prompt_token_ids"] = prompt.token_ids
            yield sse(json.dumps(self._chunk([choice])))
        if self.request.stream_options and self.request.stream_options.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk["usage"] = self._usage(deltas.completion_tokens())
            yield sse(json.dumps(usage_chunk))
        yield SSE_DONE

    def _chunk(self, choices: list[dict]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def _prompt_text(self, prompt: Prompt) -> str:
        return prompt.text if prompt.text is not None else self.tokens.text(prompt.token_ids)

    def _logprobs(
        self,
        token_ids: list[int],
        logprobs: list[Logprobs],
        echo_of: RequestOutput | None,
        prompt: Prompt,
        offset: int = 0,
    ) -> dict[str, list]:
        """The legacy logprobs block; ``echo_of`` set: the prompt's tokens come first."""
        ids: list[int] = []
        per_token: list[Logprobs | None] = []
        if echo_of is not None:
            ids += prompt.token_ids
            per_token += echo_of.prompt_logprobs or [None] * len(prompt.token_ids)
        ids += token_ids
        per_token += logprobs
        block: dict[str, list] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for token_id, entry in zip(ids, per_token, strict=True):
            token = self.tokens.token(token_id)
            block["tokens"].append(token)
            block["text_offset"].append(offset)
            offset += len(token)
            if entry is None:
                block["token_logprobs"].append(None)
                block["top_logprobs"].append(None)
            else:
                block["token_logprobs"].append(entry.get(token_id))
                block["top_logprobs"].append({self.tokens.token(t): lp for t, lp in entry.items()})
        return block
