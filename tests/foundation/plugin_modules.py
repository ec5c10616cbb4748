"""Writes throwaway plugin modules for loading tests."""

import textwrap
import uuid
from pathlib import Path

OP = "attn.lse_combine"  # a catalogue op: the registry refuses any other name

GOOD = """
from hwrun.hookspecs import hookimpl
from hwrun.platform import PlatformInfo, Capabilities
from hwrun.registry import OpImpl

@hookimpl
def hwrun_api_version():
    return "{api}"

@hookimpl
def hwrun_platform():
    return PlatformInfo(name="{name}", vendor="test", description="test plugin",
                        device_source="none", version="9.9")

@hookimpl
def hwrun_register_ops(registry):
    registry.register(OpImpl(op="attn.lse_combine", name="fast", platform=registry.platform,
                             fn=lambda outs, lses: (outs[0], lses[0]), priority=10))

@hookimpl
def hwrun_capabilities():
    return Capabilities(ops=frozenset({{"attn.lse_combine"}}))

@hookimpl
def hwrun_validate_deployment(deployment):
    return ["{name} refuses everything"]
"""


def write_plugin(tmp_path: Path, body: str) -> str:
    """Write ``body`` as a fresh, uniquely named module in tmp_path; return its import name."""
    # Unique across processes and across copies of this module imported under another name
    # (a counter restarts in each): a repeated name would import the cached, older module.
    name = f"hwrun_test_plugin_{uuid.uuid4().hex[:12]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def good_plugin(tmp_path: Path, name: str = "demo", api: str = "1.0") -> str:
    return write_plugin(tmp_path, GOOD.format(name=name, api=api))


def faulty_plugin(tmp_path: Path, name: str, hooks: str) -> str:
    """A plugin named ``name`` that is fine but for ``hooks`` (hook implementations as source,
    the names of GOOD's imports in scope)."""
    head = GOOD.format(name=name, api="1.1").split("@hookimpl\ndef hwrun_register_ops")[0]
    return write_plugin(tmp_path, head + textwrap.dedent(hooks))
