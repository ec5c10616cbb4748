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


# Bounds on what a real checkpoint holds, so a typo (1e9 layers) is refused instead of planned.
MAX_LAYERS = 1024
MAX_DIM = 1 << 20


class ConfigError(ValueError):
    """A config.json hwrun cannot turn into layer specs; the message says which key and why."""


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    if text is None:
        return config
    if not isinstance(text, dict):
        raise ConfigError(f"text_config must be a JSON object, got {_kind(text)}")
    return {**config, **text}


def model_type_of(config: dict[str, Any]) -> str:
    config = _text_config(_object(config))
    model_type = config.get("model_type")
    if model_type in DSA_MODEL_TYPES | {"kimi_linear"}:
        return model_type
    architectures = config.get("architectures") or ()
    if not isinstance(architectures, list):
        raise ConfigError(f"architectures must be a list of names, got {_kind(architectures)}")
    for arch in architectures:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    known = ", ".join(sorted(ARCHITECTURES))
    raise ConfigError(
        f"config.json of model_type {model_type!r} / architectures "
        f"{config.get('architectures')}: hwrun reads {known}"
    )


def _object(config: Any) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ConfigError(
            f"config.json must hold a JSON object ({{...}}), got {_kind(config)}; give the "
            "model's Hugging Face config.json"
        )
    return config


def _kind(value: Any) -> str:
    """How a JSON value reads to a person: 'the string "61"', 'null', 'the number 61.0'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    return f"a JSON {'array' if isinstance(value, list) else 'object'}"


def _int(
    config: dict[str, Any],
    key: str,
    *,
    minimum: int = 1,
    maximum: int = MAX_DIM,
    default: int | None = None,
    where: str = "config.json",
) -> int:
    """An integer field in [minimum, maximum]; JSON strings, floats, booleans and null are
    refused by name (``"61"``, ``61.0``, ``true`` are not layer counts)."""
    if key not in config:
        if default is not None:
            return default
        raise ConfigError(f"{where} has no {key!r}, needed to size the KV cache")
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be an integer, got {_kind(value)}")
    if not minimum <= value <= maximum:
        raise ConfigError(f"{where}: {key} must be between {minimum} and {maximum}, got {value}")
    return value


def _latent(config: dict[str, Any], fmt: str, nope: bool = False) -> LatentSpec:
    width = _int(config, "kv_lora_rank") + _int(config, "qk_rope_head_dim")
    if width != LATENT_WIDTH:
        raise ConfigError(
            f"kv_lora_rank + qk_rope_head_dim = {width}; the latent formats store {LATENT_WIDTH}"
        )
    return LatentSpec(format=fmt, nope=nope)


def _indexer_types(config: dict[str, Any], num_layers: int) -> list[str]:
    types = config.get("indexer_types")
    if types is None and config.get("index_topk_pattern") is not None:
        pattern = config["index_topk_pattern"]
        if isinstance(pattern, str):
            unknown = sorted(set(pattern) - {"F", "S"})
            if unknown:
                raise ConfigError(
                    f"index_topk_pattern may hold only 'F' (full) and 'S' (shared), got {unknown}"
                )
            types = [{"F": "full", "S": "shared"}[c] for c in pattern]
        else:
            types = pattern
    if types is None:
        freq = _int(config, "index_topk_freq", default=1, maximum=MAX_LAYERS)
        offset = _int(config, "index_skip_topk_offset", minimum=0, default=2, maximum=MAX_LAYERS)
        types = [
            "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)
        ]
    if (
        not isinstance(types, list)
        or len(types) != num_layers
        or not all(isinstance(t, str) for t in types)
        or set(types) - {"full", "shared"}
        or types[0] != "full"
    ):
        raise ConfigError(
            f"indexer types must list 'full' or 'shared' for each of {num_layers} layers, the "
            f"first 'full'; got {types}"
        )
    return list(types)


def _num_layers(config: dict[str, Any]) -> int:
    return _int(config, "num_hidden_layers", maximum=MAX_LAYERS)


def _attention_heads(config: dict[str, Any]) -> int | None:
    """The query heads, when the config gives them (TP must divide them)."""
    if config.get("num_attention_heads") is None:
        return None
    return _int(config, "num_attention_heads")


def _dsa_spec(
    config: dict[str, Any], name: str, latent_format: str, index_format: str
) -> ModelSpec:
    num_layers = _num_layers(config)
    indexer = IndexKeySpec(
        format=index_format,
        heads=_int(config, "index_n_heads"),
        head_dim=_int(config, "index_head_dim"),
        topk=_int(config, "index_topk"),
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
    return ModelSpec(
        name, tuple(layers), source="config.json", attention_heads=_attention_heads(config)
    )


def _layer_numbers(linear: dict[str, Any], key: str, num_layers: int) -> set[int]:
    """A 1-indexed layer list of linear_attn_config, as 0-indexed layers."""
    if key not in linear:
        raise ConfigError(f"linear_attn_config has no {key!r}, needed to size the KV cache")
    numbers = linear[key]
    if not isinstance(numbers, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= num_layers for n in numbers
    ):
        raise ConfigError(
            f"linear_attn_config: {key} must list layer numbers 1..{num_layers}, got "
            f"{_kind(numbers) if not isinstance(numbers, list) else numbers}"
        )
    return {n - 1 for n in numbers}


def _kimi_linear_spec(config: dict[str, Any], name: str, latent_format: str) -> ModelSpec:
    num_layers = _num_layers(config)
    linear = config.get("linear_attn_config")
    if not isinstance(linear, dict):
        raise ConfigError(
            f"linear_attn_config must be a JSON object (the KDA layers' shape), got {_kind(linear)}"
        )
    full = _layer_numbers(linear, "full_attn_layers", num_layers)
    kda_layers = _layer_numbers(linear, "kda_layers", num_layers)
    if full & kda_layers or full | kda_layers != set(range(num_layers)):
        raise ConfigError(
            "linear_attn_config: full_attn_layers and kda_layers (1-indexed) must split layers "
            f"1..{num_layers} between them"
        )
    where = "linear_attn_config"
    head_dim = _int(linear, "head_dim", where=where)
    kda = KDAStateSpec(
        heads=_int(linear, "num_heads", where=where),
        key_dim=head_dim,
        value_dim=head_dim,
        conv_kernel=_int(linear, "short_conv_kernel_size", default=4, maximum=64, where=where),
    )
    nope = config.get("mla_use_nope", False)
    if not isinstance(nope, bool):
        raise ConfigError(f"mla_use_nope must be true or false, got {_kind(nope)}")
    latent = _latent(config, latent_format, nope=nope)
    layers = tuple(
        LayerSpec(index=i, latent=latent) if i in full else LayerSpec(index=i, kda=kda)
        for i in range(num_layers)
    )
    return ModelSpec(name, layers, source="config.json", attention_heads=_attention_heads(config))


def spec_from_hf_config(
    config: dict[str, Any],
    name: str = "config.json",
    latent_format: str | None = None,
    index_format: str = "fp8",
) -> ModelSpec:
    """Layer specs of a Hugging Face config. Latent default: fp8_ds_mla for the DSA models (the
    FlashMLA sparse cache), bf16 for Kimi-Linear (vLLM's default cache dtype)."""
    model_type = model_type_of(config)
    config = _text_config(_object(config))
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
