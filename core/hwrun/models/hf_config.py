"""Layer specs from a Hugging Face ``config.json``: DeepSeek-V3.2, GLM-MoE-DSA, Kimi-Linear.

Key names follow the public checkpoints and transformers' config classes:

- ``deepseek_v32`` (DeepseekV32ForCausalLM): ``num_hidden_layers``, ``kv_lora_rank``,
  ``qk_rope_head_dim``, ``index_n_heads``, ``index_head_dim``, ``index_topk``; every layer is
  MLA with an indexer.
- ``glm_moe_dsa`` (GlmMoeDsaForCausalLM): the same keys, plus per-layer ``indexer_types``
  (``"full"`` runs the indexer, ``"shared"`` reuses the previous full layer's top-k), or
  ``index_topk_pattern`` (``"F"``/``"S"`` per layer), or ``index_topk_freq`` with
  ``index_skip_topk_offset`` (transformers' rule; all layers full by default).
- ``kimi_linear`` (KimiLinearForCausalLM): ``linear_attn_config`` with 1-indexed
  ``full_attn_layers`` and ``kda_layers``, ``num_heads``, ``head_dim``,
  ``short_conv_kernel_size``; the full layers are dense MLA (``mla_use_nope``: NoPE).

A multimodal wrapper's ``text_config`` is read when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hwrun.kv.specs import IndexKeySpec, KDAStateSpec, LatentSpec, LayerSpec, ModelSpec

DSA_MODEL_TYPES = {"deepseek_v32", "glm_moe_dsa"}
ARCHITECTURES = {
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "KimiLinearForCausalLM": "kimi_linear",
}
LATENT_WIDTH = 576  # the latent formats store 512 NoPE + 64 RoPE dims


class ConfigError(ValueError):
    """A config.json hwrun cannot turn into layer specs; the message says which key and why."""


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def model_type_of(config: dict[str, Any]) -> str:
    config = _text_config(config)
    model_type = config.get("model_type")
    if model_type in DSA_MODEL_TYPES | {"kimi_linear"}:
        return model_type
    for arch in config.get("architectures") or ():
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    known = ", ".join(sorted(ARCHITECTURES))
    raise ConfigError(
        f"config.json of model_type {model_type!r} / architectures "
        f"{config.get('architectures')}: hwrun reads {known}"
    )


def _require(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise ConfigError(f"config.json has no {key!r}, needed to size the KV cache")
    return config[key]


def _latent(config: dict[str, Any], fmt: str, nope: bool = False) -> LatentSpec:
    width = _require(config, "kv_lora_rank") + _require(config, "qk_rope_head_dim")
    if width != LATENT_WIDTH:
        raise ConfigError(
            f"kv_lora_rank + qk_rope_head_dim = {width}; the latent formats store {LATENT_WIDTH}"
        )
    return LatentSpec(format=fmt, nope=nope)


def _indexer_types(config: dict[str, Any], num_layers: int) -> list[str]:
    types = config.get("indexer_types")
    if types is None and config.get("index_topk_pattern") is not None:
        pattern = config["index_topk_pattern"]
        types = (
            [{"F": "full", "S": "shared"}[c] for c in pattern]
            if isinstance(pattern, str)
            else pattern
        )
    if types is None:
        freq = max(config.get("index_topk_freq", 1), 1)
        offset = config.get("index_skip_topk_offset", 2)
        types = [
            "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)
        ]
    if len(types) != num_layers or set(types) - {"full", "shared"} or types[0] != "full":
        raise ConfigError(
            f"indexer types must list 'full' or 'shared' for each of {num_layers} layers, the "
            f"first 'full'; got {types}"
        )
    return list(types)


def _dsa_spec(
    config: dict[str, Any], name: str, latent_format: str, index_format: str
) -> ModelSpec:
    num_layers = _require(config, "num_hidden_layers")
    indexer = IndexKeySpec(
        format=index_format,
        heads=_require(config, "index_n_heads"),
        head_dim=_require(config, "index_head_dim"),
        topk=_require(config, "index_topk"),
    )
    latent = _latent(config, latent_format)
    types = _indexer_types(config, num_layers)
    layers, last_full = [], 0
    for index, kind in enumerate(types):
        if kind == "full":
            last_full = index
            layers.append(LayerSpec(index=index, latent=latent, indexer=indexer))
        else:
            layers.append(LayerSpec(index=index, latent=latent, indexer_owner=last_full))
    return ModelSpec(name, tuple(layers), source="config.json")


def _kimi_linear_spec(config: dict[str, Any], name: str, latent_format: str) -> ModelSpec:
    num_layers = _require(config, "num_hidden_layers")
    linear = _require(config, "linear_attn_config")
    full = {layer - 1 for layer in _require(linear, "full_attn_layers")}  # 1-indexed in the file
    kda_layers = {layer - 1 for layer in _require(linear, "kda_layers")}
    if full & kda_layers or full | kda_layers != set(range(num_layers)):
        raise ConfigError(
            "linear_attn_config: full_attn_layers and kda_layers (1-indexed) must split layers "
            f"1..{num_layers} between them"
        )
    head_dim = _require(linear, "head_dim")
    kda = KDAStateSpec(
        heads=_require(linear, "num_heads"),
        key_dim=head_dim,
        value_dim=head_dim,
        conv_kernel=linear.get("short_conv_kernel_size", 4),
    )
    latent = _latent(config, latent_format, nope=bool(config.get("mla_use_nope", False)))
    layers = tuple(
        LayerSpec(index=i, latent=latent) if i in full else LayerSpec(index=i, kda=kda)
        for i in range(num_layers)
    )
    return ModelSpec(name, layers, source="config.json")


def spec_from_hf_config(
    config: dict[str, Any],
    name: str = "config.json",
    latent_format: str | None = None,
    index_format: str = "fp8",
) -> ModelSpec:
    """Layer specs of a Hugging Face config. Latent default: fp8_ds_mla for the DSA models (the
    FlashMLA sparse cache), bf16 for Kimi-Linear (vLLM's default cache dtype)."""
    model_type = model_type_of(config)
    config = _text_config(config)
    if model_type == "kimi_linear":
        return _kimi_linear_spec(config, name, latent_format or "bf16")
    return _dsa_spec(config, name, latent_format or "fp8_ds_mla", index_format)


def load_hf_config(path: str | Path) -> ModelSpec:
    """Layer specs from a config.json file, or a directory holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read {path} as a config.json: {err}") from None
    return spec_from_hf_config(config, name=str(path))
