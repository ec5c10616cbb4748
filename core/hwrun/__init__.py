"""hwrun: the vendor-neutral core of a hardware-abstraction runtime for hybrid sparse-attention
MoE models. Op contracts and their references live here; vendors implement them in plugins."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hwrun")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0+src"

API_VERSION = "1.1"
"""The hook API version this core speaks. A plugin built for another major version is refused."""

__all__ = ["API_VERSION", "LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    """``hwrun.LLM`` and ``hwrun.SamplingParams``, imported on first use: ``import hwrun``
    stays cheap for the CLI and the plugins."""
    if name == "LLM":
        from hwrun.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from hwrun.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'hwrun' has no attribute {name!r}")
