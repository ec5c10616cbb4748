"""What the engine returns for a request (vLLM's ``RequestOutput`` shape)."""

from __future__ import annotations

from dataclasses import dataclass, field

# One position's logprobs: token id -> logprob, the chosen (or actual prompt) token first, then
# the top-N in descending order.
Logprobs = dict[int, float]


@dataclass
class CompletionOutput:
    """One generated sequence, cumulative so far."""

    index: int
    token_ids: list[int]
    text: str  # "" when the model has no tokenizer
    logprobs: list[Logprobs] | None  # one entry per generated token when asked for
    finish_reason: str | None  # None while running; "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it


@dataclass
class RequestMetrics:
    """Times (time.monotonic seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0

    def snapshot(self) -> RequestMetrics:
        """A copy, as an output keeps them (0.45 us; copy.copy took 1.5, dataclasses.replace
        4x that: 64 outputs a decode step)."""
        return RequestMetrics(**vars(self))


@dataclass
class RequestOutput:
    """A request's state after a step: the prompt, its outputs so far, whether it is done."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[Logprobs | None] | None  # the first prompt token has None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = field(default=None)
