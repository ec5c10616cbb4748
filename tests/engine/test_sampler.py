"""The sampler against direct computations: filters, seeds independent of the batch, logprobs."""

import math

import pytest
import torch

from hwrun.engine import sampler
from hwrun.engine.sampling_params import SamplingParams


def direct_filtered(logits: list[float], params: SamplingParams) -> list[float]:
    """The sampled distribution written out in plain Python: temperature, min-p, top-k, top-p."""
    scaled = [x / params.temperature for x in logits]
    peak = max(scaled)
    weights = [math.exp(x - peak) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    keep = [p >= params.min_p * max(probs) for p in probs]
    if params.top_k > 0:
        kth = sorted((s for s, k in zip(scaled, keep, strict=True) if k), reverse=True)
        kth = kth[min(params.top_k, len(kth)) - 1]
        keep = [k and s >= kth for s, k in zip(scaled, keep, strict=True)]
    if params.top_p < 1:
        total = sum(p for p, k in zip(probs, keep, strict=True) if k)
        order = sorted((i for i in range(len(probs)) if keep[i]), key=lambda i: (-probs[i], i))
        mass = 0.0
        for i in order:
            if mass >= params.top_p:
                keep[i] = False
            mass += probs[i] / total
    kept = sum(p for p, k in zip(probs, keep, strict=True) if k)
    return [p / kept if k else 0.0 for p, k in zip(probs, keep, strict=True)]


FILTERS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.6),
    SamplingParams(temperature=1.0, min_p=0.1),
    SamplingParams(temperature=0.8, top_k=12, top_p=0.8, min_p=0.02),
    SamplingParams(temperature=1.0, top_k=1),
    SamplingParams(temperature=1.0, top_p=0.01),
]


@pytest.mark.parametrize(
    "params", FILTERS, ids=lambda p: f"T{p.temperature}k{p.top_k}p{p.top_p}m{p.min_p}"
)
def test_filters_match_the_direct_computation(params):
    logits = torch.randn(40, generator=torch.Generator().manual_seed(1)) * 2
    got = sampler.filtered_probs(logits, params)
    expected = direct_filtered(logits.tolist(), params)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)
    assert [p > 0 for p in got.tolist()] == [p > 0 for p in expected]


def test_top_k_keeps_ties_with_the_kth():
    logits = torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0])
    probs = sampler.filtered_probs(logits, SamplingParams(top_k=2))
    assert (probs > 0).tolist() == [True, False, True, True, False]


def test_samples_follow_the_filtered_distribution():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.95)
    probs = sampler.filtered_probs(logits, params)
    generator = torch.Generator().manual_seed(0)
    draws = [sampler.sample_row(logits, params, generator) for _ in range(4000)]
    counts = torch.bincount(torch.tensor(draws), minlength=6).double() / len(draws)
    assert counts.tolist() == pytest.approx(probs.tolist(), abs=0.03)
    assert counts[probs == 0].sum() == 0


def test_greedy_takes_the_smallest_index_among_equal_maxima():
    logits = torch.tensor([[0.0, 5.0, 5.0, 1.0]])
    tokens, _ = sampler.sample(logits, [SamplingParams(temperature=0)], [torch.Generator()])
    assert tokens == [1]


def test_a_seeded_row_samples_the_same_alone_and_in_a_batch():
    batch = torch.randn(32, 100, generator=torch.Generator().manual_seed(2))
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=i, logprobs=5) for i in range(32)]

    def generators():
        return [torch.Generator().manual_seed(p.seed) for p in params]

    tokens, logprobs = sampler.sample(batch, params, generators())
    for i in (0, 7, 31):
        alone_tokens, alone_logprobs = sampler.sample(
            batch[i : i + 1], params[i : i + 1], generators()[i : i + 1]
        )
        assert alone_tokens == [tokens[i]]
        assert alone_logprobs == [logprobs[i]]  # bitwise: floats compared exactly


def test_logprobs_put_the_sampled_token_first_then_the_top_n():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0, -1.0]])
    params = SamplingParams(temperature=1.0, top_k=0, seed=0, logprobs=2)
    (token,), (entry,) = sampler.sample(logits, [params], [torch.Generator().manual_seed(5)])
    expected = torch.log_softmax(logits[0], dim=-1)
    assert next(iter(entry)) == token
    assert set(entry) == {token, 1, 2}
    assert all(entry[t] == float(expected[t]) for t in entry)
    entry = sampler.top_logprobs(expected, 1, 0)
    assert entry == {1: float(expected[1])}


def test_prompt_logprobs_are_the_log_softmax_rows():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(4))
    entries = sampler.prompt_logprobs(logits, [4, 0, 9], 1)
    for row, token, entry in zip(logits, [4, 0, 9], entries, strict=True):
        expected = torch.log_softmax(row, dim=-1)
        assert entry[token] == float(expected[token])
        assert int(torch.argmax(expected)) in entry


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_seeded_rows_sample_alone_as_in_a_batch_and_match_the_cpu_filters():
    batch = torch.randn(32, 1000, generator=torch.Generator().manual_seed(6)) * 3
    params = [
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.01, seed=i, logprobs=3)
        for i in range(32)
    ]

    def generators():
        return [torch.Generator(device="cuda").manual_seed(p.seed) for p in params]

    cuda = batch.cuda()
    tokens, logprobs = sampler.sample(cuda, params, generators())
    for i in (0, 13, 31):
        alone = sampler.sample(cuda[i : i + 1], params[i : i + 1], generators()[i : i + 1])
        assert alone == ([tokens[i]], [logprobs[i]])
        on_gpu = sampler.filtered_probs(cuda[i], params[i]).cpu()
        assert torch.allclose(on_gpu, sampler.filtered_probs(batch[i], params[i]), atol=1e-6)
        assert on_gpu[tokens[i]] > 0
