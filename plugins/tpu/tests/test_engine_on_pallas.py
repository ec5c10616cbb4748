"""The built-in engine on the TPU platform, its DSA ops served by the Pallas kernels in the
interpret mode, generates the reference platform's greedy tokens for the embedded model: a
prompt past the indexer's top-64 (so the top-k really selects) next to a short one (contexts
shorter than k), fp8 index keys and an fp8_ds_mla latent cache, prefill and decode steps."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hwrun.cli import cli

LONG = " ".join(f"Item {i} is on the list." for i in range(20))  # ~140 tokens: past top-64
PROMPTS = (LONG, "The capital of France is")


def _generate(platform: str) -> tuple[list[list[int]], str]:
    args = ["generate", "--platform", platform, "--json", "--max-tokens", "6"]
    args += ["--kv-cache-dtype", "fp8_ds_mla", "--index-dtype", "fp8", *PROMPTS]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    return [row["outputs"][0]["token_ids"] for row in rows], result.output


def test_greedy_tokens_equal_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWRUN_PALLAS_INTERPRET", "1")
    tokens, output = _generate("tpu")
    assert "7 of 10 ops served by tpu" in output, output
    assert len(tokens) == len(PROMPTS)
    assert tokens == _generate("reference")[0]
