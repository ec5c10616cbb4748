import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hwrun.cli import cli
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
    report = plan_json(
        "--model", "deepseek-v3.2", "--tp", "8", "--gpu-mem", "1TiB", "--weights", "0"
    )
    assert "past int32" in report["warnings"][0]


def test_index_format_option_and_config_path():
    report = plan_json("--model", str(FIXTURES / "deepseek_v32_tiny.json"), "--index", "mxfp4")
    assert report["bytes_per_token_per_gpu"]["index_keys"] == 4 * 68
    assert report["layers"]["index_keys"] == 4


def test_table_is_the_default():
    result = run(
        "--model",
        "mistral-large-4",
        "--tp",
        "8",
        "--gpu-mem",
        "112GB",
        "--weights",
        "0",
        "--context",
        "128K",
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


def test_impossible_configuration_is_a_usage_error_listing_every_reason():
    result = run("--model", "kimi-k3.1-pro", "--tp", "5", "--dcp", "2", "--block-size", "96")
    assert result.exit_code == 2
    reasons = [line for line in result.output.splitlines() if line.strip().startswith("- ")]
    assert len(reasons) == 3, result.output
    assert "DCP size 2" in result.output and "KDA heads" in result.output
    too_small = run("--model", "kimi-k3.1-pro", "--gpu-mem", "1000", "--weights", "0")
    assert too_small.exit_code == 2 and "holds no block" in too_small.output
    block = run("--model", "deepseek-v3.2", "--block-size", "3")
    assert block.exit_code == 2 and "power of two" in block.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpu-mem", "141GB"), "--gpu-mem needs --weights"),
        (("--weights", "10GB"), "--weights size the KV budget and need --gpu-mem"),
        (("--overhead", "1GB", "--mem-util", "0.9"), "--overhead and --mem-util size the KV"),
        (("--gpu-mem", "1e400", "--weights", "0"), "is not a size up to 2**60"),
        (("--gpu-mem", "141GB", "--weights", "0", "--mem-util", "1.5"), "--mem-util"),
        (("--tp", "3"), "--tp 3 does not divide the model's 128 attention heads; TP sizes"),
        (("--block-size", "0"), "--block-size"),
    ],
)
def test_option_mistakes_are_usage_errors(args, message):
    result = run("--model", "deepseek-v3.2", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output


def _config(tmp_path, **changes):
    config = json.loads((FIXTURES / "deepseek_v32_tiny.json").read_text())
    config.update(changes)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_hidden_layers": "61"}, 'num_hidden_layers must be an integer, got the string "61"'),
        ({"num_hidden_layers": 61.0}, "num_hidden_layers must be an integer, got the number 61.0"),
        ({"num_hidden_layers": True}, "must be an integer, got the boolean true"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be between 1 and 1024, got 0"),
        ({"num_hidden_layers": 10**9}, "num_hidden_layers must be between 1 and 1024"),
        ({"kv_lora_rank": "512"}, 'kv_lora_rank must be an integer, got the string "512"'),
        ({"kv_lora_rank": None}, "kv_lora_rank must be an integer, got null"),
        ({"index_topk": "2048"}, 'index_topk must be an integer, got the string "2048"'),
        ({"index_topk_freq": "4", "model_type": "glm_moe_dsa"}, "index_topk_freq must be an"),
        ({"num_attention_heads": "32"}, "num_attention_heads must be an integer"),
    ],
)
def test_config_json_mistakes_are_usage_errors(tmp_path, changes, message):
    result = run("--model", _config(tmp_path, **changes), "--context", "128K")
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_config_json_that_is_not_an_object_or_misses_kda_shape(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    result = run("--model", str(path))
    assert result.exit_code == 2 and "must hold a JSON object" in result.output
    kimi = json.loads((FIXTURES / "kimi_linear_tiny.json").read_text())
    kimi["linear_attn_config"] = None
    (tmp_path / "kimi.json").write_text(json.dumps(kimi))
    result = run("--model", str(tmp_path / "kimi.json"))
    assert result.exit_code == 2 and "linear_attn_config must be a JSON object" in result.output
    kimi["linear_attn_config"] = {"full_attn_layers": [1], "kda_layers": [2], "num_heads": "32"}
    (tmp_path / "kimi.json").write_text(json.dumps(kimi))
    result = run("--model", str(tmp_path / "kimi.json"))
    assert result.exit_code == 2 and "linear_attn_config" in result.output
