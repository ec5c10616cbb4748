"""The engine over the fake runner: chunked prefill, prefix caching and preemption give exactly
the tokens of a plain run (any block-table bug changes the tokens), stop conditions, logprobs."""

import pytest
import torch

from hwrun.engine import sampler
from hwrun.engine.errors import PromptError
from hwrun.engine.sampling_params import SamplingParams

from .conftest import make_engine, run_all, tokens_of
from .fake_runner import FakeRunner, history_logits

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
SEEDED = [
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, seed=i, max_tokens=10) for i in range(7)
]


def reference_greedy(prompt: list[int], max_tokens: int, vocab_size: int = 50) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(torch.argmax(history_logits(tokens, vocab_size))))
    return tokens[len(prompt) :]


def reference_sampled(prompt: list[int], params: SamplingParams, vocab_size: int = 50):
    tokens, generator = list(prompt), torch.Generator().manual_seed(params.seed)
    for _ in range(params.max_tokens):
        logits = history_logits(tokens, vocab_size)
        tokens.append(sampler.sample_row(logits, params, generator))
    return tokens[len(prompt) :]


CONFIGS = {
    "plain": dict(enable_prefix_caching=False),
    "chunked": dict(max_num_batched_tokens=5, enable_prefix_caching=False),
    "prefix_cache": dict(enable_prefix_caching=True),
    "chunked_prefix_cache": dict(max_num_batched_tokens=7),
    "one_seq_at_a_time": dict(max_num_seqs=1),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_greedy_tokens_match_the_reference(name, prompts):
    outputs = run_all(make_engine(**CONFIGS[name]), prompts, GREEDY)
    assert tokens_of(outputs) == [reference_greedy(p, 12) for p in prompts]


@pytest.mark.parametrize("name", CONFIGS)
def test_seeded_samples_do_not_depend_on_the_batch(name, prompts):
    outputs = run_all(make_engine(**CONFIGS[name]), prompts, SEEDED)
    expected = [reference_sampled(p, params) for p, params in zip(prompts, SEEDED, strict=True)]
    assert tokens_of(outputs) == expected


def test_preemption_under_a_tiny_pool_finishes_with_the_same_tokens(prompts):
    # 12 blocks of 4 tokens: the longest request needs 9; several at once cannot fit.
    runner = FakeRunner(num_blocks=12, block_size=4)
    engine = make_engine(runner, max_num_batched_tokens=16)
    outputs = run_all(engine, prompts, GREEDY)
    assert engine.stats().num_preemptions > 0
    assert sum(out.metrics.num_preemptions for out in outputs) == engine.stats().num_preemptions
    assert tokens_of(outputs) == [reference_greedy(p, 12) for p in prompts]
    assert engine.stats().kv_blocks_used == 0


def test_preemption_keeps_seeded_samples(prompts):
    engine = make_engine(FakeRunner(num_blocks=12, block_size=4), max_num_batched_tokens=9)
    outputs = run_all(engine, prompts, SEEDED)
    assert engine.stats().num_preemptions > 0
    expected = [reference_sampled(p, params) for p, params in zip(prompts, SEEDED, strict=True)]
    assert tokens_of(outputs) == expected


def test_prefix_cache_hits_are_counted_and_blocks_reused():
    runner = FakeRunner(block_size=4)
    engine = make_engine(runner)
    prompt = list(range(1, 19))  # 18 tokens: 4 full blocks can be shared
    first = run_all(engine, [prompt], GREEDY)[0]
    assert first.metrics.num_cached_tokens == 0
    steps_before = len(runner.steps)
    engine.add_request("again", prompt, GREEDY)
    engine.step()
    chunk = runner.steps[steps_before][0]
    assert chunk.start == 16 and chunk.token_ids == prompt[16:]  # 16 tokens came from the cache
    stats = engine.stats()
    assert stats.prefix_cache_hits == 16
    assert stats.prefix_cache_queries == 2 * len(prompt)
    while engine.has_unfinished_requests():
        (out,) = engine.step()
    assert out.outputs[0].token_ids == first.outputs[0].token_ids
    assert out.metrics.num_cached_tokens == 16


def test_step_budget_and_max_num_seqs(prompts):
    runner = FakeRunner()
    engine = make_engine(runner, max_num_batched_tokens=6, max_num_seqs=3)
    run_all(engine, prompts, GREEDY)
    for chunks in runner.steps:
        assert sum(len(c.token_ids) for c in chunks) <= 6
        assert len(chunks) <= 3
    assert any(len(c.token_ids) == 6 and c.start > 0 for s in runner.steps for c in s)


def test_decodes_are_scheduled_before_prefill_chunks():
    runner = FakeRunner()
    engine = make_engine(runner, max_num_batched_tokens=4)
    engine.add_request("a", [1, 2], GREEDY)
    engine.step()  # a's prefill
    engine.add_request("b", list(range(30)), GREEDY)
    for _ in range(3):
        engine.step()
        decode, chunk = runner.steps[-1]
        assert decode.seq_id == 0 and len(decode.token_ids) == 1
        assert len(chunk.token_ids) == 3  # b's prefill takes what is left of the budget


def test_eos_stops_unless_ignored():
    prompt = [3, 4, 5]
    greedy = reference_greedy(prompt, 6)
    eos = greedy[2]
    runner = FakeRunner(eos_token_id=eos)
    (out,) = run_all(make_engine(runner), [prompt], SamplingParams(temperature=0, max_tokens=6))
    assert out.outputs[0].token_ids == greedy[: greedy.index(eos) + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason is None
    ignored = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    (out,) = run_all(make_engine(FakeRunner(eos_token_id=eos)), [prompt], ignored)
    assert out.outputs[0].token_ids == greedy and out.outputs[0].finish_reason == "length"


def test_stop_token_ids_and_max_model_len():
    prompt = [3, 4, 5]
    greedy = reference_greedy(prompt, 6)
    params = SamplingParams(temperature=0, max_tokens=6, stop_token_ids=(greedy[3],))
    (out,) = run_all(make_engine(), [prompt], params)
    first = greedy.index(greedy[3])
    assert out.outputs[0].token_ids == greedy[: first + 1]
    assert out.outputs[0].stop_reason == greedy[3]
    (out,) = run_all(make_engine(max_model_len=7), [prompt], GREEDY)
    assert out.outputs[0].token_ids == greedy[:4] and out.outputs[0].finish_reason == "length"


def test_logprobs_include_the_sampled_token_and_the_top_n():
    prompt = [1, 2, 3]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=5, logprobs=3)
    (out,) = run_all(make_engine(), [prompt], params)
    completion = out.outputs[0]
    assert len(completion.logprobs) == 5
    history = list(prompt)
    for token, entry in zip(completion.token_ids, completion.logprobs, strict=True):
        expected = torch.log_softmax(history_logits(history, 50), dim=-1)
        assert next(iter(entry)) == token
        top = torch.topk(expected, 3).indices.tolist()
        assert set(entry) == {token, *top}
        for tid, value in entry.items():
            assert value == pytest.approx(float(expected[tid]), abs=1e-6)
        history.append(token)


@pytest.mark.parametrize("budget", [64, 4])
def test_prompt_logprobs_are_the_log_softmax_of_the_prompt_logits(budget):
    prompt = [(5 * i + 1) % 50 for i in range(11)]
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2)
    engine = make_engine(max_num_batched_tokens=budget)
    run_all(engine, [prompt], GREEDY)  # the same prompt cached: must not skip prompt logprobs
    (out,) = run_all(engine, [prompt], params)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for i in range(1, len(prompt)):
        expected = torch.log_softmax(history_logits(prompt[:i], 50), dim=-1)
        entry = out.prompt_logprobs[i]
        assert next(iter(entry)) == prompt[i]
        assert set(entry) == {prompt[i], *torch.topk(expected, 2).indices.tolist()}
        assert entry[prompt[i]] == pytest.approx(float(expected[prompt[i]]), abs=1e-6)


def test_prompt_logprobs_survive_preemption(prompts):
    params = [SamplingParams(temperature=0, max_tokens=12, prompt_logprobs=0) for _ in prompts]
    engine = make_engine(FakeRunner(num_blocks=12, block_size=4), max_num_batched_tokens=5)
    outputs = run_all(engine, prompts, params)
    assert engine.stats().num_preemptions > 0
    for prompt, out in zip(prompts, outputs, strict=True):
        assert len(out.prompt_logprobs) == len(prompt)
        for i in range(1, len(prompt)):
            expected = torch.log_softmax(history_logits(prompt[:i], 50), dim=-1)
            assert out.prompt_logprobs[i] == pytest.approx({prompt[i]: float(expected[prompt[i]])})


def test_bad_prompts_are_refused_with_a_reason():
    engine = make_engine(max_model_len=10)
    with pytest.raises(PromptError, match="empty"):
        engine.add_request("a", [], GREEDY)
    with pytest.raises(PromptError, match="no tokenizer"):
        engine.add_request("a", "hello", GREEDY)
    with pytest.raises(PromptError, match="outside the vocabulary"):
        engine.add_request("a", [1, 50], GREEDY)
    with pytest.raises(PromptError, match="max_model_len is 10"):
        engine.add_request("a", list(range(10)), GREEDY)
    with pytest.raises(PromptError, match="stop strings need a tokenizer"):
        engine.add_request("a", [1], SamplingParams(stop=("x",)))
    engine.add_request("a", [1], GREEDY)
    with pytest.raises(PromptError, match="already in use"):
        engine.add_request("a", [1], GREEDY)


def test_max_model_len_is_capped_by_the_pool():
    engine = make_engine(FakeRunner(num_blocks=3, block_size=4, max_model_len=100))
    assert engine.max_model_len == 12


def test_abort_frees_blocks_and_reports_abort():
    engine = make_engine()
    engine.add_request("a", list(range(20)), GREEDY)
    engine.step()
    assert engine.stats().kv_blocks_used > 0
    out = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert engine.stats().kv_blocks_used == 0 and not engine.has_unfinished_requests()
    assert engine.abort_request("a") is None


def test_stats_count_tokens(prompts):
    engine = make_engine()
    run_all(engine, prompts, GREEDY)
    stats = engine.stats()
    assert stats.prompt_tokens_total == sum(map(len, prompts))
    assert stats.generation_tokens_total == 12 * len(prompts)
    assert stats.num_running == stats.num_waiting == 0
