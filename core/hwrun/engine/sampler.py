"""Logits -> next tokens and logprobs, one row at a time.

Every row is computed on its own (no op reduces across rows; the greedy rows share one argmax
call, exact per row), so a request's token and logprobs depend only on its logits, its options
and its own generator: the sampler is batch-invariant by construction, and a seeded request
gives the same samples alone or in any batch.

Per row, as vLLM orders it: temperature == 0 takes the argmax (the smallest index among equal
maxima). Otherwise the logits are divided by the temperature, then filtered: min-p drops tokens
whose probability is below ``min_p`` times the largest, top-k keeps the ``k`` largest logits
(ties with the k-th kept too), top-p keeps the smallest set of most probable tokens (of the
distribution renormalized after the earlier filters) whose probability reaches ``top_p``. The
token is drawn from what is left with the request's generator (exponential race: the argmax of
``p / q`` with ``q ~ Exp(1)``, which picks each token with probability ``p``).

Logprobs are those of the model's distribution (log-softmax of the raw logits, before
temperature and filters), as vLLM returns them.
"""

from __future__ import annotations

import torch

from hwrun.engine.outputs import Logprobs
from hwrun.engine.sampling_params import SamplingParams


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a row samples from: ``logits`` ``[V]`` float32 after temperature,
    min-p, top-k and top-p; filtered tokens have probability 0."""
    logits = logits / params.temperature
    probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    if params.top_k > 0 and params.top_k < probs.numel():
        kth = torch.topk(logits.masked_fill(probs == 0, -torch.inf), params.top_k).values[-1]
        probs = probs.masked_fill(logits < kth, 0.0)
    if params.top_p < 1.0:
        probs = probs / probs.sum()
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # mass of better tokens
        drop = before >= params.top_p
        drop[0] = False
        probs = probs.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), 0.0)
    return probs / probs.sum()


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token from ``logits`` ``[V]`` float32."""
    return int(_row_token(logits, params, generator))


def _row_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> torch.Tensor:  # 0-dim int64 on logits' device: nothing is read back
    if params.greedy:
        return torch.argmax(logits)
    probs = filtered_probs(logits, params)
    race = torch.empty_like(probs).exponential_(generator=generator)
    return torch.argmax(probs / race)


def top_logprobs(logprobs: torch.Tensor, token_id: int, num: int) -> Logprobs:
    """``token_id``'s logprob first, then the ``num`` largest in descending order (smaller
    index first among equals); ``token_id`` appears once."""
    entry = {token_id: float(logprobs[token_id])}
    if num > 0:
        values, indices = torch.topk(logprobs, min(num, logprobs.numel()))
        ranked = sorted(zip(values.tolist(), indices.tolist(), strict=True), key=_rank)
        for value, index in ranked:
            entry.setdefault(index, value)
    return entry


def _rank(value_index: tuple[float, int]) -> tuple[float, int]:
    return (-value_index[0], value_index[1])


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> tuple[list[int], list[Logprobs | None]]:
    """Next token of each row of ``logits`` ``[R, V]``, and its logprobs where asked for."""
    tokens = sample_on_device(logits, params, generators).tolist()
    return tokens, token_logprobs(logits, tokens, params)


def sample_on_device(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
) -> torch.Tensor:
    """Next token of each row of ``logits`` ``[R, V]`` as an int64 tensor on their device,
    nothing read back (the engine's async scheduling feeds it to the next step): each request's
    generator draws here, once per token, as :func:`sample` does."""
    if len(params) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(params)} requests")
    logits = logits.float()
    # Argmax is exact (a max, no rounding), so the greedy rows take one argmax over the batch
    # without depending on it.
    tokens = torch.argmax(logits, dim=-1)
    for i, row_params in enumerate(params):
        if not row_params.greedy:  # a row taken only here: no view per greedy row
            tokens[i] = _row_token(logits[i], row_params, generators[i])
    return tokens


def token_logprobs(
    logits: torch.Tensor | list[torch.Tensor], tokens: list[int], params: list[SamplingParams]
) -> list[Logprobs | None]:
    """The logprobs of each row's chosen token where its request asks for them (``logits``
    ``[R, V]``, or its R rows; a row is taken only for a request that asks)."""
    if not len(tokens) == len(params) == len(logits):
        raise ValueError(
            f"{len(logits)} rows of logits, {len(tokens)} tokens, {len(params)} requests"
        )
    return [
        None
        if row_params.logprobs is None
        else top_logprobs(torch.log_softmax(logits[i].float(), dim=-1), token, row_params.logprobs)
        for i, (token, row_params) in enumerate(zip(tokens, params, strict=True))
    ]


def prompt_logprobs(logits: torch.Tensor, next_token_ids: list[int], num: int) -> list[Logprobs]:
    """Logprobs of prompt tokens: row ``i`` of ``logits`` ``[n, V]`` is the position before
    ``next_token_ids[i]``; each entry has that token first, then the top ``num``."""
    entries = []
    for row, token_id in zip(logits, next_token_ids, strict=True):
        row_logprobs = torch.log_softmax(row.float(), dim=-1)
        entries.append(top_logprobs(row_logprobs, token_id, num))
    return entries
