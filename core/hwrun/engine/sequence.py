"""One request's tokens and state as it moves through the engine.

A :class:`Sequence` holds every token known so far (prompt, then generated), how many of them
already have their KV in the cache (``num_computed_tokens``), the KV blocks it owns
(``block_table``), its sampling options with its own random generator, the logprobs collected
and the times of its life. The scheduler moves it between WAITING, RUNNING and FINISHED; only the
engine's own thread touches it.
"""

from __future__ import annotations

import enum
import time

import torch

from hwrun.engine.outputs import Logprobs, RequestMetrics
from hwrun.engine.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted: holds no KV blocks
    RUNNING = "running"  # holds KV blocks; scheduled each step until it finishes
    FINISHED = "finished"  # done (stop, length or abort); its blocks are freed


class Sequence:
    """A request's tokens and state. One sequence per request (``n == 1``)."""

    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        seed: int,
        prompt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.seq_id = seq_id
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt, then generated tokens
        self.num_prompt_tokens = len(prompt_token_ids)
        # Every output of the request carries the prompt's ids: one list shared by them all
        # (as vLLM's outputs share it), not a copy of 1K-128K ids per token generated.
        self._prompt_token_ids = list(prompt_token_ids)
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0  # leading positions whose KV is in the cache
        self.block_table: list[int] = []
        self.table_epoch = 0  # bumped when the blocks are freed (ScheduledChunk.table_epoch)
        self.block_hashes: list[bytes] = []  # prefix-cache keys of the leading full blocks
        self.seed = seed  # params.seed, or one the engine drew for an unseeded request
        self._generator: torch.Generator | None = None
        self.logprobs: list[Logprobs] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[Logprobs | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )
        self.text = ""  # detokenized output so far (stop strings already cut off)
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.metrics = RequestMetrics(arrival_time=arrival_time or time.monotonic())

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, request={self.request_id!r}, {self.status.value}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, "
            f"blocks={self.block_table})"
        )

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._prompt_token_ids

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some are still missing (one per prompt token)."""
        collected = self.prompt_logprobs
        return collected is not None and len(collected) < self.num_prompt_tokens

    def block_token_ids(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def generator(self, device: torch.device) -> torch.Generator:
        """This request's own random generator on ``device``, seeded once with ``seed``: its
        samples depend on its seed and its logits only, never on what it is batched with."""
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
        return self._generator

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
