"""The whole engine on a real (tiny, random) DeepseekV32 checkpoint through the reference ops:
batch-invariant mode, prefix caching, preemption, prompt logprobs."""

from __future__ import annotations

import time

import pytest
import torch

from hwrun import LLM, SamplingParams
from tests.engine.tiny_checkpoints import build_tiny_model, oracle_logits

VOCAB = 128


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine-model")
    return build_tiny_model(path, seed=11, index_topk=12, vocab_size=VOCAB)


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 48, (count,), generator=gen).tolist()
    return [torch.randint(2, VOCAB, (n,), generator=gen).tolist() for n in lengths]


def _llm(checkpoint, **flags) -> LLM:
    flags.setdefault("num_kv_tokens", 64 * 64)
    return LLM(model=str(checkpoint.path), platform="reference", **flags)


PARAMS = SamplingParams(max_tokens=5, temperature=0.8, seed=3, logprobs=3, prompt_logprobs=2)


def _logprob_record(output) -> tuple:
    completion = output.outputs[0]
    return (
        tuple(completion.token_ids),
        tuple(tuple(sorted(step.items())) for step in completion.logprobs),
        tuple(None if p is None else tuple(sorted(p.items())) for p in output.prompt_logprobs),
    )


def test_batch_invariant_mode_gives_identical_bits_alone_and_in_a_batch_of_32(checkpoint):
    llm = _llm(checkpoint, batch_invariant=True, max_num_batched_tokens=96)
    prompts = _prompts(32)
    alone = llm.generate(prompt_token_ids=[prompts[0]], sampling_params=PARAMS)[0]
    mixed_params = [PARAMS] + [
        SamplingParams(max_tokens=3 + i % 5, temperature=0.5 + (i % 3) / 2, seed=i, logprobs=1)
        for i in range(1, 32)
    ]
    batched = llm.generate(prompt_token_ids=prompts, sampling_params=mixed_params)[0]
    assert _logprob_record(alone) == _logprob_record(batched)


def test_batch_invariance_check_catches_a_batch_dependent_op(checkpoint):
    """Negative control: an op whose output depends on the batch size by one ulp-scale amount
    breaks bit equality, and the comparison above sees it."""
    llm = _llm(checkpoint, batch_invariant=True, max_num_batched_tokens=96)
    table = llm.engine.runner.model.ops
    experts = table["moe.experts"]

    def batch_dependent(x, *args, **kwargs):
        out = experts(x, *args, **kwargs)
        return out + 1e-6 * x.shape[0]

    prompts = _prompts(32)
    with table.replaced({"moe.experts": batch_dependent}):
        alone = llm.generate(prompt_token_ids=[prompts[0]], sampling_params=PARAMS)[0]
        batched = llm.generate(prompt_token_ids=prompts, sampling_params=PARAMS)[0]
    assert _logprob_record(alone) != _logprob_record(batched)


def test_prompt_logprobs_are_the_log_softmax_of_the_teacher_forced_logits(checkpoint):
    llm = _llm(checkpoint)
    prompt = _prompts(1, seed=5)[0]
    out = llm.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0),
    )[0]
    want = torch.log_softmax(oracle_logits(checkpoint, prompt, storage_rounding=True), dim=-1)
    assert out.prompt_logprobs[0] is None
    for position, entry in enumerate(out.prompt_logprobs[1:], start=1):
        token = prompt[position]
        assert abs(entry[token] - want[position - 1, token].item()) < 2e-2


def test_prefix_cache_skips_the_cached_blocks_of_a_repeated_long_prompt(checkpoint):
    llm = _llm(checkpoint, max_model_len=512)
    gen = torch.Generator().manual_seed(9)
    prompt = torch.randint(2, VOCAB, (300,), generator=gen).tolist()
    params = SamplingParams(max_tokens=2, temperature=0)
    start = time.perf_counter()
    first = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    cold = time.perf_counter() - start
    before = llm.engine.stats()
    start = time.perf_counter()
    second = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    warm = time.perf_counter() - start
    after = llm.engine.stats()
    # 300 tokens = 4 full blocks of 64 (the last, partial block is never cached); the stats
    # count tokens, as vLLM's prefix-cache metrics do
    assert after.prefix_cache_hits - before.prefix_cache_hits == 256
    assert second.metrics.num_cached_tokens == 256
    assert second.outputs[0].token_ids == first.outputs[0].token_ids
    print(f"prefill of 300 tokens: cold {cold * 1e3:.0f} ms, with 256 cached {warm * 1e3:.0f} ms")


def test_preemption_under_a_tiny_pool_finishes_every_request_with_the_same_tokens(checkpoint):
    prompts = _prompts(6, seed=2)
    params = SamplingParams(max_tokens=40, temperature=0)
    roomy = _llm(checkpoint, num_kv_tokens=64 * 64)
    want = [
        o.outputs[0].token_ids
        for o in roomy.generate(prompt_token_ids=prompts, sampling_params=params)
    ]
    tight = _llm(checkpoint, num_kv_tokens=3 * 64, max_model_len=128)
    got = tight.generate(prompt_token_ids=prompts, sampling_params=params)
    assert tight.engine.stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in got] == want
    assert tight.engine.stats().kv_blocks_used == 0
