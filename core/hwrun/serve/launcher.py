"""``hwrun serve --engine vllm``: vLLM with the platform's recipe, checked before it starts.

1. The platform plugin's ``hwrun_serve_recipe`` gives the flags and environment for the
   deployment the user asked for; the user's extra vLLM flags (after ``--``) come after them,
   so they win as they would on vLLM's own command line; hwrun adds the bind address.
2. The whole command and environment are read back into a :class:`Deployment`
   (:func:`read_deployment`): the rules judge what would really start, extra flags included.
3. ``hwrun_validate_deployment`` (and core's layout and device-count checks) answer with every
   reason at once. A rule about the request refuses always; a device check this machine cannot
   satisfy refuses a launch and is a warning under ``--dry-run``, which prints the command on
   any machine.
4. A launch execs ``vllm`` (hwrun's process becomes vLLM's, so its exit status is vLLM's).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, replace

from hwrun import knobs
from hwrun.deployment import Deployment
from hwrun.errors import HwrunError
from hwrun.plugins import PluginSet
from hwrun.serve.recipe import ServeRecipe

VARIABLE = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")
# vLLM's latent cache dtypes, as hwrun's format names (see docs/formats.md).
KV_CACHE_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "fp8": "fp8_ds_mla",
    "fp8_ds_mla": "fp8_ds_mla",
    "fp8_e4m3": "fp8_e4m3",
    "nvfp4": "nvfp4_ds_mla",
}
# Flags that take a value and the Deployment field each one sets (aliases share a field).
INT_FLAGS = {
    "--tensor-parallel-size": "tensor_parallel",
    "-tp": "tensor_parallel",
    "--decode-context-parallel-size": "decode_context_parallel",
    "-dcp": "decode_context_parallel",
    "--prefill-context-parallel-size": "prefill_context_parallel",
    "-pcp": "prefill_context_parallel",
    "--data-parallel-size": "data_parallel",
    "-dp": "data_parallel",
    "--max-model-len": "max_context",
}
BOOL_FLAGS = {
    "--enable-expert-parallel": "expert_parallel",
    "-ep": "expert_parallel",
    "--enable-lora": "lora",
}


class LaunchRefused(HwrunError):
    """The deployment cannot run; ``reasons`` has every reason."""

    def __init__(self, what: str, reasons: list[str]):
        self.reasons = reasons
        super().__init__(f"{what}:\n" + "\n".join(f"  - {r}" for r in reasons))


@dataclass(frozen=True)
class LaunchPlan:
    """The command hwrun would run, and what the checks said about it."""

    platform: str
    argv: tuple[str, ...]  # vllm serve MODEL ...
    env: tuple[tuple[str, str], ...]  # set on top of the caller's environment
    deployment: Deployment  # read back from argv and env
    refusals: tuple[str, ...]  # rules about the request: refuse in every mode
    device_warnings: tuple[str, ...]  # device checks not met here: refuse a launch only
    recipe: ServeRecipe


def plan_launch(
    plugins: PluginSet,
    platform: str,
    requested: Deployment,
    extra_args: list[str],
    *,
    host: str,
    port: int,
    api_key: str | None = None,
) -> LaunchPlan:
    """Recipe + extra flags + bind address, read back and checked (nothing is started)."""
    plugin = plugins.get(platform)
    recipe = plugins.call(plugin, "hwrun_serve_recipe", deployment=requested)
    if recipe is None:
        raise LaunchRefused(
            f"hwrun serve --engine vllm --platform {platform}",
            [f"{platform} has no vLLM recipe (its plugin does not implement hwrun_serve_recipe)"],
        )
    argv = ("vllm", "serve", requested.model, *recipe.args, *extra_args)
    argv += ("--host", host, "--port", str(port))
    env = dict(recipe.env)
    if api_key:
        env["VLLM_API_KEY"] = api_key  # not on the command line, where ps shows it
    launched_env = {**os.environ, **env}
    deployment, problems = read_deployment(requested, argv[3:], launched_env)
    rules = plugins.validate_deployment(platform, replace(deployment, check_devices=False))
    everything = plugins.validate_deployment(platform, deployment)
    return LaunchPlan(
        platform=platform,
        argv=argv,
        env=tuple(env.items()),
        deployment=deployment,
        refusals=tuple(problems + rules),
        device_warnings=tuple(r for r in everything if r not in rules),
        recipe=recipe,
    )


def read_deployment(
    requested: Deployment, args: tuple[str, ...] | list[str], env: dict[str, str]
) -> tuple[Deployment, list[str]]:
    """The deployment a vLLM command line and environment describe (later flags win, as in
    vLLM's parser), and the flags that could not be read."""
    fields: dict = {}
    problems: list[str] = []
    i = 0
    while i < len(args):
        flag, value, has_value = args[i], None, False
        if flag.startswith("-") and "=" in flag:
            flag, value = flag.split("=", 1)
            has_value = True
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, has_value = args[i + 1], True
        consumed = 1 + (has_value and "=" not in args[i])
        if flag in BOOL_FLAGS:
            fields[BOOL_FLAGS[flag]] = True
            consumed = 1
        elif flag in INT_FLAGS and has_value:
            try:
                fields[INT_FLAGS[flag]] = int(value)
            except ValueError:
                problems.append(f"{flag} takes an integer, got {value!r}")
        elif flag == "--kv-cache-dtype" and has_value and value != "auto":
            fields["latent_format"] = KV_CACHE_DTYPES.get(value, value)
        elif flag in ("--speculative-config", "--kv-transfer-config", "--additional-config"):
            config = _json_flag(flag, value, problems)
            if flag == "--speculative-config" and config:
                fields["speculative_method"] = str(config.get("method") or "unknown")
            elif flag == "--kv-transfer-config" and config:
                fields["kv_connector"] = str(config.get("kv_connector") or "unknown")
            elif flag == "--additional-config" and "decode_backend" in config:
                fields["decode_backend"] = str(config["decode_backend"])
        i += consumed
    if env.get("VLLM_FP8_MOE_REQUANT"):
        fields["moe_requant"] = env["VLLM_FP8_MOE_REQUANT"]
    if env.get("VLLM_FP8_MOE_REQUANT_ACT"):
        fields["moe_activation"] = env["VLLM_FP8_MOE_REQUANT_ACT"]
    return replace(requested, **fields), problems


def _json_flag(flag: str, value: str | None, problems: list[str]) -> dict:
    try:
        config = json.loads(value or "")
    except ValueError:
        problems.append(f"{flag} takes a JSON object, got {value!r}")
        return {}
    if not isinstance(config, dict):
        problems.append(f"{flag} takes a JSON object, got {value!r}")
        return {}
    return config


def render(plan: LaunchPlan) -> str:
    """The environment as ``NAME=value`` lines, then the command as ``vllm serve ...``, one flag
    per line; ``$NAME`` arguments stay for the shell of each node to expand."""
    lines = [f"{name}={_shown(name, value)}" for name, value in plan.env]
    words = [_quote(word) for word in plan.argv]
    command = " ".join(words[:3])
    parts, i = [command], 3
    while i < len(words):
        group = [words[i]]
        if i + 1 < len(words) and not plan.argv[i + 1].startswith("-"):
            group.append(words[i + 1])
        parts.append("  " + " ".join(group))
        i += len(group)
    lines.append(" \\\n".join(parts))
    return "\n".join(lines)


def launch(plan: LaunchPlan) -> None:
    """Exec vLLM (returns only by raising): the environment's ``$NAME`` arguments expanded."""
    if plan.refusals or plan.device_warnings:
        raise LaunchRefused(
            f"vLLM cannot serve {plan.deployment.model} on {plan.platform}",
            [*plan.refusals, *plan.device_warnings],
        )
    env = {**os.environ, **dict(plan.env)}
    missing = sorted({m for word in plan.argv for m in VARIABLE.findall(word) if m not in env})
    if missing:
        raise LaunchRefused(
            "the recipe needs per-node environment variables",
            [f"set ${name} on this node (see the recipe's notes)" for name in missing],
        )
    argv = [VARIABLE.sub(lambda m: env[m.group(1)], word) for word in plan.argv]
    executable = knobs.vllm_executable() or shutil.which("vllm")
    if executable is None or not os.access(executable, os.X_OK):
        raise HwrunError(
            f"vllm is not installed here (no 'vllm' on PATH); install {plan.recipe.distribution} "
            "or point HWRUN_VLLM at its vllm executable"
        )
    os.execve(executable, [executable, *argv[1:]], env)


def _quote(word: str) -> str:
    """Shell quoting that leaves a lone ``$NAME`` for the shell to expand (double quotes)."""
    if VARIABLE.fullmatch(word):
        return f'"{word}"'
    return shlex.quote(word)


def _shown(name: str, value: str) -> str:
    return "<hidden>" if name.endswith("API_KEY") else shlex.quote(value)
