"""The packed cache as the ops see it: one uint8 tensor, strided page views, kernel-page ids.

Two ways in, both without copying:

- **Strided block views** for ops that take a block stride: the latent page of a layer as
  ``[num_blocks, block_size, row_bytes]`` and its index-key page as
  ``[num_blocks, block_size * bytes_per_token]``, each with the packed row as block stride.
  A cache slot ``s`` is block ``s // block_size``, row ``s % block_size``, unchanged.
- **A uniform kernel-page pool** for kernels that index fixed-size pages from one base address
  (FlashMLA / DeepGEMM style, 64-token pages). The pool of a (layer, kind) starts at that page's
  offset in row 0 and has a page stride of ``layout.kernel_page_unit`` bytes, so kernel page
  ``k`` starts at byte ``offset + k * unit``. :func:`translate_block_table` and
  :func:`translate_slots` turn block tables and slots into that pool's ids; this needs every row
  and kernel page to be a multiple of the unit (the planner aligns them) and the largest id to fit
  in int32 (:func:`kernel_id_reasons`).
"""

from __future__ import annotations

import torch

from hwrun.kv.layout import INDEX_KEYS, LATENT, PackedLayout, Page
from hwrun.kv.specs import KDAStateSpec

INT32_MAX = 2**31 - 1
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def allocate_cache(layout: PackedLayout, num_blocks: int, device: str | torch.device = "cpu"):
    """A zeroed packed cache of ``num_blocks`` rows: uint8 ``[num_blocks, row_bytes]``."""
    if num_blocks < 1:
        raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
    return torch.zeros(num_blocks, layout.row_bytes, dtype=torch.uint8, device=device)


def _check_cache(cache: torch.Tensor, layout: PackedLayout) -> int:
    if (
        cache.dtype != torch.uint8
        or cache.dim() != 2
        or cache.shape[1] != layout.row_bytes
        or not cache.is_contiguous()
    ):
        raise ValueError(
            f"expected a contiguous uint8 cache [num_blocks, {layout.row_bytes}] from "
            f"allocate_cache, got {cache.dtype} {tuple(cache.shape)}"
        )
    return cache.shape[0]


def latent_view(cache: torch.Tensor, layout: PackedLayout, layer: int) -> torch.Tensor:
    """Layer ``layer``'s latent pages: uint8 ``[num_blocks, block_size, token_bytes]``."""
    num_blocks = _check_cache(cache, layout)
    page = layout.page(layer, LATENT)
    if page.kernel_page_stride != page.kernel_page_bytes:
        raise ValueError(
            f"layer {layer}'s latent kernel pages are padded to {page.kernel_page_stride} B, so "
            "its tokens are not one strided run; use kernel_page_pool and translate_slots"
        )
    return cache.as_strided(
        (num_blocks, layout.block_size, page.token_bytes),
        (layout.row_bytes, page.token_bytes, 1),
        cache.storage_offset() + page.offset,
    )


def index_key_view(cache: torch.Tensor, layout: PackedLayout, layer: int) -> torch.Tensor:
    """Layer ``layer``'s index-key pages: uint8 ``[num_blocks, block_size * bytes_per_token]``,
    each one block-major page (all element rows, then all scales) for ``split_pages``.

    Only when a block is one kernel page: a larger block holds several 64-token pages, which
    ``split_pages(view, block_size)`` would misread; use kernel_page_pool for those layouts.
    """
    num_blocks = _check_cache(cache, layout)
    page = layout.page(layer, INDEX_KEYS)
    if layout.block_size != layout.kernel_block_size:
        raise ValueError(
            f"blocks of {layout.block_size} tokens hold several index-key kernel pages of "
            f"{layout.kernel_block_size} tokens each; read them through "
            "kernel_page_pool with translate_block_table"
        )
    return cache.as_strided(
        (num_blocks, layout.block_size * page.token_bytes),
        (layout.row_bytes, 1),
        cache.storage_offset() + page.offset,
    )


def kernel_page_pool(
    cache: torch.Tensor, layout: PackedLayout, layer: int, kind: str
) -> torch.Tensor:
    """The uniform kernel-page pool of (layer, kind), in the shape its ops expect.

    latent: uint8 ``[num_pages, kernel_block_size, token_bytes]``; index keys: uint8
    ``[num_pages, kernel_block_size * bytes_per_token]``; page stride ``kernel_page_unit``.
    Pages overlap in this view (the stride is smaller than a page): only the ids that
    :func:`translate_block_table` returns are real pages.
    """
    num_blocks = _check_cache(cache, layout)
    page = layout.page(layer, kind)
    unit = layout.kernel_page_unit
    last_start = num_blocks * layout.row_bytes - page.offset - page.kernel_page_bytes
    num_pages = last_start // unit + 1
    base = cache.storage_offset() + page.offset
    kb = layout.kernel_block_size
    if kind == LATENT:
        return cache.as_strided(
            (num_pages, kb, page.token_bytes), (unit, page.token_bytes, 1), base
        )
    return cache.as_strided((num_pages, kb * page.token_bytes), (unit, 1), base)


def kernel_id_reasons(layout: PackedLayout, num_blocks: int) -> list[str]:
    """Reasons the int32 kernel-page ids of a cache of ``num_blocks`` rows would overflow.

    (Pool slots are page id * kernel_block_size and overflow int32 much sooner: they are int64;
    int32 slot kernels use the strided block views, whose slots count blocks, not units.)
    """
    unit = layout.kernel_page_unit
    largest_page = num_blocks * layout.row_bytes // unit
    if largest_page > INT32_MAX:
        return [
            f"{num_blocks} blocks of {layout.row_bytes} B give kernel page ids up to "
            f"{largest_page}, past int32; use fewer blocks or a larger alignment than {unit} B"
        ]
    return []


def _page_ids(layout: PackedLayout, page: Page, blocks: torch.Tensor, sub: torch.Tensor):
    unit = layout.kernel_page_unit
    row_units = layout.row_bytes // unit
    return blocks.long() * row_units + sub.long() * (page.kernel_page_stride // unit)


def translate_block_table(
    layout: PackedLayout,
    page: Page,
    block_table: torch.Tensor,  # [B, max_blocks] int32 packed block ids, -1 unused
) -> torch.Tensor:  # [B, max_blocks * block_size // kernel_block_size] int32 kernel page ids
    """Block table of packed blocks -> table of kernel pages in ``page``'s uniform pool.

    Block ``b`` becomes its ``block_size / kernel_block_size`` kernel pages in token order;
    -1 stays -1.
    """
    if block_table.dim() != 2:
        raise ValueError(f"block_table: expected [B, max_blocks], got {tuple(block_table.shape)}")
    per_block = layout.block_size // layout.kernel_block_size
    sub = torch.arange(per_block, device=block_table.device)
    ids = _page_ids(layout, page, block_table.unsqueeze(-1).clamp_min(0), sub)
    ids = torch.where(block_table.unsqueeze(-1) < 0, -1, ids)
    return ids.reshape(block_table.shape[0], -1).to(torch.int32)


def translate_slots(
    layout: PackedLayout,
    page: Page,
    slots: torch.Tensor,  # [...] int packed-cache slots (block * block_size + row), -1 invalid
) -> torch.Tensor:  # [...] int64 slots of page's pool (kernel page * kernel_block_size + row)
    """Packed-cache slots -> slots of the uniform kernel-page pool; -1 stays -1."""
    kb = layout.kernel_block_size
    safe = slots.long().clamp_min(0)
    blocks, rows = safe // layout.block_size, safe % layout.block_size
    kernel_pages = _page_ids(layout, page, blocks, rows // kb)
    out = kernel_pages * kb + rows % kb
    return torch.where(slots < 0, -1, out)


def page_bytes(cache: torch.Tensor, layout: PackedLayout, block: int, page: Page) -> torch.Tensor:
    """The raw bytes of one (block, page): uint8 ``[page.size]``, a view into ``cache``."""
    start, _ = layout.block_byte_range(block)
    return cache.view(-1)[start + page.offset : start + page.end]


def kda_state_views(
    cache: torch.Tensor,
    layout: PackedLayout,
    state_rows: list[int],  # the packed rows holding one request's state, in order
    ordinal: int,  # which KDA layer of the model (0 = the first KDA layer)
    spec: KDAStateSpec,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One request's state of one KDA layer, as views into its state row.

    Returns the recurrent state ``[HV/tp, K, V]`` in ``spec.state_dtype`` (what ``kda.step``
    updates in place) and the short-convolution state ``[(2K + V) * H/tp, conv_kernel - 1]`` in
    ``spec.conv_dtype`` (q, k, v channels in that order), packed right after it.
    """
    _check_cache(cache, layout)
    row_ordinal, offset = layout.kda_state_offset(ordinal)
    if row_ordinal >= len(state_rows):
        raise ValueError(
            f"KDA layer {ordinal} lives in state row {row_ordinal}, but only {len(state_rows)} "
            f"state rows were given (a request takes {layout.state_rows_per_request})"
        )
    heads = spec.heads // layout.tp
    start = layout.block_byte_range(state_rows[row_ordinal])[0] + offset
    flat = cache.view(-1)
    state_dtype, conv_dtype = TORCH_DTYPES[spec.state_dtype], TORCH_DTYPES[spec.conv_dtype]
    recurrent_bytes = heads * spec.key_dim * spec.value_dim * state_dtype.itemsize
    channels = heads * (2 * spec.key_dim + spec.value_dim)
    conv_bytes = channels * (spec.conv_kernel - 1) * conv_dtype.itemsize
    if recurrent_bytes + conv_bytes > layout.kda_state_stride:
        raise ValueError(
            f"a KDA state of {recurrent_bytes + conv_bytes} B does not fit the layout's "
            f"{layout.kda_state_stride} B slots: plan the layout with this spec's model"
        )
    recurrent = flat[start : start + recurrent_bytes].view(state_dtype)
    conv = flat[start + recurrent_bytes : start + recurrent_bytes + conv_bytes].view(conv_dtype)
    return (
        recurrent.view(heads, spec.key_dim, spec.value_dim),
        conv.view(channels, spec.conv_kernel - 1),
    )
