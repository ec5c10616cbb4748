"""Tensor parallelism on CPU: two local processes over gloo compute what one process computes.

The tiny checkpoint's heads, MLP and expert widths are split in two; the partial outputs of
attention and of each MLP are summed by all-reduce. Both runs are fp32 on the CPU and differ in
summation order only (the all-reduce adds two halves where one process adds all at once), which
is ~1e-7 relative, as the first rows show. As in the transformers oracle (test_model_oracle.py),
where that noise straddles a bf16 rounding boundary of a stored value (latent, index key, MoE
GEMM input) the value moves by one bf16 ulp and every later row attending to it moves, and a
near-tie in the DSA top-k may then resolve the other way for a row. Measured: median row 4e-4 of
its largest logit, one row of 40 at 7%. We require the median row within 2e-3 and 90% of rows
within 1e-2; the greedy tokens of a short generation must be identical.
"""

from __future__ import annotations

import pytest
import torch

from hwrun import LLM, SamplingParams
from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.config import EngineConfig
from hwrun.engine.model_runner import build_model_runner
from hwrun.engine.op_table import EngineStartupError
from hwrun.engine.tp_runner import ProcessGroupRunner
from tests.engine.tiny_checkpoints import build_tiny_model

MEDIAN_REL = 2e-3
ROW_REL = 1e-2
ROWS_WITHIN = 0.9


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("tp-model")
    # 4 heads, dense width 64, expert width 32 split in two; index_topk below the context.
    return build_tiny_model(path, seed=4, index_topk=12, num_hidden_layers=3)


def _flags(checkpoint) -> dict:
    return dict(model=str(checkpoint.path), platform="reference", num_kv_tokens=8 * 64)


def _logits(runner, prompt: list[int]) -> torch.Tensor:
    first = runner.execute([ScheduledChunk(0, prompt[:30], 0, [2], True, all_logits=True)])
    pieces = [first[0].logits]
    for pos in range(30, len(prompt)):
        pieces.append(
            runner.execute([ScheduledChunk(0, prompt[pos : pos + 1], pos, [2], True)])[0].logits
        )
    return torch.cat(pieces)


def test_two_ranks_compute_the_single_rank_logits(checkpoint):
    prompt = torch.randint(2, 128, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    want = _logits(build_model_runner(EngineConfig(**_flags(checkpoint))), prompt)
    runner = ProcessGroupRunner(EngineConfig(**_flags(checkpoint), tensor_parallel=2))
    try:
        assert runner.model_config.num_heads == checkpoint.config.num_attention_heads // 2
        got = _logits(runner, prompt)
    finally:
        runner.close()
    errors = (got - want).abs().amax(dim=-1) / want.abs().amax(dim=-1)
    # Row 0 reads only its own stored values: its error is the all-reduce's summation noise.
    # Row 1 already reads row 0's stored latent and index key, whose bf16 rounding can differ
    # (on an Intel Xeon host, 2026-12-03: row 0 2.5e-7, row 1 4.6e-4), so it is left to the
    # statistics below with the other rows.
    assert errors[0].item() < 1e-5
    assert errors.median().item() < MEDIAN_REL, errors.tolist()
    assert (errors < ROW_REL).float().mean().item() >= ROWS_WITHIN, errors.tolist()


def test_the_engine_generates_the_same_tokens_with_two_ranks(checkpoint):
    prompts = [[5, 9, 11, 3], list(range(2, 40))]
    params = SamplingParams(max_tokens=6, temperature=0)
    one = LLM(**_flags(checkpoint)).generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(**_flags(checkpoint), tensor_parallel=2)
    try:
        two = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    finally:
        llm.engine.runner.close()
    assert [o.outputs[0].token_ids for o in two] == [o.outputs[0].token_ids for o in one]


def test_a_split_that_does_not_divide_is_refused_with_the_reason(checkpoint):
    from hwrun.engine.model_runner import TensorShard

    with pytest.raises(
        EngineStartupError, match="num_attention_heads 4 is not divisible by --tp 3"
    ):
        build_model_runner(EngineConfig(**_flags(checkpoint)), shard=TensorShard(0, 3))


def test_hwrun_generate_with_two_ranks_prints_the_single_rank_completion(checkpoint):
    from click.testing import CliRunner

    from hwrun.cli import cli

    def generate(*extra: str) -> str:
        args = ["generate", "--model", str(checkpoint.path), "--platform", "reference"]
        args += ["--num-kv-tokens", "512", "--max-tokens", "5", "--token-ids", *extra, "5,9,11"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return result.output.splitlines()[-2]  # "[5, 9, 11] -> [...]"

    assert generate("--tensor-parallel-size", "2") == generate()
