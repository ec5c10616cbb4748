"""The packed block cache: one block of the cache is one contiguous row of bytes.

A row holds, for every layer that owns a per-token cache, that block's latent page and
index-key page, one after the other (layer order, latent first). Pages have different sizes;
each is ``block_size / kernel_block_size`` kernel pages (the fixed-size pages the attention and
indexer kernels expect, 64 tokens by default), each kernel page starting on ``alignment``.
A request's per-request state (KDA states, sliding windows) takes whole rows from the same pool,
so the row must hold at least one KDA layer state: that sets the smallest block size, and the
block size is a power of two so blocks planned for different TP sizes divide evenly (prefill and
decode instances can pair blocks for KV transfer). A block is one byte range
(:meth:`PackedLayout.block_byte_range`): a prefill-to-decode transfer is one read per block.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwrun.kv.errors import PlanError
from hwrun.kv.footprint import Footprint, footprint
from hwrun.kv.specs import ModelSpec, index_key_bytes, latent_row_bytes

LATENT = "latent"
INDEX_KEYS = "index_keys"
DEFAULT_KERNEL_BLOCK_SIZE = 64  # FlashMLA sparse and DeepGEMM's paged indexer read 64-token pages
DEFAULT_ALIGNMENT = 256  # >= TMA's 16 B and a 128 B swizzle line; keeps int32 page ids small


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _is_pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class Page:
    """One (layer, kind) page of a row: ``block_size`` tokens as consecutive kernel pages."""

    layer: int
    kind: str  # LATENT or INDEX_KEYS
    format: str
    token_bytes: int  # bytes of one token in this page's format
    offset: int  # byte offset of the page inside the row
    size: int  # bytes the page occupies, alignment padding included
    kernel_page_bytes: int  # kernel_block_size * token_bytes: what a kernel reads per page
    kernel_page_stride: int  # kernel_page_bytes rounded up to the alignment

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class PackedLayout:
    """Where every byte of one row lives, for one model at one TP / DCP size (per GPU)."""

    model: str
    tp: int
    dcp: int
    block_size: int  # tokens per block (local tokens under DCP), a power of two
    kernel_block_size: int  # tokens per kernel page
    alignment: int  # every page and kernel page starts on a multiple of this
    row_bytes: int
    pages: tuple[Page, ...]
    kda_state_stride: int  # bytes a KDA layer state takes in a row (0: no KDA layers)
    state_rows_per_request: int  # rows one request's KDA states and windows take
    footprint: Footprint

    @property
    def padding_bytes(self) -> int:
        """Bytes of a row that hold no token: alignment padding."""
        return self.row_bytes - self.block_size * self.footprint.bytes_per_token

    @property
    def padding_fraction(self) -> float:
        return self.padding_bytes / self.row_bytes

    @property
    def kda_states_per_row(self) -> int:
        return self.row_bytes // self.kda_state_stride if self.kda_state_stride else 0

    @property
    def kernel_page_unit(self) -> int:
        """Stride of the uniform kernel-page pool: kernel page id = byte address / unit."""
        return self.alignment

    def page(self, layer: int, kind: str) -> Page:
        for page in self.pages:
            if page.layer == layer and page.kind == kind:
                return page
        owners = sorted({p.layer for p in self.pages if p.kind == kind})
        raise ValueError(
            f"layer {layer} owns no {kind} page in the {self.model} layout; layers with one: "
            f"{owners}"
        )

    def block_byte_range(self, block: int) -> tuple[int, int]:
        """Byte range [start, stop) of ``block`` in the flat cache: one read moves the block."""
        if block < 0:
            raise ValueError(f"block must be >= 0, got {block}")
        return block * self.row_bytes, (block + 1) * self.row_bytes

    def kda_state_offset(self, ordinal: int) -> tuple[int, int]:
        """Where the ``ordinal``-th KDA layer's state of a request lives: (which of the
        request's state rows, byte offset in that row). States never straddle rows."""
        if not 0 <= ordinal < self.footprint.kda_layers:
            raise ValueError(
                f"KDA ordinal must be in [0, {self.footprint.kda_layers}), got {ordinal}"
            )
        per_row = self.kda_states_per_row
        return ordinal // per_row, (ordinal % per_row) * self.kda_state_stride


def _layout_reasons(kernel_block_size: int, alignment: int, block_size: int | None) -> list[str]:
    reasons = []
    if not _is_pow2(kernel_block_size):
        reasons.append(f"kernel block size must be a power of two, got {kernel_block_size}")
    if not _is_pow2(alignment) or alignment < 16:
        reasons.append(f"alignment must be a power of two >= 16 bytes, got {alignment}")
    if block_size is not None and not _is_pow2(block_size):
        reasons.append(f"block size must be a power of two, got {block_size}")
    elif block_size is not None and _is_pow2(kernel_block_size) and block_size < kernel_block_size:
        reasons.append(
            f"block size {block_size} is smaller than the kernel page of {kernel_block_size} tokens"
        )
    return reasons


def _pages(model: ModelSpec, block_size: int, kernel_block_size: int, alignment: int) -> list[Page]:
    pages, offset = [], 0
    for layer in model.layers:
        parts = []
        if layer.owns_latent:
            parts.append((LATENT, layer.latent.format, latent_row_bytes(layer.latent.format)))
        if layer.owns_index_keys:
            fmt = layer.indexer.format
            parts.append((INDEX_KEYS, fmt, index_key_bytes(fmt)))
        for kind, fmt, token_bytes in parts:
            kernel_bytes = kernel_block_size * token_bytes
            stride = _round_up(kernel_bytes, alignment)
            size = stride * (block_size // kernel_block_size)
            pages.append(
                Page(layer.index, kind, fmt, token_bytes, offset, size, kernel_bytes, stride)
            )
            offset += size
    return pages


def _window_page_strides(model: ModelSpec, kb: int, alignment: int) -> list[tuple[int, int]]:
    """(kernel pages, page stride) of each sliding-window layer's per-request ring."""
    return [
        (
            -(-layer.window.window // kb),
            _round_up(kb * latent_row_bytes(layer.window.format), alignment),
        )
        for layer in model.layers
        if layer.window is not None
    ]


def _state_rows(row_bytes: int, kda_stride: int, kda_layers: int, windows: list) -> int:
    """Rows one request's state takes: KDA states packed whole into rows, then each window's
    kernel pages packed whole into rows of their own."""
    rows = -(-kda_layers // (row_bytes // kda_stride)) if kda_layers else 0
    for pages, stride in windows:
        rows += -(-pages // (row_bytes // stride))
    return rows


def plan_packed_layout(
    model: ModelSpec,
    tp: int = 1,
    dcp: int = 1,
    *,
    kernel_block_size: int = DEFAULT_KERNEL_BLOCK_SIZE,
    alignment: int = DEFAULT_ALIGNMENT,
    block_size: int | None = None,
) -> PackedLayout:
    """Plan the packed row of ``model`` at TP ``tp`` / DCP ``dcp``.

    The block size is ``block_size`` when given, else the smallest power of two of at least
    ``kernel_block_size`` tokens whose row holds one KDA layer state. Raises PlanError listing
    every reason the configuration cannot be planned.
    """
    what = f"{model.name} at TP{tp} DCP{dcp}"
    reasons = _layout_reasons(kernel_block_size, alignment, block_size)
    try:
        fp = footprint(model, tp, dcp)
    except PlanError as err:
        raise PlanError(what, err.reasons + reasons) from None
    if fp.bytes_per_token == 0:
        reasons.append(
            f"{model.name} has no per-token cache (no layer owns a latent or index keys)"
        )
    if reasons:
        raise PlanError(what, reasons)
    kda_states = [x.kda.bytes_per_request(tp) for x in model.layers if x.kda is not None]
    kda_stride = _round_up(max(kda_states), alignment) if kda_states else 0
    windows = _window_page_strides(model, kernel_block_size, alignment)
    # The row must hold one KDA layer state and one kernel page of every window, whole.
    min_row = max([kda_stride] + [stride for _, stride in windows])

    def row_for(tokens: int) -> tuple[list[Page], int]:
        pages = _pages(model, tokens, kernel_block_size, alignment)
        return pages, pages[-1].end

    chosen = block_size or kernel_block_size
    pages, row_bytes = row_for(chosen)
    while block_size is None and row_bytes < min_row:
        chosen *= 2
        pages, row_bytes = row_for(chosen)
    if row_bytes < min_row:
        need = kernel_block_size
        while row_for(need)[1] < min_row:
            need *= 2
        raise PlanError(
            what,
            [
                f"a row of {block_size} tokens ({row_bytes} B) cannot hold one KDA layer state "
                f"or window page ({min_row} B at TP{tp}); use a block size of at least {need}"
            ],
        )
    state_rows = _state_rows(row_bytes, kda_stride, fp.kda_layers, windows)
    return PackedLayout(
        model=model.name,
        tp=tp,
        dcp=dcp,
        block_size=chosen,
        kernel_block_size=kernel_block_size,
        alignment=alignment,
        row_bytes=row_bytes,
        pages=tuple(pages),
        kda_state_stride=kda_stride,
        state_rows_per_request=state_rows,
        footprint=fp,
    )
