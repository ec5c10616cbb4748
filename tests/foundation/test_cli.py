import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hwrun import API_VERSION, __version__
from hwrun.cli import cli

from .plugin_modules import write_plugin


def run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_version():
    result = run("--version")
    assert result.exit_code == 0
    assert f"hwrun {__version__} (hook API {API_VERSION})" in result.output


def test_platforms_json_has_the_documented_keys():
    rows = json.loads(run("platforms", "--json").output)
    assert rows[0]["name"] == "reference"
    for row in rows:
        assert {"name", "version", "api_version", "status", "reason", "devices"} <= set(row)
        assert row["status"] in {"loaded", "broken", "incompatible"}
        assert isinstance(row["devices"], list)


def test_ops_json_has_the_documented_keys():
    rows = json.loads(run("ops", "--platform", "all", "--json").output)
    for row in rows:
        keys = {"op", "platform", "device", "arch", "selected", "fallback", "rejected"}
        assert set(row) == keys
        assert isinstance(row["rejected"], dict)


def test_ops_validates_on_the_platforms_target(monkeypatch):
    """Without a GPU and without the interpreter the Triton impls refuse with the CPU reason
    and the reference serves; with TRITON_INTERPRET=1 Triton serves the same specs."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = json.loads(run("ops", "--platform", "nvidia", "--json").output)
    topk = next(r for r in rows if r["op"] == "indexer.topk")
    assert (topk["device"], topk["selected"], topk["fallback"]) == (
        "cpu",
        "reference:reference",
        True,
    )
    assert "TRITON_INTERPRET=1" in " ".join(topk["rejected"]["triton"])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    rows = json.loads(run("ops", "--platform", "nvidia", "--json").output)
    served = {r["op"]: r["selected"] for r in rows}
    assert served["indexer.topk"] == served["kv.write_latent"] == "triton"
    assert served["moe.route"] == served["indexer.to_slots"] == "triton"
    assert served["moe.requant"] == "reference:reference"  # no NVIDIA impl of it


def test_ops_shape_answers_for_the_given_spec(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    args = ("ops", "--platform", "nvidia", "--op", "sparse_mla.decode", "--json")
    (row,) = json.loads(run(*args, "--shape", "formats=nvfp4_ds_mla").output)
    assert row["fallback"] and "nvfp4_ds_mla" in " ".join(row["rejected"]["triton"])
    (row,) = json.loads(run(*args, "--shape", "formats=bf16", "--shape", "num_heads=64").output)
    assert row["selected"] == "triton"


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ("heads=64", "is not KEY=VALUE with KEY one of dtype, formats, num_heads"),
        ("num_heads", "is not KEY=VALUE"),
        ("num_heads=0", "num_heads must be a positive integer, got '0'"),
        ("topk=2k", "topk must be a positive integer, got '2k'"),
        ("dtype=bf16", "dtype 'bf16' is not a torch dtype name"),
    ],
)
def test_ops_bad_shape_is_a_usage_error(shape, message):
    result = CliRunner().invoke(cli, ["ops", "--shape", shape])
    assert result.exit_code == 2
    assert message in result.output


def test_ops_unknown_op_glob_is_a_usage_error():
    result = CliRunner().invoke(cli, ["ops", "--op", "indexr.*"])
    assert result.exit_code == 2 and "matches no op; ops: attn.lse_combine" in result.output


def test_ops_no_fallback_exits_non_zero_when_an_op_is_unserved(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    served = run("ops", "--platform", "nvidia", "--op", "indexer.topk", "--no-fallback")
    assert served.exit_code == 0
    result = CliRunner().invoke(cli, ["ops", "--platform", "nvidia", "--no-fallback", "--json"])
    assert result.exit_code == 1
    assert "--no-fallback: " in result.output and "nvidia:moe.requant" in result.output
    fallback = run("ops", "--platform", "nvidia", "--json")
    assert fallback.exit_code == 0


def test_console_entry_point_passes_a_commands_exit_code():
    # `hwrun` itself, not CliRunner: the H200 run found it exiting 0 on --no-fallback.
    env = {"TRITON_INTERPRET": "0", "HWRUN_DISABLE_ENTRY_POINTS": "1"}
    unserved = subprocess_hwrun("ops", "--op", "moe.route", "--no-fallback", extra_env=env)
    assert unserved.returncode == 0  # the reference serves its own ops
    env["HWRUN_PLUGINS"] = "hwrun_tpu.plugin"
    unserved = subprocess_hwrun(
        "ops", "--platform", "tpu", "--op", "moe.route", "--no-fallback", extra_env=env
    )
    assert unserved.returncode == 1
    assert "--no-fallback: 1 op(s) served by no impl: tpu:moe.route" in unserved.stderr
    assert subprocess_hwrun("--version").returncode == 0


@pytest.mark.parametrize("value", ["1", "0", "true", "off", ""])
def test_reference_fallback_takes_the_documented_values(value):
    result = subprocess_hwrun(
        "ops", "--op", "moe.route", "--json", extra_env={"HWRUN_REFERENCE_FALLBACK": value}
    )
    assert result.returncode == 0, result.stderr


def test_reference_fallback_refuses_anything_else():
    result = subprocess_hwrun("ops", extra_env={"HWRUN_REFERENCE_FALLBACK": "sometimes"})
    assert result.returncode == 2
    assert "HWRUN_REFERENCE_FALLBACK='sometimes' is not accepted; set it to one of" in result.stderr


def test_unknown_option_is_a_usage_error():
    assert run("platforms", "--colour").exit_code == 2


def subprocess_hwrun(*args, extra_env=None, cwd=None):
    env = {**os.environ, **(extra_env or {})}
    code = "from hwrun.cli import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )


def test_broken_plugin_is_listed_and_exit_is_zero(tmp_path):
    module = write_plugin(tmp_path, "raise RuntimeError('libvendor.so not found')\n")
    env = {"HWRUN_PLUGINS": module, "PYTHONPATH": str(tmp_path)}
    result = subprocess_hwrun("platforms", "--json", extra_env=env)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows[module]["status"] == "broken"
    assert rows[module]["reason"] == "RuntimeError: libvendor.so not found"
    assert rows["reference"]["status"] == "loaded"
    table = subprocess_hwrun("platforms", extra_env=env)
    assert table.returncode == 0 and "broken" in table.stdout


def test_unknown_platform_exits_one_with_a_message():
    result = subprocess_hwrun("ops", "--platform", "cuda")
    assert result.returncode == 1
    assert "unknown platform 'cuda'; loaded platforms: reference" in result.stderr


def test_usage_error_exits_two():
    result = subprocess_hwrun("ops", "--bogus")
    assert result.returncode == 2
    assert "No such option" in result.stderr
