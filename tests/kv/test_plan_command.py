import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hwrun.cli import cli
from hwrun.kv.errors import PlanError
from hwrun.models import MODELS

FIXTURES = Path(__file__).parents[1] / "models" / "fixtures"


def run(*args):
    return CliRunner().invoke(cli, ["plan", *args])


def plan_json(*args):
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_has_the_documented_keys_and_seed_figures():
    report = plan_json("--model", "kimi-k3.1-pro", "--tp", "8")
    assert report["bytes_per_token_per_gpu"] == {
        "latent": 13824,
        "index_keys": 3168,
        "total": 16992,
    }
    assert report["block_size"] == 64 and report["row_bytes"] == 64 * 16992
    assert report["padding_fraction"] == 0.0
    pages = report["pages"]
    assert len(pages) == 48 and pages[1] == {
        "layer": 3,
        "kind": "index_keys",
        "format": "fp8",
        "offset": 64 * 576,
        "size": 64 * 132,
    }
    assert "tokens_per_gpu" not in report and "concurrent_requests" not in report


@pytest.mark.parametrize(
    ("latent", "total"), [("fp8_ds_mla", 47136), ("fp8_e4m3", 42096), ("bf16", 78384)]
)
def test_mistral_formats(latent, total):
    report = plan_json("--model", "mistral-large-4", "--tp", "8", "--latent", latent)
    assert report["bytes_per_token_per_gpu"]["total"] == total
    assert report["bytes_per_token_per_gpu"]["index_keys"] == 5808


def test_budget_and_context_give_pool_and_concurrency():
    report = plan_json(
        "--model",
        "kimi-k3.1-pro",
        "--tp",
        "8",
        "--dcp",
        "8",
        "--gpu-mem",
        "288e9",
        "--mem-util",
        "0.85",
        "--weights",
        "193.144e9",
        "--overhead",
        "5.35e9",
        "--context",
        "1M",
    )
    assert report["kv_budget_per_gpu"] == 288 * 10**9 * 85 // 100 - 193_144_000_000 - 5_350_000_000
    assert report["bytes_per_token_per_gpu"]["total"] == 2124
    assert report["tokens_per_cluster"] == 8 * report["tokens_per_gpu"]
    assert round(report["tokens_per_cluster"] / 1e6, 1) == 21.8
    assert report["context"] == 2**20
    assert report["concurrent_requests"] == report["num_blocks"] // report["rows_per_request"]
    assert 0.22 < report["decode_read_fraction_vs_dense_mla"] < 0.24
    assert report["warnings"] == []


def test_int32_kernel_page_ids_warn_on_huge_pools():
    report = plan_json("--model", "deepseek-v3.2", "--tp", "8", "--gpu-mem", "1TiB")
    assert "past int32" in report["warnings"][0]


def test_index_format_option_and_config_path():
    report = plan_json("--model", str(FIXTURES / "deepseek_v32_tiny.json"), "--index", "mxfp4")
    assert report["bytes_per_token_per_gpu"]["index_keys"] == 4 * 68
    assert report["layers"]["index_keys"] == 4


def test_table_is_the_default():
    result = run(
        "--model", "mistral-large-4", "--tp", "8", "--gpu-mem", "112GB", "--context", "128K"
    )
    assert result.exit_code == 0, result.output
    assert "47,136" in result.output and "pool tokens per GPU" in result.output
    assert "assumed:" in result.output


def test_unknown_model_is_a_usage_error_listing_known_models():
    result = run("--model", "kimi-k4")
    assert result.exit_code == 2
    for name in MODELS:
        assert name in result.output


def test_bad_sizes_and_formats_are_usage_errors():
    assert run("--model", "kimi-k3", "--gpu-mem", "lots").exit_code == 2
    assert run("--model", "kimi-k3", "--latent", "fp7").exit_code == 2
    assert run("--model", "kimi-k3", "--tp", "0").exit_code == 2


def test_impossible_configuration_lists_every_reason():
    result = run("--model", "kimi-k3.1-pro", "--tp", "5", "--dcp", "2", "--block-size", "96")
    assert result.exit_code == 1
    assert isinstance(result.exception, PlanError)
    reasons = result.exception.reasons
    assert len(reasons) == 3
    assert any("DCP size 2" in r for r in reasons) and any("KDA heads" in r for r in reasons)
    too_small = run("--model", "kimi-k3.1-pro", "--gpu-mem", "1000")
    assert too_small.exit_code == 1 and "holds no block" in str(too_small.exception)
