"""The request bodies of the OpenAI API as hwrun accepts them, and their sampling parameters.

Pydantic checks the shape (a wrong type or a missing field is a 422 naming the field); the ranges
are :meth:`SamplingParams.problems`'s, checked once there (an out-of-range value is a 400 with
every problem listed). Fields a client may send that hwrun does not implement are accepted at
their neutral value and refused otherwise, so no request is silently answered as something else.
Unknown fields (``user``, ``metadata``, ...) are ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from hwrun.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from hwrun.serve.errors import APIError, bad_request

MAX_N = 16  # choices per prompt
DEFAULT_COMPLETION_MAX_TOKENS = 16  # the legacy API's default


class StreamOptions(BaseModel):
    include_usage: bool = False


class _GenerationRequest(BaseModel):
    """What completions and chat share: the model, sampling, streaming."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's extensions: tokens as "token_id:N" in logprobs, and the token ids in each choice.
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool = False
    # Accepted at their neutral value only.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> list[str]:
        """Fields set to something hwrun does not implement, each saying what to send instead."""
        reasons = []
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                reasons.append(f"{name} is not supported by hwrun serve; omit it or send 0")
        if self.repetition_penalty not in (None, 1, 1.0):
            reasons.append("repetition_penalty is not supported by hwrun serve; omit it or send 1")
        if self.logit_bias:
            reasons.append("logit_bias is not supported by hwrun serve; omit it")
        return reasons

    def check_common(self) -> None:
        reasons = self.unsupported()
        if not 1 <= self.n <= MAX_N:
            reasons.append(f"n must be between 1 and {MAX_N}, got {self.n}")
        if self.stream_options is not None and not self.stream:
            reasons.append("stream_options is only allowed with stream=true")
        if reasons:
            raise bad_request("; ".join(reasons), param=_first_param(reasons))

    def sampling_params(
        self,
        *,
        max_tokens: int,
        seed: int | None,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """The engine's parameters for one choice; out-of-range values are a 400 listing all."""
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=0 if self.top_k is None else self.top_k,
                min_p=0.0 if self.min_p is None else self.min_p,
                seed=seed,
                stop=tuple([self.stop] if isinstance(self.stop, str) else self.stop or ()),
                stop_token_ids=tuple(self.stop_token_ids or ()),
                ignore_eos=self.ignore_eos,
                logprobs=logprobs,
                prompt_logprobs=prompt_logprobs,
            )
        except ValueError as err:
            message = str(err).removeprefix("invalid sampling parameters: ")
            raise APIError(400, message, param=_first_param([message])) from None

    def choice_seed(self, choice: int) -> int | None:
        """Choice ``i`` of ``n`` samples with ``seed + i``: reproducible, and not n copies."""
        if self.seed is None or not isinstance(self.seed, int) or self.seed < 0:
            return self.seed
        return self.seed + choice


class CompletionRequest(_GenerationRequest):
    """``POST /v1/completions``: one or several prompts, as text or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[str]:
        reasons = super().unsupported()
        if self.best_of is not None and self.best_of != self.n:
            reasons.append("best_of is not supported by hwrun serve; omit it (or send best_of = n)")
        if self.suffix:
            reasons.append("suffix (insertion) is not supported by hwrun serve; omit it")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            reasons.append(
                f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs}"
            )
        return reasons


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(_GenerationRequest):
    """``POST /v1/chat/completions``: messages rendered by the model's chat template."""

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None

    def unsupported(self) -> list[str]:
        reasons = super().unsupported()
        if self.tools:
            reasons.append("tools (function calling) are not supported by hwrun serve; omit them")
        if self.tool_choice not in (None, "none", "auto"):
            reasons.append("tool_choice is not supported by hwrun serve; omit it")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            reasons.append(
                "response_format other than text (JSON mode, schemas) is not supported by hwrun "
                "serve; omit it"
            )
        if self.top_logprobs is not None:
            if not self.logprobs:
                reasons.append("top_logprobs needs logprobs=true")
            if not 0 <= self.top_logprobs <= MAX_LOGPROBS:
                reasons.append(
                    f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], "
                    f"got {self.top_logprobs}"
                )
        if not self.messages:
            reasons.append("messages is empty; send at least one message")
        return reasons

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens

    @property
    def engine_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def message_dicts(self) -> list[dict]:
        """The messages as the chat template takes them: text content only."""
        messages = []
        for i, message in enumerate(self.messages):
            content = message.content
            if isinstance(content, list):
                kinds = sorted({part.type for part in content if part.type != "text"})
                if kinds:
                    raise bad_request(
                        f"messages[{i}].content has parts of type {', '.join(kinds)}; hwrun's "
                        "models take text only: send text parts or a string",
                        param=f"messages[{i}].content",
                    )
                content = "".join(part.text or "" for part in content)
            entry = {"role": message.role, "content": content or ""}
            if message.name:
                entry["name"] = message.name
            messages.append(entry)
        return messages


def _first_param(reasons: list[str]) -> str | None:
    """The field the first reason is about (each reason starts with the field's name)."""
    if not reasons:
        return None
    word = reasons[0].split(" ", 1)[0]
    return word if word.replace("_", "").isalpha() else None
