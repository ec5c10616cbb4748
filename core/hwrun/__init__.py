"""hwrun: the vendor-neutral core of a hardware-abstraction runtime for hybrid sparse-attention
MoE models. Op contracts and their references live here; vendors implement them in plugins."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hwrun")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0+src"

API_VERSION = "1.1"
"""The hook API version this core speaks. A plugin built for another major version is refused."""

__all__ = ["API_VERSION", "__version__"]
