import json
import os
import subprocess
import sys

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
        assert set(row) == {"op", "platform", "selected", "fallback", "rejected"}
        assert isinstance(row["rejected"], dict)


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
