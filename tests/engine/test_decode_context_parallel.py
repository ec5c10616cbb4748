"""Decode context parallelism on CPU: W local processes over gloo compute what one process computes.

Each rank stores every W-th token of each sequence (token t on rank t % W); decode rows rank
their own keys, merge the exact global top-k, attend over their share and combine by LSE;
prefill gathers the context from every rank. The scripted run (dcp_ranks.run_steps) covers a
prompt prefilled in two chunks, two more prompts prefilled beside it in one step, a 1-token
prompt prefilled alone, and 8 decode steps of the four sequences batched together, two of them
so short that some ranks hold none of their tokens.

What must match, and why:

- the DSA selection: every decode row's set of attended positions (the union of the ranks'
  shares, per layer and step) equals the single-rank ``indexer.topk`` set exactly. On the
  random checkpoint and on a checkpoint whose indexer scores are all exactly 0 (every key ties,
  so the merge's tie round decides: the k smallest positions).
- prefill logits: bit-identical (each rank attends over the gathered bytes as one rank does).
- decode logits: one rank's softmax over the selected keys is W partial softmaxes merged by LSE
  on DCP: the same math in another fp32 summation order (~1e-7 relative). Where that noise
  straddles a bf16 rounding boundary of a stored latent or index key, the stored value moves by
  one bf16 ulp and later rows attending to it move further (as under TP,
  test_tensor_parallel.py). Measured at W = 2 and 4: median row 6e-7 to 7e-7 of its largest
  logit, largest row 1.5e-4 to 9e-4. We require the median row within ``MEDIAN_REL`` = 2e-5 and
  every row within ``ROW_REL`` = 5e-3.

The negative control replaces the merge with one that breaks equal scores by rank (rank 0's
tokens first) instead of by token position: on the all-ties checkpoint every row of more than k
tokens then attends to positions 0, 2, 4, ... instead of 0 .. k - 1 (at W = 2), which both the
set check and the logits check catch (measured: the worst row 106% off).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from hwrun import LLM, SamplingParams
from hwrun.collectives.launch import spawn_group
from hwrun.engine.config import EngineConfig
from hwrun.engine.model_runner import build_model_runner
from hwrun.engine.op_table import EngineStartupError
from tests.engine import dcp_ranks
from tests.engine.tiny_checkpoints import build_tiny_model

ROW_REL = 5e-3
MEDIAN_REL = 2e-5


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, str]:
    # index_topk 12: below every context but the short sequence's, so the selection is sparse
    random = build_tiny_model(
        tmp_path_factory.mktemp("dcp-random"), seed=4, index_topk=12, num_hidden_layers=3
    )
    ties = build_tiny_model(tmp_path_factory.mktemp("dcp-ties"), seed=5, index_topk=12)
    weights = ties.path / "model.safetensors"
    tensors = load_file(weights)
    for name in tensors:
        if name.endswith("indexer.weights_proj.weight"):
            tensors[name] = torch.zeros_like(tensors[name])  # every indexer score is 0
    save_file(tensors, weights, metadata={"format": "pt"})
    return {"random": str(random.path), "ties": str(ties.path)}


@pytest.fixture(scope="module")
def single_rank(checkpoints) -> dict[str, dict]:
    results = {}
    for name, path in checkpoints.items():
        runner = build_model_runner(EngineConfig(**dcp_ranks.flags(path)))
        results[name] = dcp_ranks.run_steps(runner, dcp_ranks.prompts(runner.vocab_size))
    # every score ties there: each row of more than k tokens attends to positions 0 .. k - 1
    k = 12
    rows = [row for call in results["ties"]["selections"] for row in call]
    assert all(row == list(range(k)) for row in rows if len(row) == k)
    assert sum(len(row) == k for row in rows) >= len(rows) // 2
    return results


def _logit_rows(result: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill rows, decode rows) of a run's logits, [n, V] each."""
    prefill, decode = [], []
    for step, outputs in enumerate(result["logits"]):
        rows = [torch.tensor(o) for o in outputs if o is not None]
        (prefill if step < dcp_ranks.PREFILL_STEPS else decode).extend(rows)
    return torch.cat(prefill), torch.cat(decode)


def _row_errors(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:  # [rows]
    """Each row's largest |difference|, relative to the row's largest |logit|."""
    return (got - want).abs().amax(dim=-1) / want.abs().amax(dim=-1)


def _union(ranks: list[dict]) -> list[list[list[int]]]:
    """Per to_slots call and row, the positions every rank attends to together."""
    calls = zip(*(r["selections"] for r in ranks), strict=True)
    return [
        [sorted(p for share in row for p in share) for row in zip(*shares, strict=True)]
        for shares in calls
    ]


@pytest.mark.parametrize("world", [2, 4])
def test_dcp_ranks_compute_the_single_rank_selection_and_logits(checkpoints, single_rank, world):
    names = sorted(checkpoints)
    ranks = spawn_group(
        dcp_ranks.rank_main,
        world,
        ([checkpoints[n] for n in names], world == 2),
        timeout_s=60.0,
        deadline_s=240.0,
    )
    for index, name in enumerate(names):
        per_rank = [r[index] for r in ranks]
        want = single_rank[name]
        assert _union(per_rank) == want["selections"], f"{name}: selected sets differ"
        for rank, result in enumerate(per_rank[1:], start=1):
            assert result["logits"] == per_rank[0]["logits"], f"{name}: rank {rank} differs"
        got_prefill, got_decode = _logit_rows(per_rank[0])
        want_prefill, want_decode = _logit_rows(want)
        assert torch.equal(got_prefill, want_prefill), f"{name}: prefill logits differ"
        errors = _row_errors(got_decode, want_decode)
        assert errors.max().item() < ROW_REL, f"{name}: {errors.tolist()}"
        assert errors.median().item() < MEDIAN_REL, f"{name}: {errors.tolist()}"
        if world == 2 and name == "ties":
            control = _union([r[index]["control"] for r in ranks])
            assert control != want["selections"], "the negative control's merge was not caught"
            assert (
                _row_errors(_logit_rows(ranks[0][index]["control"])[1], want_decode).max() > ROW_REL
            )


def test_the_engine_generates_the_same_tokens_with_two_dcp_ranks(checkpoints):
    """The whole engine (scheduler on rank 0, blocks of 2 x 64 tokens, prefix cache) over a
    two-process DCP group gives the single-rank engine's greedy tokens."""
    path = checkpoints["random"]
    flags = dcp_ranks.flags(path)
    long_prompt = torch.randint(2, 128, (300,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [[5, 9, 11, 3], list(range(2, 40)), long_prompt]
    params = SamplingParams(max_tokens=6, temperature=0)
    one = LLM(**flags).generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(**flags, decode_context_parallel=2)
    try:
        assert llm.engine.runner.block_size == 128
        two = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        # the long prompt again: its first 256 tokens come from the prefix cache, on both ranks
        again = llm.generate(prompt_token_ids=[long_prompt], sampling_params=params)
        assert llm.engine.block_manager.prefix_cache_hits == 256
    finally:
        llm.engine.runner.close()
    tokens = [o.outputs[0].token_ids for o in one]
    assert [o.outputs[0].token_ids for o in two] == tokens
    assert again[0].outputs[0].token_ids == tokens[2]


def test_tensor_and_decode_context_parallel_together_are_refused(checkpoints):
    with pytest.raises(EngineStartupError, match="not both at once yet") as err:
        LLM(**dcp_ranks.flags(checkpoints["random"]), tensor_parallel=2, decode_context_parallel=2)
    assert "--decode-context-parallel-size 2" in str(err.value)


def test_hwrun_generate_with_two_dcp_ranks_prints_the_single_rank_completion(checkpoints):
    from click.testing import CliRunner

    from hwrun.cli import cli

    def generate(*extra: str) -> str:
        args = ["generate", "--model", checkpoints["random"], "--platform", "reference"]
        args += ["--num-kv-tokens", "512", "--max-tokens", "5", "--token-ids", *extra, "5,9,11"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return result.output.splitlines()[-2]  # "[5, 9, 11] -> [...]"

    assert generate("--decode-context-parallel-size", "2") == generate()
