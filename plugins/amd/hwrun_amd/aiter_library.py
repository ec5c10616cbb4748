"""Finding AMD's AITER (PyPI ``amd-aiter``, imported as ``aiter``) and its functions.

The PyPI name ``aiter`` belongs to an unrelated package that also imports as ``aiter``, so an
import that succeeds is not enough: AMD's library is recognised by its public API (every
adapter calls ``aiter.top_k_per_row_prefill`` or a module beside it). Functions are looked up
by their public module path, and where a release moved one (the Triton MQA-logits modules went
from ``aiter.ops.triton.<name>`` to ``aiter.ops.triton.attention.<name>`` in January 2026)
every known path is tried in order, newest first.

AITER is imported when the AMD plugin registers its ops, and only when ``aiter`` can be found,
so a machine without it pays nothing; on a ROCm host with it the import happens once.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from functools import cache
from typing import Any

from hwrun.registry import OpImpl, OpRegistry, OpSpec

AMD_AITER_PROBE = "top_k_per_row_prefill"  # in AMD's aiter namespace, in no other "aiter"
INSTALL = "pip install amd-aiter (AMD's AITER; the PyPI package named 'aiter' is unrelated)"


@cache
def aiter_problem() -> str | None:
    """Why AMD's AITER cannot be used here, or None when it imports and is AMD's."""
    if importlib.util.find_spec("aiter") is None:
        return f"AITER is not installed: {INSTALL}"
    try:
        import aiter
    except Exception as exc:  # a broken install must not break the plugin
        return f"AITER is installed but failed to import ({type(exc).__name__}: {exc})"
    if not hasattr(aiter, AMD_AITER_PROBE):
        return (
            f"the module 'aiter' here is not AMD's AITER (it has no aiter.{AMD_AITER_PROBE}): "
            + INSTALL
        )
    return None


def aiter_function(*paths: str) -> Callable[..., Any]:
    """The first of ``module:name`` paths that imports, e.g.
    ``aiter_function("aiter.ops.triton.attention.x:f", "aiter.ops.triton.x:f")``.

    :raises ImportError: naming every path tried, when none has the function.
    """
    tried = []
    for path in paths:
        module_name, _, name = path.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            tried.append(f"{path} ({exc})")
            continue
        if hasattr(module, name):
            return getattr(module, name)
        tried.append(f"{path} (no {name})")
    raise ImportError(
        "this AITER release has none of the known paths of the function: " + "; ".join(tried)
    )


# (op, fn, validate, description) of one adapter; each aiter_* module lists its own in ADAPTERS.
Adapter = tuple[str, Callable[..., Any], Callable[[OpSpec], list[str]], str]


def register_adapters(registry: OpRegistry, adapters: tuple[Adapter, ...], priority: int) -> None:
    """Register each adapter as the platform's "aiter" impl of its op."""
    for op, fn, validate, description in adapters:
        registry.register(
            OpImpl(
                op=op,
                name="aiter",
                platform=registry.platform,
                fn=fn,
                validate=validate,
                priority=priority,
                description=description + "; not validated on hardware",
            )
        )
