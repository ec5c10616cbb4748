"""How one request samples, as vLLM's ``SamplingParams`` shapes it."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_LOGPROBS = 20  # top-N logprobs per token (OpenAI's limit for top_logprobs)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling options of one request. ``temperature == 0`` is greedy.

    ``seed`` makes a request's samples reproducible and independent of what it is batched with
    (each request draws from its own generator). ``logprobs`` asks for the top-N logprobs of each
    generated token (the sampled token is always included); ``prompt_logprobs`` the same for the
    prompt tokens (the first prompt token has none).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        reasons = self.problems()
        if reasons:
            raise ValueError("invalid sampling parameters: " + "; ".join(reasons))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def problems(self) -> list[str]:
        """Every reason these parameters are out of range, each saying what is allowed."""
        reasons = []

        def number(name: str, value: object) -> bool:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or not math.isfinite(value):
                reasons.append(f"{name} must be a finite number, got {value!r}")
                return False
            return True

        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool):
            reasons.append(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        elif self.max_tokens < 1:
            reasons.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if number("temperature", self.temperature) and self.temperature < 0:
            reasons.append(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if number("top_p", self.top_p) and not 0 < self.top_p <= 1:
            reasons.append(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < -1:
            reasons.append(f"top_k must be an integer >= 1, or 0 / -1 for off, got {self.top_k!r}")
        if number("min_p", self.min_p) and not 0 <= self.min_p <= 1:
            reasons.append(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0
        ):
            reasons.append(f"seed must be a non-negative integer, got {self.seed!r}")
        if not all(isinstance(s, str) and s for s in self.stop):
            reasons.append(f"stop must be non-empty strings, got {list(self.stop)!r}")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            reasons.append(f"stop_token_ids must be token ids >= 0, got {self.stop_token_ids!r}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                reasons.append(f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {value!r}")
            elif value is not None and value > MAX_LOGPROBS:
                reasons.append(f"{name} must be at most {MAX_LOGPROBS}, got {value}")
        return reasons
