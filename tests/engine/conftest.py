"""Helpers for the engine tests: an engine over the fake runner, run to completion."""

from __future__ import annotations

import pytest

from hwrun.engine.config import EngineConfig
from hwrun.engine.llm_engine import LLMEngine
from hwrun.engine.outputs import RequestOutput
from hwrun.engine.sampling_params import SamplingParams

from .fake_runner import FakeRunner


def make_engine(runner: FakeRunner | None = None, tokenizer=None, **config) -> LLMEngine:
    return LLMEngine(EngineConfig(**config), runner=runner or FakeRunner(), tokenizer=tokenizer)


def run_all(
    engine: LLMEngine, prompts: list, params: SamplingParams | list[SamplingParams]
) -> list[RequestOutput]:
    """Add every prompt, step until done; final outputs in prompt order."""
    if not isinstance(params, list):
        params = [params] * len(prompts)
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    final: dict[str, RequestOutput] = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    assert not engine.has_unfinished_requests(), "engine did not finish"
    return [final[str(i)] for i in range(len(prompts))]


def tokens_of(outputs: list[RequestOutput]) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


@pytest.fixture
def prompts() -> list[list[int]]:
    """Prompts of mixed lengths, some sharing long prefixes (for the prefix cache)."""
    shared = [(7 * i + 3) % 50 for i in range(13)]
    return [
        [*shared, 1, 2],
        [5, 9, 11],
        [*shared, 4],
        [(3 * i) % 50 for i in range(21)],
        shared,
        [42],
        [*shared, 1, 2, 8, 8, 8, 1],
    ]
