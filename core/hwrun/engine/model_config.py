"""The architecture of a ``DeepseekV32ForCausalLM`` checkpoint, read from its ``config.json``.

Every field the engine uses is read here once, type- and range-checked, and every problem is
reported at once (``ConfigError`` lists them). Key names follow DeepSeek's released configs and
transformers' ``DeepseekV32Config``: RoPE from ``rope_parameters`` (transformers 5) or
``rope_theta`` + ``rope_scaling`` (DeepSeek's files); MoE layers from ``mlp_layer_types`` or
``first_k_dense_replace`` + ``moe_layer_freq``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwrun.errors import ReasonsError, UsageError
from hwrun.models import hf_config
from hwrun.models.hf_config import MAX_LAYERS
from hwrun.ops.indexer import INDEX_HEAD_DIM
from hwrun.ops.sparse_mla import QK_DIM, V_DIM

ARCHITECTURE = "DeepseekV32ForCausalLM"
LATENT_RANK = V_DIM  # kv_lora_rank: the latent the caches store
ROPE_DIM = QK_DIM - V_DIM  # qk_rope_head_dim


class ConfigError(ReasonsError, UsageError, hf_config.ConfigError):
    """A config.json the engine cannot run; ``reasons`` names every problem (exit 2 in the CLI:
    the user pointed hwrun at it). A kind of the planner's ConfigError: one family of errors
    for a config.json hwrun cannot read."""

    def __init__(self, path: str, reasons: list[str]):
        super().__init__(f"{path} cannot be served by hwrun's engine", reasons)


@dataclass(frozen=True)
class RopeConfig:
    """RoPE over the ``qk_rope_head_dim`` slice; ``kind`` "default" or "yarn" (DeepSeek's)."""

    theta: float
    kind: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None


@dataclass(frozen=True)
class ModelConfig:
    """What the engine needs to know of a DeepseekV32 checkpoint."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_topk: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    moe_layers: tuple[bool, ...]  # per layer: MoE (True) or dense MLP
    rms_norm_eps: float
    rope: RopeConfig
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # quantization_config.scale_fmt of a block-FP8 checkpoint: "ue8m0" (DeepSeek-V3.1 and later:
    # every scale a power of two, activations' scales too), or None (fp32 scales)
    fp8_scale_fmt: str | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + ROPE_DIM

    @property
    def softmax_scale(self) -> float:
        """MLA's score scale: ``qk_head_dim ** -0.5``, times ``mscale(mscale_all_dim) ** 2``
        under YaRN (DeepSeek's and transformers' ``yarn_apply_mscale``)."""
        scale = self.qk_head_dim**-0.5
        if self.rope.kind == "yarn" and self.rope.mscale_all_dim:
            m = yarn_mscale(self.rope.factor, self.rope.mscale_all_dim)
            scale *= m * m
        return scale


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class _Reader:
    """Reads typed fields from a config dict, collecting every problem instead of raising."""

    def __init__(self, raw: dict[str, Any]):
        self.raw = raw
        self.reasons: list[str] = []

    def integer(self, key: str, default: Any = ..., minimum: int = 1, maximum: int | None = None):
        value = self._get(key, default)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            self.reasons.append(f"{key} must be an integer, got {value!r}")
            return None
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and <= {maximum}" if maximum is not None else ""
            self.reasons.append(f"{key} must be >= {minimum}{upper}, got {value}")
            return None
        return value

    def number(self, key: str, default: Any = ..., positive: bool = True):
        value = self._get(key, default)
        if value is None:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or (positive and value <= 0):
            kind = "a positive finite number" if positive else "a finite number"
            self.reasons.append(f"{key} must be {kind}, got {value!r}")
            return None
        return float(value)

    def flag(self, key: str, default: bool):
        value = self._get(key, default)
        if not isinstance(value, bool):
            self.reasons.append(f"{key} must be true or false, got {value!r}")
            return default
        return value

    def _get(self, key: str, default: Any):
        if key in self.raw and self.raw[key] is not None:
            return self.raw[key]
        if default is ...:
            self.reasons.append(f"{key} is missing")
            return None
        return default


def parse_model_config(raw: Any, path: str = "config.json") -> ModelConfig:
    """Check and read a DeepseekV32 config dict. Raises ConfigError listing every problem."""
    if not isinstance(raw, dict):
        raise ConfigError(path, [f"expected a JSON object, got {type(raw).__name__}"])
    r = _Reader(raw)
    architectures = raw.get("architectures") or []
    if raw.get("model_type") != "deepseek_v32" and ARCHITECTURE not in architectures:
        r.reasons.append(
            f"model_type {raw.get('model_type')!r} / architectures {architectures}: the engine "
            f"runs {ARCHITECTURE} (model_type 'deepseek_v32')"
        )
    fields = {
        "vocab_size": r.integer("vocab_size"),
        "hidden_size": r.integer("hidden_size"),
        "num_layers": r.integer("num_hidden_layers", maximum=MAX_LAYERS),
        "num_heads": r.integer("num_attention_heads"),
        "q_lora_rank": r.integer("q_lora_rank"),
        "qk_nope_head_dim": r.integer("qk_nope_head_dim"),
        "v_head_dim": r.integer("v_head_dim"),
        "index_n_heads": r.integer("index_n_heads"),
        "index_topk": r.integer("index_topk"),
        "intermediate_size": r.integer("intermediate_size"),
        "moe_intermediate_size": r.integer("moe_intermediate_size"),
        "n_routed_experts": r.integer("n_routed_experts"),
        "num_experts_per_tok": r.integer("num_experts_per_tok"),
        "n_shared_experts": r.integer("n_shared_experts", 0, minimum=0),
        "n_group": r.integer("n_group", 1),
        "topk_group": r.integer("topk_group", 1),
        "routed_scaling_factor": r.number("routed_scaling_factor", 1.0),
        "norm_topk_prob": r.flag("norm_topk_prob", True),
        "rms_norm_eps": r.number("rms_norm_eps", 1e-6),
        "max_position_embeddings": r.integer("max_position_embeddings"),
        "tie_word_embeddings": r.flag("tie_word_embeddings", False),
        "bos_token_id": r.integer("bos_token_id", None, minimum=0),
    }
    for key, want in (
        ("kv_lora_rank", LATENT_RANK),
        ("qk_rope_head_dim", ROPE_DIM),
        ("index_head_dim", INDEX_HEAD_DIM),
    ):
        value = r.integer(key)
        if value is not None and value != want:
            r.reasons.append(
                f"{key} must be {want} (hwrun's latent and index-key formats), got {value}"
            )
    if r.flag("attention_bias", False):
        r.reasons.append("attention_bias true is not supported (DeepSeek's models have none)")
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        r.reasons.append(f"hidden_act must be 'silu' (SwiGLU), got {act!r}")
    scoring = raw.get("scoring_func", "sigmoid")
    if scoring != "sigmoid":
        r.reasons.append(f"scoring_func must be 'sigmoid' (DeepSeek-V3 routing), got {scoring!r}")
    fields["eos_token_ids"] = _eos_ids(raw.get("eos_token_id"), r)
    fields["fp8_scale_fmt"] = _scale_fmt(raw, r)
    fields["moe_layers"] = _moe_layers(raw, fields["num_layers"], r)
    fields["rope"] = _rope(raw, r)
    _check_moe(fields, r)
    if r.reasons:
        raise ConfigError(path, r.reasons)
    return ModelConfig(**fields)


def read_config_json(model_dir: str | Path) -> Any:
    """The checkpoint's config.json as parsed JSON (ConfigError when it cannot be read)."""
    path = Path(model_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(str(path), [f"cannot read it as JSON: {err}"]) from None


def load_model_config(model_dir: str | Path) -> ModelConfig:
    return parse_model_config(read_config_json(model_dir), str(Path(model_dir) / "config.json"))


def _scale_fmt(raw: dict[str, Any], r: _Reader) -> str | None:
    quantization = raw.get("quantization_config") or {}
    value = quantization.get("scale_fmt") if isinstance(quantization, dict) else None
    if value not in (None, "ue8m0"):
        r.reasons.append(
            f"quantization_config.scale_fmt must be 'ue8m0' or absent (fp32 scales), got {value!r}"
        )
        return None
    return value


def _eos_ids(value: Any, r: _Reader) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        r.reasons.append(f"eos_token_id must be a token id or a list of them, got {value!r}")
        return ()
    return tuple(values)


def _moe_layers(raw: dict[str, Any], num_layers: int | None, r: _Reader) -> tuple[bool, ...]:
    if num_layers is None:
        return ()
    types = raw.get("mlp_layer_types")
    if types is not None:
        if (
            not isinstance(types, list)
            or len(types) != num_layers
            or set(types) - {"dense", "sparse"}
        ):
            r.reasons.append(
                f"mlp_layer_types must list 'dense' or 'sparse' for each of {num_layers} layers"
            )
            return ()
        return tuple(t == "sparse" for t in types)
    first = r.integer("first_k_dense_replace", 0, minimum=0)
    every = r.integer("moe_layer_freq", 1)
    if first is None or every is None:
        return ()
    return tuple(i >= first and (i - first) % every == 0 for i in range(num_layers))


def _rope(raw: dict[str, Any], r: _Reader) -> RopeConfig:
    params = raw.get("rope_parameters")
    if params is None:
        params = dict(raw.get("rope_scaling") or {})
        params.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
        if "type" in params:
            params.setdefault("rope_type", params["type"])
    if not isinstance(params, dict):
        r.reasons.append(f"rope_parameters must be an object, got {params!r}")
        return RopeConfig(theta=10000.0)
    sub = _Reader(params)
    kind = params.get("rope_type", "default")
    theta = sub.number("rope_theta", 10000.0)
    if kind == "default":
        rope = RopeConfig(theta=theta or 10000.0)
    elif kind == "yarn":
        rope = RopeConfig(
            theta=theta or 10000.0,
            kind="yarn",
            factor=sub.number("factor") or 1.0,
            original_max_position_embeddings=sub.integer("original_max_position_embeddings"),
            beta_fast=sub.number("beta_fast", 32.0) or 32.0,
            beta_slow=sub.number("beta_slow", 1.0) or 1.0,
            mscale=sub.number("mscale", None),
            mscale_all_dim=sub.number("mscale_all_dim", None),
        )
    else:
        sub.reasons.append(f"rope_type {kind!r} is not supported; the engine runs default and yarn")
        rope = RopeConfig(theta=10000.0)
    r.reasons.extend(f"rope: {reason}" for reason in sub.reasons)
    return rope


def _check_moe(fields: dict[str, Any], r: _Reader) -> None:
    experts, k = fields["n_routed_experts"], fields["num_experts_per_tok"]
    groups, top_groups = fields["n_group"], fields["topk_group"]
    if None in (experts, k, groups, top_groups):
        return
    if k > experts:
        r.reasons.append(f"num_experts_per_tok {k} exceeds n_routed_experts {experts}")
    if experts % groups:
        r.reasons.append(f"n_routed_experts {experts} must be a multiple of n_group {groups}")
    if top_groups > groups:
        r.reasons.append(f"topk_group {top_groups} exceeds n_group {groups}")
    elif experts % groups == 0 and k > top_groups * (experts // groups):
        r.reasons.append(
            f"num_experts_per_tok {k} exceeds the experts of topk_group {top_groups} groups"
        )
