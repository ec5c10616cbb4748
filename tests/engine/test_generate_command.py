"""`hwrun generate` over the fake runner (the model side is tested by the oracle tests)."""

import json

import pytest
from click.testing import CliRunner

from hwrun.cli import cli

from .fake_runner import FakeRunner
from .test_llm_engine import reference_greedy


@pytest.fixture
def fake_model(monkeypatch, tmp_path):
    """``--model tmp_path`` builds the fake runner; the directory has no tokenizer."""
    monkeypatch.setattr("hwrun.engine.model_runner.build_model_runner", lambda config: FakeRunner())
    return str(tmp_path)


def invoke(*args):
    return CliRunner().invoke(cli, ["generate", *args])


def test_token_id_prompts_print_their_completions(fake_model):
    result = invoke("--model", fake_model, "--max-tokens", "4", "--token-ids", "1,2,3", "7 8")
    assert result.exit_code == 0, result.output
    assert f"[1, 2, 3] -> {reference_greedy([1, 2, 3], 4)}" in result.output
    assert f"[7, 8] -> {reference_greedy([7, 8], 4)}" in result.output
    assert "(4 tokens, length)" in result.output
    assert "1 of 1 ops served by reference" in result.output


def test_json_output_and_sampling_flags(fake_model):
    args = ["--model", fake_model, "--json", "--token-ids", "--temperature", "0.8"]
    result = invoke(*args, "--seed", "3", "--top-k", "5", "--logprobs", "2", "5,6")
    assert result.exit_code == 0, result.output
    row = json.loads(result.output.splitlines()[-1])
    assert row["prompt_token_ids"] == [5, 6]
    assert len(row["outputs"][0]["logprobs"]) == len(row["outputs"][0]["token_ids"]) == 64


def test_text_without_a_tokenizer_is_a_usage_error(fake_model):
    result = invoke("--model", fake_model, "hello")
    assert result.exit_code == 2
    assert "no tokenizer" in result.output and "--token-ids" in result.output


def test_bad_sampling_flags_and_token_ids_are_usage_errors(fake_model):
    assert invoke("--model", fake_model, "--top-p", "0", "--token-ids", "1").exit_code == 2
    result = invoke("--model", fake_model, "--token-ids", "1,x")
    assert result.exit_code == 2 and "not a list of token ids" in result.output
