"""A small engine with the AsyncEngine API, so the HTTP layer is tested on its own.

It "generates" letters from a seeded generator, one token per step of ``step_s`` seconds, holds
KV blocks while a request runs (one per ``BLOCK_SIZE`` tokens) and frees them when the request
finishes or is aborted, bounds the queue, and fails on purpose for a prompt containing ``FAIL``.
The tests against the real engine (tests/serve/test_real_engine.py) check the same behaviour on
the embedded model.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator

from hwrun.engine.errors import EngineDeadError, PromptError, QueueFullError
from hwrun.engine.op_table import OpChoice
from hwrun.engine.outputs import CompletionOutput, RequestOutput
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.stats import EngineStats

BLOCK_SIZE = 16
OFFSET = 3  # ids 0..2 are special: 0 pad, 1 bos, 2 eos; byte b is id b + OFFSET
LETTERS = [ord(c) + OFFSET for c in "abcdefghijklmnopqrstuvwxyz"]


class FakeTokenizer:
    """Bytes as tokens; a chat template of ``<role>content`` lines."""

    eos_token_id = 2
    has_chat_template = True

    def encode(self, text: str) -> list[int]:
        return [b + OFFSET for b in text.encode("utf-8")]

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t - OFFSET for t in token_ids if t >= OFFSET).decode("utf-8", "replace")

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return self.encode(text + "<assistant>")


def _distribution(last: int) -> dict[int, float]:
    """Log-probabilities over the letters, peaked after the previous token."""
    scores = {t: -((t - last) % 26) / 4 for t in LETTERS}
    norm = math.log(sum(math.exp(s) for s in scores.values()))
    return {t: s - norm for t, s in scores.items()}


class FakeAsyncEngine:
    def __init__(
        self,
        *,
        tokenizer: FakeTokenizer | None = None,
        max_model_len: int = 256,
        max_num_seqs: int = 64,
        max_queued: int | None = None,
        step_s: float = 0.002,
        kv_blocks_total: int = 4096,
    ):
        self.tokenizer = tokenizer
        self.model_name = "hwrun-default"
        self.max_model_len = max_model_len
        self.vocab_size = 256 + OFFSET
        self.op_table = [
            OpChoice("indexer.topk", "triton", "nvidia", False),
            OpChoice("moe.experts", "reference", "reference", True),
        ]
        self.max_num_seqs = max_num_seqs
        self.max_queued = max_queued
        self.step_s = step_s
        self.kv_blocks_total = kv_blocks_total
        self.kv_blocks: dict[str, int] = {}
        self.running: set[str] = set()
        self.waiting = 0
        self.aborted: list[str] = []
        self.finished: list[str] = []
        self.submitted: list[str] = []
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.started = False
        self.shut_down = False
        self.dead = False  # set by a test: every request then fails as on a dead AsyncEngine
        self._slots: asyncio.Semaphore | None = None

    async def start(self) -> None:
        self._slots = asyncio.Semaphore(self.max_num_seqs)
        self.started = True

    async def shutdown(self, drain_timeout: float = 30.0) -> None:
        self.shut_down = True

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.running),
            num_waiting=self.waiting,
            kv_blocks_total=self.kv_blocks_total,
            kv_blocks_used=sum(self.kv_blocks.values()),
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=0,
            prompt_tokens_total=self.prompt_tokens,
            generation_tokens_total=self.generation_tokens,
        )

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise PromptError("text prompt for a model without a tokenizer")
            prompt = self.tokenizer.encode(prompt)
        if self.dead:
            raise EngineDeadError("the engine's step loop failed: RuntimeError('injected')")
        if len(prompt) >= self.max_model_len:
            raise PromptError(f"prompt of {len(prompt)} tokens >= max_model_len")
        if self.shut_down or (self.max_queued is not None and self.waiting >= self.max_queued):
            raise QueueFullError(f"{self.waiting} requests waiting")
        assert self._slots is not None, "start() the engine first"
        self.submitted.append(request_id)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running.add(request_id)
        self.prompt_tokens += len(prompt)
        rng = random.Random(params.seed)
        tokens: list[int] = []
        logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        prompt_logprobs = None
        if params.prompt_logprobs is not None:
            prompt_logprobs = [None] + [{t: -1.0} for t in prompt[1:]]
        finished = False
        try:
            while True:
                self.kv_blocks[request_id] = -(-(len(prompt) + len(tokens) + 1) // BLOCK_SIZE)
                await asyncio.sleep(self.step_s)
                last = tokens[-1] if tokens else prompt[-1]
                dist = _distribution(last)
                if params.greedy:
                    token = max(dist, key=dist.get)
                else:
                    token = rng.choices(list(dist), weights=[math.exp(v) for v in dist.values()])[0]
                if self.tokenizer and b"FAIL" in bytes(t - OFFSET for t in prompt if t >= OFFSET):
                    raise RuntimeError("injected failure")
                tokens.append(token)
                self.generation_tokens += 1
                if logprobs is not None:
                    ranked = sorted(dist.items(), key=lambda kv: -kv[1])[: params.logprobs]
                    logprobs.append({token: dist[token], **dict(ranked)})
                text = self.tokenizer.decode(tokens) if self.tokenizer else ""
                reason, stop = None, None
                for s in params.stop:
                    if s in text:
                        text, reason, stop = text[: text.index(s)], "stop", s
                if reason is None and len(tokens) >= params.max_tokens:
                    reason = "length"
                finished = reason is not None
                completion = CompletionOutput(
                    0, list(tokens), text, list(logprobs) if logprobs is not None else None,
                    reason, stop,
                )  # fmt: skip
                yield RequestOutput(
                    request_id, None, list(prompt), prompt_logprobs, [completion], finished
                )
                if finished:
                    self.finished.append(request_id)
                    return
        finally:
            self.running.discard(request_id)
            self.kv_blocks.pop(request_id, None)
            self._slots.release()
            if not finished:
                self.aborted.append(request_id)
