"""moe.experts: a fused MoE over tokens grouped by expert, bf16, fp8 block-128 and W4A16 weights.

Four launches, none of which needs a device value on the host (no ``.item()``, ``.tolist()``
or ``torch.unique``), so a decode step that calls it can be captured in a CUDA graph:

1. ``_align_kernel`` (in ``moe_align.py``): the ``N = T * k`` slots grouped by expert id,
   each expert's run padded to a multiple of ``BLOCK_M`` rows, and the expert of every row
   block. The number of blocks is bounded by the shapes alone (each nonempty run wastes at most
   ``BLOCK_M - 1`` rows); blocks past the last run exit at once. The shared experts are one
   more group, E, holding one slot per token (slot ``N + t``), so they ride in the same
   launches as the routed ones.
2. ``_gate_up_kernel``: per (row block, I tile), ``x @ W13_e^T`` for the gate and the up rows
   together, then ``silu(gate) * up`` rounded to bf16 (the contract's activation rounding).
3. ``_down_kernel``: per (row block, D tile), ``h @ W2_e^T`` times the slot's routing weight
   (1 for a shared slot), written to the slot's own fp32 row: no atomics, each element once.
4. ``_combine_kernel``: per token, its k slot rows summed in slot order in fp32, plus its
   shared row, rounded once to ``x``'s dtype.

Weights: ``bf16``, or ``fp8_block128`` / ``fp8_block128_ue8m0`` e4m3 codes decoded in the
kernel. A K step never crosses a 128-wide scale tile, so the codes (exact in bf16) go through
the matrix units as they are and each K step's partial product is multiplied by its tile's
scale (per output row: gate and up rows may sit in different tiles): the same sum as the
decoded weights', in another order. ``int4_g128`` (W4A16: the PPU's MoE backend) goes the same
way: each K step reads the packed bytes once (column 2j in the low nibble of byte j), takes the
signed values ``nibble - 8`` (exact in bf16) through the matrix units against the bf16
activations' even and odd columns, and multiplies the partial product by the row's fp32 scale of
that 128-column group. The tile decoding is weight_tiles.py's, shared with ``dense.linear``.
Shared experts of another format or width than the routed ones run through the same kernels in
launches of their own.

Numerics against the reference (``hwrun.ops.moe_experts``): the GEMM inputs are the same bf16
values and the products accumulate in fp32, but in tiles rather than one token at a time, so
the bits differ (the reference is bitwise batch-invariant, this is not: a token's rows share a
tile with whichever tokens chose the same expert). The differences are fp32 summation order,
which can flip a bf16 rounding of the intermediate or of the output by one unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hwrun.formats.int4 import INT4_GROUP
from hwrun.kernels.triton.index_key_tiles import wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.moe_align import ExpertLayout, align_by_expert
from hwrun.kernels.triton.weight_tiles import (
    FORMAT_CODES,
    WEIGHT_FORMATS,
    int4_product,
    weight_tile,
)
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of the two GEMM kernels (BLOCK_K must divide 128: one scale tile or int4
    group per step). With ``swap_ab`` each product is computed transposed, weight rows by slot
    rows (``W @ x^T``): the weight tile is the matrix units' M side, so a row block of a few
    decode slots pads the N side (16 at least) instead of M (64 for Hopper's warpgroup MMA).
    With ``f16_products``, e4m3 weight tiles meet the activations in f16 (each activation row
    scaled by a power of two into f16's range, see ``_rows_in_f16``) instead of bf16."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    swap_ab: bool = False
    f16_products: bool = False


# Tuned on the H200 at DeepSeek-V3 expert shapes (docs/benchmarks.md), by rows per expert.
DECODE_TILES = TileConfig(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=4)
MIDDLE_TILES = TileConfig(block_m=32, block_n=64, block_k=128, num_warps=4, num_stages=4)
PREFILL_TILES = TileConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)
INTERPRETER_TILES = TileConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)


def default_tiles(num_slots: int, num_experts: int, on_gpu: bool) -> TileConfig:
    """Row blocks as tall as the experts' typical number of rows (padding rows cost MMA time
    and registers, not memory traffic)."""
    if not on_gpu:
        return INTERPRETER_TILES
    rows_per_expert = num_slots / max(num_experts, 1)
    if rows_per_expert < 8:
        return DECODE_TILES
    return MIDDLE_TILES if rows_per_expert < 64 else PREFILL_TILES


@triton.jit
def _expert_weights(
    expert, w_ptr, s_ptr, sw_ptr, ss_ptr, stride_we, stride_se, E, HAS_SHARED: tl.constexpr
):
    """Base pointers of group ``expert``'s weight and scales: group E is the shared experts."""
    w_base = w_ptr + expert * stride_we
    s_base = s_ptr + expert * stride_se
    if HAS_SHARED:  # noqa: SIM102 (a constexpr test apart from the runtime one, for Triton's jit)
        if expert == E:
            w_base = sw_ptr
            s_base = ss_ptr
    return w_base, s_base


@triton.jit
def _scaled_product(
    acc, a, w, scale, a_scale, FORMAT: tl.constexpr, SWAP_AB: tl.constexpr, F16: tl.constexpr
):
    """``acc`` plus one K step's product of the activation tile ``a`` [BLOCK_M, BLOCK_K] and the
    weight tile ``w`` [BLOCK_N, BLOCK_K], scaled per weight row (``scale``) and, with F16, per
    activation row (``a_scale``, undoing :func:`_rows_in_f16`): acc is [BLOCK_M, BLOCK_N], or
    [BLOCK_N, BLOCK_M] with SWAP_AB."""
    if SWAP_AB:
        if FORMAT == 0:
            acc = tl.dot(w, tl.trans(a), acc)
        elif F16:
            acc += tl.dot(w, tl.trans(a)) * (scale[:, None] * a_scale[None, :])
        else:
            acc += tl.dot(w, tl.trans(a)) * scale[:, None]
    else:
        if FORMAT == 0:
            acc = tl.dot(a, tl.trans(w), acc)
        elif F16:
            acc += tl.dot(a, tl.trans(w)) * (a_scale[:, None] * scale[None, :])
        else:
            acc += tl.dot(a, tl.trans(w)) * scale[None, :]
    return acc


@triton.jit
def _rows_in_f16(a):
    """An activation tile [BLOCK_M, BLOCK_K] (bf16 values) as f16 and each row's 2^-s, with 2^s
    putting the row's largest magnitude in [2^14, 2^15).

    So e4m3 weight codes can go to the matrix units as f16 (one conversion for two codes; bf16
    takes three instructions a code through f16). Scaling by a power of two is exact, and f16's
    normal range holds every value from the row's largest down to 2^-29 of it with bf16's 8
    significant bits, so those are exact; smaller values round in f16's subnormals, an error of
    at most 2^-39 of the row's largest magnitude, far below the fp32 sums' own rounding."""
    amax = tl.max(tl.abs(a), axis=1)
    exponent = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    s = tl.minimum(tl.maximum(14 - exponent, -126), 126)  # 2^s and 2^-s are normal fp32
    up = ((s + 127) << 23).to(tl.float32, bitcast=True)
    down = ((127 - s) << 23).to(tl.float32, bitcast=True)
    return (a * up[:, None]).to(tl.float16), down


@triton.jit
def _activation_tile(a, WIDE: tl.constexpr, F16: tl.constexpr):
    """A loaded activation tile in the products' input dtype, and its rows' scales (F16: see
    :func:`_rows_in_f16`; otherwise unused ones)."""
    if F16:
        a, a_scale = _rows_in_f16(a.to(tl.float32))
    else:
        a = a.to(WIDE)
        a_scale = tl.full((a.shape[0],), 1.0, tl.float32)
    return a, a_scale


@triton.jit
def _tile_zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP_AB: tl.constexpr):
    """An fp32 accumulator in :func:`_scaled_product`'s orientation."""
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    return acc


@triton.jit
def _tile_offsets(rows, cols, SWAP_AB: tl.constexpr):
    """``rows[:, None] * ... + cols[None, :]``-shaped sums of a row term [BLOCK_M] and a column
    term [BLOCK_N], laid out as the accumulator is (transposed with SWAP_AB)."""
    if SWAP_AB:  # noqa: SIM108 (statements, not a ternary: differently shaped branches)
        out = rows[None, :] + cols[:, None]
    else:
        out = rows[:, None] + cols[None, :]
    return out


@triton.jit
def _tile_mask(rows, cols, SWAP_AB: tl.constexpr):
    """Where both a row mask [BLOCK_M] and a column mask [BLOCK_N] hold, in the accumulator's
    layout."""
    if SWAP_AB:  # noqa: SIM108 (statements, not a ternary: differently shaped branches)
        out = rows[None, :] & cols[:, None]
    else:
        out = rows[:, None] & cols[None, :]
    return out


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [T, D] bf16
    w_ptr,  # [E, 2I, D] bf16 or uint8 e4m3 codes
    s_ptr,  # [E, ceil(2I/128), ceil(D/128)] scales (fp8 only)
    sw_ptr,  # [2I, D] shared experts (HAS_SHARED)
    ss_ptr,  # [ceil(2I/128), ceil(D/128)] their scales
    sorted_ptr,  # [P] int32
    block_expert_ptr,  # [P / BLOCK_M] int32
    h_ptr,  # [P, I] bf16 out
    D,
    I,
    N,  # routed slots: slot s < N is token s // top_k, slot N + t is token t
    top_k,
    E,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    FORMAT: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    F16: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < 0:
        return
    w_base, s_base = _expert_weights(
        expert, w_ptr, s_ptr, sw_ptr, ss_ptr, stride_we, stride_se, E, HAS_SHARED
    )
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows)
    valid = slot >= 0
    token = tl.where(slot < N, slot // top_k, slot - N)
    token = tl.where(valid, token, 0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < I
    gate = _tile_zeros(BLOCK_M, BLOCK_N, SWAP_AB)
    up = _tile_zeros(BLOCK_M, BLOCK_N, SWAP_AB)
    for k0 in range(0, D, BLOCK_K):
        if FORMAT == 3:
            tl.static_assert(not SWAP_AB, "int4_g128 tiles are not swapped")
            a_rows = x_ptr + token * D
            gate += int4_product(
                a_rows, valid, w_base, s_base, n, n_mask, k0, D, stride_wn, stride_sn, WIDE, BLOCK_K
            )
            up += int4_product(
                a_rows,
                valid,
                w_base,
                s_base,
                n + I,
                n_mask,
                k0,
                D,
                stride_wn,
                stride_sn,
                WIDE,
                BLOCK_K,
            )
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            k_mask = kk < D
            a = tl.load(
                x_ptr + token[:, None] * D + kk[None, :],
                mask=valid[:, None] & k_mask[None, :],
                other=0,
            )
            a, a_scale = _activation_tile(a, WIDE, F16)
            wg, sg = weight_tile(
                w_base, s_base, n, n_mask, k0, kk, k_mask, stride_wn, stride_sn, FORMAT, WIDE
            )
            wu, su = weight_tile(
                w_base, s_base, n + I, n_mask, k0, kk, k_mask, stride_wn, stride_sn, FORMAT, WIDE
            )
            gate = _scaled_product(gate, a, wg, sg, a_scale, FORMAT, SWAP_AB, F16)
            up = _scaled_product(up, a, wu, su, a_scale, FORMAT, SWAP_AB, F16)
    h = gate / (1.0 + tl.exp(-gate)) * up
    out = h_ptr + _tile_offsets(rows.to(tl.int64) * I, n, SWAP_AB)
    tl.store(out, h.to(tl.bfloat16), mask=_tile_mask(valid, n_mask, SWAP_AB))


@triton.jit
def _down_kernel(
    h_ptr,  # [P, I] bf16
    w_ptr,  # [E, D, I] bf16 or uint8 e4m3 codes
    s_ptr,  # [E, ceil(D/128), ceil(I/128)] scales (fp8 only)
    sw_ptr,  # [D, I] shared experts (HAS_SHARED)
    ss_ptr,  # [ceil(D/128), ceil(I/128)] their scales
    sorted_ptr,  # [P] int32
    block_expert_ptr,  # [P / BLOCK_M] int32
    route_ptr,  # [N] float32 routing weight of each routed slot (shared slots weigh 1)
    out_ptr,  # [slots, D] float32, one row per slot
    D,
    I,
    N,
    E,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    FORMAT: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    F16: tl.constexpr,
):
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < 0:
        return
    w_base, s_base = _expert_weights(
        expert, w_ptr, s_ptr, sw_ptr, ss_ptr, stride_we, stride_se, E, HAS_SHARED
    )
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows)
    valid = slot >= 0
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < D
    acc = _tile_zeros(BLOCK_M, BLOCK_N, SWAP_AB)
    for k0 in range(0, I, BLOCK_K):
        if FORMAT == 3:
            tl.static_assert(not SWAP_AB, "int4_g128 tiles are not swapped")
            acc += int4_product(
                h_ptr + rows.to(tl.int64) * I,
                valid,
                w_base,
                s_base,
                n,
                n_mask,
                k0,
                I,
                stride_wn,
                stride_sn,
                WIDE,
                BLOCK_K,
            )
        else:
            kk = k0 + tl.arange(0, BLOCK_K)
            k_mask = kk < I
            a = tl.load(
                h_ptr + rows.to(tl.int64)[:, None] * I + kk[None, :],
                mask=valid[:, None] & k_mask[None, :],
                other=0,
            )
            a, a_scale = _activation_tile(a, WIDE, F16)
            w, s = weight_tile(
                w_base, s_base, n, n_mask, k0, kk, k_mask, stride_wn, stride_sn, FORMAT, WIDE
            )
            acc = _scaled_product(acc, a, w, s, a_scale, FORMAT, SWAP_AB, F16)
    safe_slot = tl.where(valid, slot, 0).to(tl.int64)
    routed = valid & (safe_slot < N)
    route = tl.where(routed, tl.load(route_ptr + safe_slot, mask=routed, other=0.0), 1.0)
    if SWAP_AB:  # noqa: SIM108 (statements, not a ternary: differently shaped branches)
        acc = acc * route[None, :]
    else:
        acc = acc * route[:, None]
    out = out_ptr + _tile_offsets(safe_slot * D, n, SWAP_AB)
    tl.store(out, acc, mask=_tile_mask(valid, n_mask, SWAP_AB))


@triton.jit
def _combine_kernel(
    routed_ptr,  # [T * k, D] float32
    ids_ptr,  # [T * k] int32
    shared_ptr,  # [T, D] float32 (unused without HAS_SHARED)
    out_ptr,  # [T, D] x.dtype
    D,
    E,
    top_k,
    HAS_SHARED: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < D
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for j in range(top_k):
        e = tl.load(ids_ptr + t * top_k + j + tl.zeros((BLOCK_D,), tl.int32))  # broadcast
        served = (e >= 0) & (e < E)
        acc += tl.load(routed_ptr + (t * top_k + j) * D + d, mask=d_mask & served, other=0.0)
    if HAS_SHARED:
        acc += tl.load(shared_ptr + t * D + d, mask=d_mask, other=0.0)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=d_mask)


def _weight_args(w: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor, int, int, int, int]:
    """(data, scales, expert / row strides of data, expert / row strides of scales); a 2-D
    weight (the shared experts) has an expert stride of 0. Scales stand in for themselves
    when the format has none (bf16: the kernel never reads them)."""
    data = w.data if w.data.stride(-1) == 1 else w.data.contiguous()
    scales = w.scales if w.scales is not None else data
    if scales.stride(-1) != 1:
        scales = scales.contiguous()
    three_d = data.dim() == 3
    return (
        data,
        scales,
        data.stride(0) if three_d else 0,
        data.stride(-2),
        scales.stride(0) if three_d and w.scales is not None else 0,
        scales.stride(-2) if w.scales is not None else 0,
    )


def _can_fuse_shared(
    w13: QuantizedWeight, w2: QuantizedWeight, shared: tuple[QuantizedWeight, QuantizedWeight]
) -> bool:
    """The shared experts ride in the routed launch as group E when the kernels can read them
    with the routed weights' format and row strides (DeepSeek-V3's: same format, same I)."""
    for routed, extra in zip((w13, w2), shared, strict=True):
        if extra.format != routed.format or extra.shape != routed.shape[1:]:
            return False
        if _weight_args(extra)[3::2] != _weight_args(routed)[3::2]:
            return False
    return True


def _product_dtype(w: QuantizedWeight, tiles: TileConfig) -> dict:
    """The kernels' WIDE and F16 for one weight: f16 products for e4m3 codes when the tiles ask
    for them, else bf16 (fp32 in the interpreter)."""
    f16 = tiles.f16_products and w.format in ("fp8_block128", "fp8_block128_ue8m0")
    return {"WIDE": tl.float16 if f16 else wide_dtype(), "F16": f16}


def _swiglu_grouped(
    x: torch.Tensor,  # [T, D] bf16
    w13: QuantizedWeight,  # [E, 2I, D] or [2I, D]
    w2: QuantizedWeight,  # [E, D, I] or [D, I]
    shared: tuple[QuantizedWeight, QuantizedWeight] | None,  # group E, same format and strides
    layout: ExpertLayout,
    route: torch.Tensor,  # [N] float32
    out_rows: int,  # slots: N, plus T with the shared group
    top_k: int,
    tiles: TileConfig,
) -> torch.Tensor:  # [slots, D] float32, rows of unserved slots unwritten
    hidden = x.shape[1]
    inter = w13.shape[-2] // 2
    rows = layout.sorted_slots.shape[0]
    h = torch.empty(rows, inter, dtype=torch.bfloat16, device=x.device)
    out = torch.empty(out_rows, hidden, dtype=torch.float32, device=x.device)
    if layout.num_blocks == 0:
        return out
    group_e = w13.shape[0] if w13.data.dim() == 3 else 0
    common = {
        "HAS_SHARED": shared is not None,
        "BLOCK_M": tiles.block_m,
        "BLOCK_N": tiles.block_n,
        "BLOCK_K": tiles.block_k,
        "SWAP_AB": tiles.swap_ab,
        "num_warps": tiles.num_warps,
        "num_stages": tiles.num_stages,
    }
    data, scales, we, wn, se, sn = _weight_args(w13)
    shared_data, shared_scales = _weight_args(shared[0])[:2] if shared else (data, scales)
    _gate_up_kernel[(layout.num_blocks, triton.cdiv(inter, tiles.block_n))](
        x, data, scales, shared_data, shared_scales, layout.sorted_slots, layout.block_expert, h,
        hidden, inter, layout.routed_slots, top_k, group_e, we, wn, se, sn,
        FORMAT=FORMAT_CODES[w13.format], **_product_dtype(w13, tiles), **common,
    )  # fmt: skip
    data, scales, we, wn, se, sn = _weight_args(w2)
    shared_data, shared_scales = _weight_args(shared[1])[:2] if shared else (data, scales)
    _down_kernel[(layout.num_blocks, triton.cdiv(hidden, tiles.block_n))](
        h, data, scales, shared_data, shared_scales, layout.sorted_slots, layout.block_expert,
        route, out, hidden, inter, layout.routed_slots, group_e, we, wn, se, sn,
        FORMAT=FORMAT_CODES[w2.format], **_product_dtype(w2, tiles), **common,
    )  # fmt: skip
    return out


def _check(
    x: torch.Tensor,
    w13: QuantizedWeight,
    w2: QuantizedWeight,
    ids: torch.Tensor,
    activation_mode: str,
    shared: tuple[QuantizedWeight, QuantizedWeight] | None,
    tiles: TileConfig,
) -> None:
    """What this kernel cannot compute, beyond the contract's own checks."""
    problems = []
    if activation_mode != "bf16":
        problems.append(f"activation_mode {activation_mode!r} has no kernel here; only 'bf16'")
    weights = [w13, w2, *(shared or ())]
    for w in weights:
        if w.format not in WEIGHT_FORMATS:
            problems.append(f"{w.name} is {w.format}; the kernel reads {list(WEIGHT_FORMATS)}")
    if tiles.swap_ab and any(w.format == "int4_g128" for w in weights):
        problems.append("swap_ab tiles take bf16 or fp8 weights; int4_g128 runs unswapped")
    if FP8_BLOCK % tiles.block_k and any(w.format != "bf16" for w in weights):
        problems.append(
            f"block_k {tiles.block_k} must divide the fp8 scale tile {FP8_BLOCK} and the int4 "
            f"group {INT4_GROUP}"
        )
    if any(w.device != x.device for w in weights) or ids.device != x.device:
        problems.append("x, ids and every weight must be on one device")
    if problems:
        raise ValueError("moe.experts (triton): " + "; ".join(problems))


def experts(
    x: torch.Tensor,  # [T, D] bfloat16 (any float dtype; the output has the same)
    w13: QuantizedWeight,  # [E, 2I, D], rows [0, I) gate, [I, 2I) up
    w2: QuantizedWeight,  # [E, D, I]
    ids: torch.Tensor,  # [T, k] int32/int64, -1 = slot not served here
    weights: torch.Tensor,  # [T, k] float32
    activation_mode: str = "bf16",
    shared_experts: tuple[QuantizedWeight, QuantizedWeight] | None = None,  # [2Is, D], [D, Is]
    tiles: TileConfig | None = None,
) -> torch.Tensor:  # [T, D] x.dtype
    """The contract of ``hwrun.ops.moe_experts.experts`` through the grouped kernels.

    On CPU tensors (the interpreter) every argument is checked as the reference checks it; on
    a GPU only the shapes are (checking id values would synchronise the host), and an id
    outside -1..E-1 contributes nothing.
    """
    from hwrun.ops.moe_experts import _check_experts_args

    if x.is_cuda:
        if x.dim() != 2 or ids.shape != weights.shape or ids.shape[0] != x.shape[0]:
            raise ValueError(
                f"moe.experts: x must be [T, D] and ids, weights [T, k], got {list(x.shape)}, "
                f"{list(ids.shape)}, {list(weights.shape)}"
            )
        if w13.shape[0] != w2.shape[0] or w13.shape[2] != x.shape[1] or w2.shape[1] != x.shape[1]:
            raise ValueError(
                f"moe.experts: w13 must be [E, 2I, D] and w2 [E, D, I] with D = {x.shape[1]}, "
                f"got {list(w13.shape)} and {list(w2.shape)}"
            )
    else:
        _check_experts_args(x, w13, w2, ids, weights, activation_mode, shared_experts)
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    num_experts = w13.shape[0]
    if tiles is None:
        tiles = default_tiles(tokens * top_k, num_experts, x.is_cuda)
    _check(x, w13, w2, ids, activation_mode, shared_experts, tiles)
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    if tokens == 0:
        return out
    prepare_launch()
    xb = x.to(torch.bfloat16).contiguous()
    flat_ids = ids.reshape(-1).to(torch.int32).contiguous()
    route = weights.reshape(-1).float().contiguous()
    slots = tokens * top_k
    fuse = shared_experts is not None and _can_fuse_shared(w13, w2, shared_experts)
    layout = align_by_expert(ids, num_experts, tiles.block_m, with_shared=fuse)
    shared_group = shared_experts if fuse else None
    routed = _swiglu_grouped(
        xb, w13, w2, shared_group, layout, route, slots + tokens * fuse, top_k, tiles
    )
    shared = routed[slots:] if fuse else routed  # routed: any float32 rows when unused
    if shared_experts is not None and not fuse:  # its own launch, as the only group
        shared_w13, shared_w2 = shared_experts
        only_shared = align_by_expert(ids[:, :0], 0, tiles.block_m, with_shared=True)
        shared = _swiglu_grouped(
            xb, shared_w13, shared_w2, shared_experts, only_shared, route, tokens, 1, tiles
        )
    block_d = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(tokens, triton.cdiv(hidden, block_d))](
        routed,
        flat_ids,
        shared,
        out,
        hidden,
        num_experts,
        top_k,
        HAS_SHARED=shared_experts is not None,
        BLOCK_D=block_d,
    )
    return out
