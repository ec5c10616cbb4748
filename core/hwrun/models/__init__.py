"""Model configs as data: layer specs of the models hwrun plans for, by name or config.json.

Known names: kimi-k3, kimi-k3.1-pro, mistral-large-4, mistral-large-4-dspark, deepseek-v3.2.
Each module says where its numbers come from and what it had to assume.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hwrun.kv.specs import ModelSpec
from hwrun.models.deepseek import deepseek_v32
from hwrun.models.hf_config import ConfigError, load_hf_config, spec_from_hf_config
from hwrun.models.kimi import kimi_k3, kimi_k31_pro
from hwrun.models.mistral import mistral_large_4, mistral_large_4_dspark

MODELS: dict[str, Callable[[], ModelSpec]] = {
    "kimi-k3": kimi_k3,
    "kimi-k3.1-pro": kimi_k31_pro,
    "mistral-large-4": mistral_large_4,
    "mistral-large-4-dspark": mistral_large_4_dspark,
    "deepseek-v3.2": deepseek_v32,
}


class UnknownModelError(ValueError):
    """Neither a known model name nor a readable config.json; the message lists the names."""


def get_model(name_or_path: str) -> ModelSpec:
    """A known model by name, or the layer specs of a config.json (file or directory)."""
    if name_or_path in MODELS:
        return MODELS[name_or_path]()
    if Path(name_or_path).exists():
        return load_hf_config(name_or_path)
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: known models are {', '.join(MODELS)}, or give the path "
        "of a Hugging Face config.json (DeepSeek-V3.2, GLM-MoE-DSA or Kimi-Linear)"
    )


__all__ = [
    "MODELS",
    "ConfigError",
    "UnknownModelError",
    "get_model",
    "load_hf_config",
    "spec_from_hf_config",
]
