"""`hwrun serve`: the OpenAI-compatible server on the built-in engine, or vLLM with the platform's
recipe (``--engine vllm``)."""

from __future__ import annotations

from typing import Any

import click
from click.core import ParameterSource

from hwrun.commands.engine_flags import ENGINE_FLAGS, engine_config, engine_flags

VLLM_ONLY = ("tp", "dcp", "dp", "nodes", "ep", "decode_backend", "dry_run")
SHARED = ("model", "platform")


@click.command(context_settings={"show_default": True})
@click.option(
    "--engine",
    type=click.Choice(["hwrun", "vllm"]),
    default="hwrun",
    help="hwrun: the built-in engine; vllm: launch vLLM with the platform's recipe.",
)
@engine_flags
@click.option("--host", default="127.0.0.1", help="Address to bind (loopback unless told).")
@click.option("--port", type=int, default=8000)
@click.option(
    "--api-key",
    default=None,
    show_default=False,
    help="Require 'Authorization: Bearer KEY' on /v1 (default: HWRUN_API_KEY).",
)
@click.option("--max-queued", type=int, default=1024, help="Requests waiting; more get 503.")
@click.option(
    "--shutdown-timeout",
    type=float,
    default=30.0,
    help="Seconds SIGTERM lets running requests finish before they are aborted.",
)
@click.option("--log-level", default="info", type=click.Choice(["debug", "info", "warning"]))
@click.option("--tp", type=int, default=8, help="[vllm] Tensor parallel size.")
@click.option("--dcp", type=int, default=1, help="[vllm] Decode context parallel size.")
@click.option("--dp", type=int, default=1, help="[vllm] Data parallel size.")
@click.option("--nodes", type=int, default=1, help="[vllm] Hosts the TP x DP ranks span.")
@click.option("--ep", is_flag=True, help="[vllm] Expert parallel MoE.")
@click.option(
    "--decode-backend",
    default="default",
    help="[vllm] 'latency_specialized': AMD's fused decode for 1-4 requests (TP4, a4w4).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="[vllm] Print the environment and the vllm serve command; launch nothing.",
)
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def serve(ctx: click.Context, engine: str, vllm_args: tuple[str, ...], **options: Any) -> None:
    """Serve a model over an OpenAI-compatible API.

    With the built-in engine (default: the embedded model): /v1/models, /v1/completions,
    /v1/chat/completions, /health, /metrics. With --engine vllm: vLLM started with the
    platform plugin's recipe after the deployment checks pass; vLLM flags of your own go after
    `--` (for example `hwrun serve --engine vllm --platform amd --model M -- --max-model-len
    32768`).
    """
    from hwrun import knobs

    given = {name for name in options if _given(ctx, name)}
    options["api_key"] = options["api_key"] or knobs.api_key()
    if engine == "vllm":
        engine_only = sorted(given & set(ENGINE_FLAGS) - set(SHARED))
        if engine_only:
            raise click.UsageError(
                f"{_flags(engine_only)} configure the built-in engine; with --engine vllm pass "
                "vLLM's own flags after --"
            )
        _serve_vllm(vllm_args, options)
        return
    vllm_only = sorted(given & set(VLLM_ONLY))
    if vllm_only or vllm_args:
        raise click.UsageError(
            f"{_flags(vllm_only) or ' '.join(vllm_args)} only apply to --engine vllm"
        )
    _serve_builtin(options)


def _serve_builtin(options: dict[str, Any]) -> None:
    from hwrun.engine.async_engine import AsyncEngine
    from hwrun.serve.server import make_server

    engine = AsyncEngine(engine_config(options), max_queued=options["max_queued"])
    make_server(
        engine,
        host=options["host"],
        port=options["port"],
        api_key=options["api_key"],
        shutdown_timeout=options["shutdown_timeout"],
        log_level=options["log_level"],
    ).run()


def _serve_vllm(vllm_args: tuple[str, ...], options: dict[str, Any]) -> None:
    from hwrun.deployment import Deployment
    from hwrun.plugins import load_plugins
    from hwrun.serve.launcher import LaunchRefused, launch, plan_launch, render

    if not options["model"]:
        raise click.UsageError("--engine vllm needs --model: a Hugging Face id or a local path")
    plugins = load_plugins()
    platform = plugins.choose_platform(options["platform"])
    requested = Deployment(
        model=options["model"],
        tensor_parallel=options["tp"],
        decode_context_parallel=options["dcp"],
        data_parallel=options["dp"],
        nodes=options["nodes"],
        expert_parallel=options["ep"],
        decode_backend=options["decode_backend"],
    )
    plan = plan_launch(
        plugins,
        platform,
        requested,
        list(vllm_args),
        host=options["host"],
        port=options["port"],
        api_key=options["api_key"],
    )
    if plan.refusals:
        raise LaunchRefused(
            f"vLLM cannot serve {requested.model} on {platform}", list(plan.refusals)
        )
    if options["dry_run"]:
        for warning in plan.device_warnings:
            click.echo(f"warning: not satisfied on this machine: {warning}", err=True)
        for note in plan.recipe.notes:
            click.echo(f"note: {note}", err=True)
        click.echo(f"# platform {platform}; vllm from: pip install {plan.recipe.distribution}")
        click.echo(render(plan))
        return
    launch(plan)


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)


def _flags(names: list[str]) -> str:
    return ", ".join("--" + name.replace("_", "-") for name in names)


# --engine vllm takes a Hugging Face id as well as a directory; the built-in engine refuses a
# directory that does not exist when it reads its config.
next(param for param in serve.params if param.name == "model").type = click.STRING
