"""`hwrun generate`: complete prompts with the built-in engine and print the completions."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from hwrun.commands import console
from hwrun.commands.engine_flags import engine_config, engine_flags


@click.command()
@click.argument("prompts", nargs=-1, required=True)
@engine_flags
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True, help="0: off.")
@click.option("--min-p", type=float, default=0.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Seed of every prompt's sampling.")
@click.option("--stop", multiple=True, help="A stop string (repeatable).")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past the eos token.")
@click.option("--logprobs", type=int, default=None, help="Top-N logprobs of each token.")
@click.option(
    "--token-ids",
    is_flag=True,
    help="Each PROMPT is token ids separated by commas or spaces (models without a tokenizer).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per prompt.")
def generate(prompts: tuple[str, ...], **options: Any) -> None:
    """Complete each PROMPT with the built-in engine (default: the embedded model)."""
    from hwrun.engine.errors import PromptError
    from hwrun.engine.llm import LLM
    from hwrun.engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(
            max_tokens=options["max_tokens"],
            temperature=options["temperature"],
            top_p=options["top_p"],
            top_k=options["top_k"],
            min_p=options["min_p"],
            seed=options["seed"],
            stop=options["stop"],
            ignore_eos=options["ignore_eos"],
            logprobs=options["logprobs"],
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    requests = [_token_ids(p) for p in prompts] if options["token_ids"] else list(prompts)
    out = console()
    llm = LLM.from_config(engine_config(options))
    Console(stderr=True, soft_wrap=True).print(_op_summary(llm.op_table), highlight=False)
    try:
        if options["token_ids"]:
            outputs = llm.generate(prompt_token_ids=requests, sampling_params=params)
        else:
            outputs = llm.generate(requests, params)
    except PromptError as err:
        hint = "" if llm.tokenizer or options["token_ids"] else " (with --token-ids: '1,2,3')"
        raise click.BadParameter(f"{err}{hint}", param_hint="PROMPT") from err
    finally:
        llm.engine.close()
    for request, output in zip(requests, outputs, strict=True):
        completion = output.outputs[0]
        if options["as_json"]:
            click.echo(json.dumps(asdict(output), default=str))
            continue
        if isinstance(request, str):
            shown = f"[bold]{escape(request)}[/bold]{escape(completion.text)}"
        else:
            shown = f"[bold]{request}[/bold] -> {completion.token_ids}"
        out.print(shown, highlight=False)
        out.print(
            f"[dim]({len(completion.token_ids)} tokens, {completion.finish_reason})[/dim]",
            highlight=False,
        )


def _token_ids(prompt: str) -> list[int]:
    try:
        return [int(part) for part in prompt.replace(",", " ").split()]
    except ValueError as err:
        raise click.BadParameter(
            f"{prompt!r} is not a list of token ids (integers separated by commas or spaces)",
            param_hint="PROMPT",
        ) from err


def _op_summary(op_table: list) -> str:
    """One line: how many ops the platform serves itself, and which fall back."""
    fallbacks = [choice.op for choice in op_table if choice.fallback]
    platforms = sorted({choice.platform for choice in op_table if not choice.fallback})
    served_by = ", ".join(platforms) or "no platform"
    line = f"{len(op_table) - len(fallbacks)} of {len(op_table)} ops served by {served_by}"
    if fallbacks:
        line += f"; on the reference fallback: {', '.join(fallbacks)}"
    return line
