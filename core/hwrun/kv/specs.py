"""Layer state specs: what one layer of a hybrid sparse model keeps between decode steps.

A model is a tuple of :class:`LayerSpec`. Each layer may keep

- an MLA latent cache (:class:`LatentSpec`): one row per token, its width from the latent format;
- DSA index keys (:class:`IndexKeySpec`): one key per token, its width from the index-key format;
- a KDA recurrent state (:class:`KDAStateSpec`): per request, independent of the context length;
- a sliding-window cache (:class:`SlidingWindowSpec`): per request, at most ``window`` latent rows.

Cross-layer sharing is written on the consumer: a layer with ``latent_owner`` set reads that
layer's latent cache and owns none; a layer with ``indexer_owner`` set reuses that layer's
top-k and owns no index keys. Bytes per token never live here: they come from
``hwrun.formats`` (the single source of the byte layouts), through :func:`latent_row_bytes` and
:func:`index_key_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# KDA state dtypes and their element sizes (a dtype is a storage choice, not a row format).
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def latent_row_bytes(fmt: str) -> int:
    """Bytes of one token of one layer's latent cache in ``fmt`` (raises ValueError if unknown)."""
    from hwrun.formats.latent import get_latent_format

    return get_latent_format(fmt).row_bytes


def index_key_bytes(fmt: str) -> int:
    """Bytes of one token's index key in ``fmt``, scales included (ValueError if unknown)."""
    from hwrun.formats.index_keys import get_index_key_format

    return get_index_key_format(fmt).bytes_per_token


def latent_format_names() -> list[str]:
    from hwrun.formats.latent import LATENT_FORMATS

    return sorted(LATENT_FORMATS)


def index_key_format_names() -> list[str]:
    from hwrun.formats.index_keys import INDEX_KEY_FORMATS

    return sorted(INDEX_KEY_FORMATS)


@dataclass(frozen=True)
class LatentSpec:
    """The MLA latent a layer writes: 512 NoPE + 64 RoPE dims per token, stored in ``format``.

    ``nope`` marks a layer without rotary embedding; it keeps the same 576-wide row (the RoPE
    part is still stored, as in the seeds' Mistral Large 4), so it changes no byte count.
    """

    format: str  # a name of hwrun.formats.latent.LATENT_FORMATS
    nope: bool = False


@dataclass(frozen=True)
class IndexKeySpec:
    """A DSA indexer: ``heads`` x ``head_dim`` query heads, one stored key per token, top-k."""

    format: str  # a name of hwrun.formats.index_keys.INDEX_KEY_FORMATS
    heads: int
    head_dim: int = 128
    topk: int = 2048


@dataclass(frozen=True)
class KDAStateSpec:
    """A Kimi Delta Attention layer's per-request state (fla / vLLM layout).

    Recurrent state ``[HV, K, V]`` in ``state_dtype`` plus the short-convolution states of q, k
    and v, ``(conv_kernel - 1)`` columns each of ``H*K``, ``H*K`` and ``HV*V`` channels in
    ``conv_dtype``. Both are split by head under tensor parallelism.
    """

    heads: int  # H = HV: KDA uses as many key heads as value heads
    key_dim: int  # K
    value_dim: int  # V
    state_dtype: str = "float32"
    conv_kernel: int = 4
    conv_dtype: str = "bfloat16"

    def bytes_per_request(self, tp: int = 1) -> int:
        """Bytes of this layer's state for one request on one of ``tp`` GPUs."""
        heads = self.heads // tp
        recurrent = heads * self.key_dim * self.value_dim * STATE_DTYPE_BYTES[self.state_dtype]
        channels = heads * (2 * self.key_dim + self.value_dim)
        conv = channels * (self.conv_kernel - 1) * STATE_DTYPE_BYTES[self.conv_dtype]
        return recurrent + conv


@dataclass(frozen=True)
class SlidingWindowSpec:
    """A sliding-window MLA layer (e.g. a DSpark draft layer): the last ``window`` latent rows
    per request, replicated on every DCP rank (the window is too short to shard)."""

    window: int
    format: str = "bf16"

    def bytes_per_request(self) -> int:
        return self.window * latent_row_bytes(self.format)


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer. Which caches it owns follows from the fields (see module docstring)."""

    index: int
    latent: LatentSpec | None = None  # None: no full-context MLA (a KDA or sliding-window layer)
    indexer: IndexKeySpec | None = None  # None: dense MLA, or a shared-indexer layer
    kda: KDAStateSpec | None = None
    window: SlidingWindowSpec | None = None
    latent_owner: int | None = None  # reads this layer's latent cache instead of its own
    indexer_owner: int | None = None  # reuses this layer's top-k instead of running an indexer

    @property
    def owns_latent(self) -> bool:
        return self.latent is not None and self.latent_owner is None

    @property
    def owns_index_keys(self) -> bool:
        return self.indexer is not None and self.indexer_owner is None

    @property
    def is_sparse(self) -> bool:
        """Attention reads only a top-k of the context (own indexer or a shared one)."""
        return self.indexer is not None or self.indexer_owner is not None


@dataclass(frozen=True)
class ModelSpec:
    """A model as its layers, with where the description came from and what was assumed."""

    name: str
    layers: tuple[LayerSpec, ...]
    source: str = ""
    assumptions: tuple[str, ...] = field(default=())
    attention_heads: int | None = None  # query heads (TP must divide them); None: not known

    def with_formats(self, latent: str | None = None, index: str | None = None) -> ModelSpec:
        """The same model with every latent (resp. index-key) cache stored in another format.

        Sliding-window layers keep their own format: they belong to a separate draft cache.
        """
        layers = []
        for layer in self.layers:
            if latent and layer.latent is not None:
                layer = replace(layer, latent=replace(layer.latent, format=latent))
            if index and layer.indexer is not None:
                layer = replace(layer, indexer=replace(layer.indexer, format=index))
            layers.append(layer)
        return replace(self, layers=tuple(layers))

    def check(self) -> list[str]:
        """Reasons the layer list is inconsistent (owners that own nothing, bad indices)."""
        reasons = []
        by_index = {layer.index: layer for layer in self.layers}
        if sorted(by_index) != list(range(len(self.layers))):
            reasons.append(f"{self.name}: layer indices must be 0..{len(self.layers) - 1}")
        for layer in self.layers:
            owner = by_index.get(layer.latent_owner) if layer.latent_owner is not None else None
            if layer.latent_owner is not None and (owner is None or not owner.owns_latent):
                reasons.append(
                    f"{self.name}: layer {layer.index} reads the latent of layer "
                    f"{layer.latent_owner}, which owns no latent cache"
                )
            if layer.indexer_owner is not None:
                owner = by_index.get(layer.indexer_owner)
                if owner is None or not owner.owns_index_keys or owner.index >= layer.index:
                    reasons.append(
                        f"{self.name}: layer {layer.index} reuses the top-k of layer "
                        f"{layer.indexer_owner}, which is not an earlier indexer layer"
                    )
        return reasons
