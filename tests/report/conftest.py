"""Report tests describe a machine without accelerators, whatever machine runs them: the
vendor management libraries are hidden, so every vendor plugin finds no devices (as in
tests/foundation)."""

import sys
import textwrap
from pathlib import Path

import pytest

LIBRARIES = ("pynvml", "amdsmi", "tpu_info", "tpu_info.device")
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "docs" / "results"


@pytest.fixture(autouse=True)
def _no_vendor_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in LIBRARIES:
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError


# A vendor platform that finds no device and registers no impl.
EMPTY_PLUGIN = """
from hwrun.devices import NoDevices
from hwrun.hookspecs import hookimpl
from hwrun.platform import PlatformInfo

@hookimpl
def hwrun_api_version():
    return "1.1"

@hookimpl
def hwrun_platform():
    return PlatformInfo(name="{name}", vendor="test", description="registers nothing")

@hookimpl
def hwrun_devices():
    raise NoDevices("no test accelerator on this host")
"""


def write_plugin(folder: Path, name: str, extra: str = "") -> str:
    """The empty platform (plus ``extra`` hooks) as module ``name`` in ``folder``."""
    (folder / f"{name}.py").write_text(EMPTY_PLUGIN.format(name=name) + textwrap.dedent(extra))
    return name
