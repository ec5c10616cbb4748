"""Async scheduling: a step of decodes launches the next step before its own tokens
reach the host (the runner takes them as a device tensor). It must give exactly the tokens of
the synchronous engine: a sequence that ends where no one could foresee it (eos, a stop token)
has its row of the step launched ahead dropped, one that ends by length is not launched ahead,
an abort or an arrival between steps is honoured, the books balance."""

from __future__ import annotations

import pytest
import torch

from hwrun.engine.config import EngineConfig
from hwrun.engine.llm_engine import LLMEngine
from hwrun.engine.sampling_params import SamplingParams

from .conftest import make_engine, run_all, tokens_of
from .fake_runner import FakeRunner
from .test_engine_properties import check_books
from .test_llm_engine import reference_greedy


def _both(prompts, params, **runner_options):
    """Final outputs and the runner, synchronous then with async scheduling."""
    runs = []
    for async_scheduling in (False, True):
        runner = FakeRunner(max_model_len=10**6, **runner_options)
        engine = make_engine(runner, async_scheduling=async_scheduling)
        runs.append((run_all(engine, prompts, params), runner))
    return runs


def test_same_tokens_as_the_synchronous_engine_and_steps_launched_ahead(prompts):
    greedy = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True)
    (sync, sync_runner), (ahead, ahead_runner) = _both(prompts, greedy)
    assert tokens_of(ahead) == tokens_of(sync)
    assert tokens_of(ahead) == [reference_greedy(p, 9) for p in prompts]
    assert sync_runner.ahead_steps == 0 and ahead_runner.ahead_steps > 0
    # Ends by length are foreseen: no step computes a position past a request's last token.
    assert len(ahead_runner.steps) == len(sync_runner.steps)


def test_an_unforeseen_eos_drops_its_row_of_the_step_launched_ahead():
    prompt = [3, 1, 4, 1, 5]
    free_run = reference_greedy(prompt, 12)
    eos = free_run[4]  # the fifth token ends the request
    params = SamplingParams(temperature=0, max_tokens=12)
    (sync, _), (ahead, runner) = _both([prompt, [2, 7]], params, eos_token_id=eos)
    assert tokens_of(ahead) == tokens_of(sync)
    assert ahead[0].outputs[0].token_ids == free_run[: free_run.index(eos) + 1]
    assert ahead[0].outputs[0].finish_reason == "stop"
    # The step launched while the eos was still on the device computed one more position: the
    # eos itself as input (output token i is at position len(prompt) + i).
    computed = [c for step in runner.steps for c in step if c.seq_id == 0]
    assert computed[-1].start == len(prompt) + free_run.index(eos)
    assert computed[-2].start == len(prompt) + free_run.index(eos) - 1


def test_sampled_requests_and_logprobs_launched_ahead():
    """Seeded sampling draws from each request's generator once per token, at launch instead of
    at read: the same tokens; logprobs come from the kept logits at read."""
    params = [
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=1, max_tokens=6, logprobs=3),
        SamplingParams(temperature=0, max_tokens=6, logprobs=2),
        SamplingParams(temperature=1.2, min_p=0.05, seed=7, max_tokens=8),
    ]
    (sync, _), (ahead, runner) = _both([[1, 2, 3], [4, 5], [6]], params)
    assert tokens_of(ahead) == tokens_of(sync)
    assert [out.outputs[0].logprobs for out in ahead] == [out.outputs[0].logprobs for out in sync]
    assert runner.ahead_steps > 0


def test_abort_and_arrival_between_steps():
    runner = FakeRunner(max_model_len=10**6)
    engine = make_engine(runner, async_scheduling=True, enable_prefix_caching=True)
    greedy = SamplingParams(temperature=0, max_tokens=10)
    engine.add_request("a", [1, 2, 3], greedy)
    engine.add_request("b", [4, 5, 6, 7], greedy)
    final, aborted = {}, False
    for step in range(100):
        if not engine.has_unfinished_requests():
            break
        if step == 4:
            assert engine._ahead is not None  # a step is in flight
            engine.abort_request("a")
            engine.add_request("c", [9, 9], greedy)
            aborted = True
        for out in engine.step():
            assert not (aborted and out.request_id == "a"), "a token after the abort"
            if out.finished:
                final[out.request_id] = out.outputs[0].token_ids
        check_books(engine)
    assert engine.block_manager.num_used_blocks == 0
    assert final == {"b": reference_greedy([4, 5, 6, 7], 10), "c": reference_greedy([9, 9], 10)}
    assert runner.ahead_steps > 0


def test_refused_where_the_runner_takes_tokens_from_the_host_only():
    class HostOnly(FakeRunner):
        device_token_inputs = False

    with pytest.raises(ValueError, match="async scheduling needs a runner"):
        make_engine(HostOnly(), async_scheduling=True)
    problems = EngineConfig(async_scheduling=True, tensor_parallel=2).problems()
    assert any("--async-scheduling runs in one process" in p for p in problems)


def test_the_model_on_the_cpu_gives_the_same_tokens():
    """The model runner's own path: a decode step's token ids from a tensor, not its chunks."""
    prompts = [[5, 17, 99, 3, 250, 8], [41, 42, 43]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outputs = []
    for async_scheduling in (False, True):
        config = EngineConfig(
            platform="reference", max_model_len=64, async_scheduling=async_scheduling
        )
        engine = LLMEngine(config, tokenizer=None)
        execute, ahead = engine.runner.execute, []

        def counting(chunks, input_ids=None, execute=execute, ahead=ahead):
            ahead.append(input_ids is not None)
            return execute(chunks) if input_ids is None else execute(chunks, input_ids=input_ids)

        engine.runner.execute = counting
        outputs.append(tokens_of(run_all(engine, prompts, params)))
        assert any(ahead) == async_scheduling
    assert outputs[1] == outputs[0]
    assert all(len(tokens) == 6 for tokens in outputs[1])


def test_input_ids_only_replace_decode_token_ids():
    config = EngineConfig(platform="reference", max_model_len=64)
    engine = LLMEngine(config, tokenizer=None)
    engine.add_request("p", [5, 6, 7], SamplingParams(max_tokens=2))
    (chunk,) = engine.scheduler.schedule().chunks  # a prefill chunk
    with pytest.raises(ValueError, match="decode-only steps"):
        engine.runner.execute([chunk], input_ids=torch.tensor([1]))
