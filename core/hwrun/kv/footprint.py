"""Bytes of KV state per GPU, by component, under tensor and decode context parallelism.

Under TP the MLA latent and the index keys are replicated on every GPU (MLA keeps one latent
head); DCP shards both by token (GPU r of W stores every W-th token), so per global token a GPU
holds 1/W of them. KDA state is split by head over TP; a sliding-window cache is replicated on
every rank. DCP runs inside the TP group, so W must divide the TP size.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwrun.kv.errors import PlanError
from hwrun.kv.specs import ModelSpec, index_key_bytes, latent_row_bytes


@dataclass(frozen=True)
class Footprint:
    """Per-GPU bytes of one model at one TP / DCP size.

    ``*_bytes_per_token`` count one token stored on this GPU (a local token: under DCP a GPU
    stores every ``dcp``-th token); :meth:`per_global_token` divides by ``dcp``.
    """

    model: str
    tp: int
    dcp: int
    latent_bytes_per_token: int  # summed over the layers that own a latent cache
    index_bytes_per_token: int  # summed over the layers that own index keys
    kda_bytes_per_request: int  # all KDA layers, this GPU's heads
    window_bytes_per_request: int  # all sliding-window layers, replicated
    latent_layers: int
    index_layers: int
    kda_layers: int
    window_layers: int

    @property
    def bytes_per_token(self) -> int:
        """Bytes of one locally stored token, all per-token caches together."""
        return self.latent_bytes_per_token + self.index_bytes_per_token

    def per_global_token(self) -> dict[str, float]:
        """Bytes per token of the context per GPU, by component plus ``total``."""

        def exact(value: int) -> float:
            share = value / self.dcp
            return int(share) if share.is_integer() else share

        return {
            "latent": exact(self.latent_bytes_per_token),
            "index_keys": exact(self.index_bytes_per_token),
            "total": exact(self.bytes_per_token),
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def parallel_reasons(model: ModelSpec, tp: int, dcp: int) -> list[str]:
    """Every reason ``model`` cannot run at this TP / DCP size (empty when it can)."""
    reasons = []
    if tp < 1 or dcp < 1:
        reasons.append(f"TP and DCP sizes must be at least 1 (got --tp {tp} --dcp {dcp})")
        return reasons
    if tp % dcp:
        reasons.append(
            f"DCP size {dcp} must divide the TP size {tp}: the DCP group is carved out of the "
            f"TP group (at --tp {tp} use --dcp {' / '.join(str(d) for d in _divisors(tp))}, "
            f"or raise --tp to {dcp * ((tp + dcp - 1) // dcp)})"
        )
    kda_heads = sorted({layer.kda.heads for layer in model.layers if layer.kda is not None})
    for heads in kda_heads:
        if heads % tp:
            reasons.append(
                f"KDA state is split by head: {heads} KDA heads do not divide over TP {tp}"
            )
    return reasons


def format_reasons(model: ModelSpec) -> list[str]:
    """Reasons a layer names a latent or index-key format hwrun.formats does not know."""
    reasons = []
    latent = sorted({layer.latent.format for layer in model.layers if layer.latent})
    latent += sorted({layer.window.format for layer in model.layers if layer.window})
    for fmt in dict.fromkeys(latent):
        try:
            latent_row_bytes(fmt)
        except ValueError as err:
            reasons.append(f"latent format: {err}")
    for fmt in sorted({layer.indexer.format for layer in model.layers if layer.indexer}):
        try:
            index_key_bytes(fmt)
        except ValueError as err:
            reasons.append(f"index-key format: {err}")
    for layer in model.layers:
        if layer.indexer is not None and layer.indexer.head_dim != 128:
            reasons.append(
                f"layer {layer.index}: index keys of {layer.indexer.head_dim} dims; the "
                "index-key formats store 128"
            )
            break
    return reasons


def footprint(model: ModelSpec, tp: int = 1, dcp: int = 1) -> Footprint:
    """Bytes per GPU of ``model`` at TP ``tp`` and DCP ``dcp``; PlanError lists every problem."""
    reasons = model.check() + parallel_reasons(model, tp, dcp) + format_reasons(model)
    if reasons:
        raise PlanError(f"{model.name} at TP{tp} DCP{dcp}", reasons)
    layers = model.layers
    latent = [latent_row_bytes(x.latent.format) for x in layers if x.owns_latent]
    index = [index_key_bytes(x.indexer.format) for x in layers if x.owns_index_keys]
    kda = [x.kda.bytes_per_request(tp) for x in layers if x.kda is not None]
    window = [x.window.bytes_per_request() for x in layers if x.window is not None]
    return Footprint(
        model=model.name,
        tp=tp,
        dcp=dcp,
        latent_bytes_per_token=sum(latent),
        index_bytes_per_token=sum(index),
        kda_bytes_per_request=sum(kda),
        window_bytes_per_request=sum(window),
        latent_layers=len(latent),
        index_layers=len(index),
        kda_layers=len(kda),
        window_layers=len(window),
    )
