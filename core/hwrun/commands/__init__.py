"""One module per `hwrun` command, each a thin click layer over the library.

A command module defines one click command and does nothing on import but define it; it is
listed in :data:`hwrun.cli.COMMANDS`, which imports it when the command is used. What a command
computes lives in the library (``hwrun.kv.plan_report``, ``hwrun.registry``, ...), so it can be
used without the CLI. Exit codes: 0 success, 1 runtime failure (:class:`hwrun.errors.HwrunError`),
2 usage error (:class:`click.UsageError` and friends).
"""

from rich.console import Console


def console() -> Console:
    """The console every command prints tables to (soft wrap: tables never cut words)."""
    return Console(soft_wrap=True)
