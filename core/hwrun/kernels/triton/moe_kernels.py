"""The fused MoE's Triton kernels (``moe.py`` launches them and documents the algorithm): the
gate/up and down GEMMs over expert row blocks, and the per-token combine.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hwrun.kernels.triton.activation_quant import e4m3_groups
from hwrun.kernels.triton.f16_rows import to_scaled_f16
from hwrun.kernels.triton.pdl import wait_for_previous_kernel
from hwrun.kernels.triton.weight_tiles import int4_product, weight_scales, weight_tile


@triton.jit
def _scaled_product(
    acc, a, w, scale, a_scale, FORMAT: tl.constexpr, F16: tl.constexpr, A8: tl.constexpr
):
    """``acc`` [BLOCK_M, BLOCK_N] plus one K step's product of the activation tile ``a``
    [BLOCK_M, BLOCK_K] and the weight tile ``w`` [BLOCK_N, BLOCK_K], scaled per weight row
    (``scale``) and, with F16, per activation row (``a_scale``, undoing f16_rows' 2^s). A8: the
    transposed sum, ``acc`` [BLOCK_N, BLOCK_M]: e4m3 against e4m3 with the weight rows on the
    matrix units' M side (64 per warpgroup on Hopper, where the decode tiles have 16 tokens),
    scaled by both sides' scales of this K step."""
    if A8:
        acc += tl.dot(w, tl.trans(a)) * (scale[:, None] * a_scale[None, :])
    elif FORMAT == 0:
        acc = tl.dot(a, tl.trans(w), acc)
    elif F16:
        acc += tl.dot(a, tl.trans(w)) * (a_scale[:, None] * scale[None, :])
    else:
        acc += tl.dot(a, tl.trans(w)) * scale[None, :]
    return acc


@triton.jit
def _row_scales(ptrs, valid, F16: tl.constexpr):
    """The activation rows' scales for this K step (f16_rows' 2^-s, or a8w8's e4m3 scales: the
    caller passes F16 or A8), else ones (never read)."""
    if F16:  # noqa: SIM108 (a constexpr branch: without F16 no load is traced)
        scales = tl.load(ptrs, mask=valid, other=0.0)
    else:
        scales = tl.full(valid.shape, 1.0, tl.float32)
    return scales


@triton.jit
def _step_scales(
    row_scales,  # [BLOCK_M] pointers to the activation rows' scales (their first group)
    valid,
    s_base,
    n,
    n_mask,
    k0,
    k_end,
    stride_sn,
    FORMAT: tl.constexpr,
    SCALED_ROWS: tl.constexpr,
    ROW_GROUP: tl.constexpr,  # activation columns under one row scale
):
    """K step ``k0``'s scales (none past ``k_end``): the activation rows' (ones unless
    SCALED_ROWS) and weight rows ``n``'s (ones for bf16). The kernels load them a step ahead:
    Triton's pipeliner leaves loads that feed no dot in the step that uses them (as in
    linear.py's _step_scales). Gate/up calls it for the up rows too, dropping the rows' scales
    (a load nothing reads is not emitted)."""
    live_rows = valid & ((valid.to(tl.int32) * 0 + k0) < k_end)
    a_scale = _row_scales(row_scales + k0 // ROW_GROUP, live_rows, SCALED_ROWS)
    if FORMAT == 0:
        s = tl.full(n.shape, 1.0, tl.float32)
    else:
        s = weight_scales(s_base, n, n_mask & ((n * 0 + k0) < k_end), k0, stride_sn, FORMAT)
    return a_scale, s


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
def _code_tiles(w_base, rows, cols, stride_wn, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A tensor descriptor (TMA) over one expert's [rows, cols] e4m3 codes: the copy engine
    brings each [BLOCK_N, BLOCK_K] tile into shared memory, zero past the expert's edges, and
    the compiler pipelines those copies over the K loop (pointer loads of codes that are
    decoded before the product are not pipelined: each K step would wait for its own)."""
    return tl.make_tensor_descriptor(
        w_base.to(tl.pointer_type(tl.float8e4nv)),
        shape=[rows, cols],
        strides=[stride_wn, 1],
        block_shape=[BLOCK_N, BLOCK_K],
    )


@triton.jit
def _codes_of(
    codes_desc,
    expert,
    group_rows,
    w_base,
    rows,
    cols,
    stride_wn,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HOST_TMA: tl.constexpr,
):
    """The descriptor a program reads its group's codes through, and the group's first row in
    it. HOST_TMA: the launch's one descriptor over the groups stacked (the shared group as
    group E), built on the host and passed as a kernel argument, so no program spends the
    global write and fence of building its own; else the group's own (_code_tiles)."""
    if HOST_TMA:
        return codes_desc, (expert * group_rows).to(tl.int32)
    return _code_tiles(w_base, rows, cols, stride_wn, BLOCK_N, BLOCK_K), 0


@triton.jit
def _activation_tile(ptrs, mask, WIDE: tl.constexpr, A8: tl.constexpr):
    """An activation tile in WIDE: bf16 / f16 values, or (A8) e4m3 codes stored as uint8."""
    a = tl.load(ptrs, mask=mask, other=0)
    if A8:
        a = a.to(tl.float8e4nv, bitcast=True)
    return a.to(WIDE)


@triton.jit
def _zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, A8: tl.constexpr):
    """An accumulator: [BLOCK_M, BLOCK_N], or transposed for A8 (_scaled_product)."""
    if A8:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    return acc


@triton.jit
def _untransposed(acc, A8: tl.constexpr):
    if A8:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [T, D] bf16, f16 scaled by xs (F16), or uint8 e4m3 codes scaled by xs (A8)
    xs_ptr,  # [T, ceil(D/128)] fp32 2^-s of x's row groups (F16), or their e4m3 scales (A8)
    w_ptr,  # [E, 2I, D] bf16 or uint8 e4m3 codes
    s_ptr,  # [E, ceil(2I/128), ceil(D/128)] scales (fp8 only)
    sw_ptr,  # [2I, D] shared experts (HAS_SHARED)
    ss_ptr,  # [ceil(2I/128), ceil(D/128)] their scales
    sorted_ptr,  # [P] int32
    block_expert_ptr,  # [P / BLOCK_M] int32
    h_ptr,  # [P, I] bf16 out, f16 scaled by hs (F16), or uint8 e4m3 codes (A8)
    hs_ptr,  # [P, ceil(I/BLOCK_N)] fp32 out: 2^-s of h's row tiles (F16), their e4m3 scales (A8)
    part_ptr,  # [SPLITS, P, 2I] fp32: each K split's gate and up sums (SPLITS > 1)
    count_ptr,  # [P / BLOCK_M * ceil(I/BLOCK_N)] int32 zeros, left at zero (split_counters.py)
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
    F16: tl.constexpr,
    SPLITS: tl.constexpr,  # programs per (row block, I tile), each over a run of K steps
    TMA: tl.constexpr = False,  # e4m3 codes through a tensor descriptor (_code_tiles)
    codes_desc=None,  # HOST_TMA: the host's descriptor over every group's codes, stacked
    HOST_TMA: tl.constexpr = False,
    # a8w8: x is e4m3 codes, products e4m3 x e4m3, and h leaves as e4m3 codes with one scale per
    # row and 128 columns (BLOCK_N is 128: a tile holds its rows' groups whole); UE8M0: h's
    # scales as powers of two
    A8: tl.constexpr = False,
    UE8M0: tl.constexpr = False,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < 0:
        return
    w_base, s_base = _expert_weights(
        expert, w_ptr, s_ptr, sw_ptr, ss_ptr, stride_we, stride_se, E, HAS_SHARED
    )
    if TMA:
        codes, row0 = _codes_of(
            codes_desc, expert, 2 * I, w_base, 2 * I, D, stride_wn, BLOCK_N, BLOCK_K, HOST_TMA
        )
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows)
    valid = slot >= 0
    token = tl.where(slot < N, slot // top_k, slot - N)
    token = tl.where(valid, token, 0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < I
    out_mask = valid[:, None] & n_mask[None, :]
    gate = _zeros(BLOCK_M, BLOCK_N, A8)
    up = _zeros(BLOCK_M, BLOCK_N, A8)
    k_run = tl.cdiv(tl.cdiv(D, BLOCK_K), SPLITS) * BLOCK_K
    k_start = tl.program_id(2) * k_run
    k_end = tl.minimum(D, k_start + k_run)
    x_scales = xs_ptr + token * tl.cdiv(D, 128)
    if FORMAT != 3:  # the step's scales, loaded a step ahead (_step_scales)
        a_scale, sg = _step_scales(
            x_scales, valid, s_base, n, n_mask, k_start, k_end, stride_sn, FORMAT, F16 or A8, 128
        )
        _, su = _step_scales(
            x_scales, valid, s_base, n + I, n_mask, k_start, k_end, stride_sn, FORMAT, False, 128
        )
    for k0 in range(k_start, k_end, BLOCK_K):
        if FORMAT == 3:
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
            a = _activation_tile(
                x_ptr + token[:, None] * D + kk[None, :], valid[:, None] & k_mask[None, :], WIDE, A8
            )
            if TMA:  # gate rows past I read up rows, up rows past 2I zeros: columns not stored
                n0 = tl.program_id(1) * BLOCK_N
                wg = codes.load([row0 + n0, k0]).to(WIDE)
                wu = codes.load([row0 + n0 + I, k0]).to(WIDE)
            else:  # (weight_tile's own scales go unused: the compiler drops their loads)
                wg, _ = weight_tile(
                    w_base, s_base, n, n_mask, k0, kk, k_mask, stride_wn, stride_sn, FORMAT, WIDE
                )
                wu, _ = weight_tile(
                    w_base,
                    s_base,
                    n + I,
                    n_mask,
                    k0,
                    kk,
                    k_mask,
                    stride_wn,
                    stride_sn,
                    FORMAT,
                    WIDE,
                )
            a_next, sg_next = _step_scales(
                x_scales, valid, s_base, n, n_mask, k0 + BLOCK_K, k_end, stride_sn, FORMAT,
                F16 or A8, 128,
            )  # fmt: skip
            _, su_next = _step_scales(
                x_scales, valid, s_base, n + I, n_mask, k0 + BLOCK_K, k_end, stride_sn, FORMAT,
                False, 128,
            )  # fmt: skip
            gate = _scaled_product(gate, a, wg, sg, a_scale, FORMAT, F16, A8)
            up = _scaled_product(up, a, wu, su, a_scale, FORMAT, F16, A8)
            a_scale, sg, su = a_next, sg_next, su_next
    gate = _untransposed(gate, A8)
    up = _untransposed(up, A8)
    if SPLITS > 1:
        # Split K (more programs than a wave holds otherwise, at decode): each split stores its
        # sums, and the tile's last split to finish adds them all, in split order (the same
        # bits whichever finishes last), then applies the activation below.
        part = part_ptr + rows.to(tl.int64)[:, None] * (2 * I) + n[None, :]
        plane = tl.num_programs(0).to(tl.int64) * BLOCK_M * (2 * I)
        tl.store(part + tl.program_id(2) * plane, gate, mask=out_mask)
        tl.store(part + tl.program_id(2) * plane + I, up, mask=out_mask)
        tl.debug_barrier()  # every thread's sums stored before the count says so
        tile = block * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu") < SPLITS - 1:
            return
        tl.store(count_ptr + tile, 0)  # for the next launch (split_counters.py)
        gate = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for split in tl.static_range(SPLITS):
            gate += tl.load(part + split * plane, mask=out_mask, other=0.0, cache_modifier=".cg")
            up += tl.load(part + split * plane + I, mask=out_mask, other=0.0, cache_modifier=".cg")
    h = gate / (1.0 + tl.exp(-gate)) * up
    out = h_ptr + rows.to(tl.int64)[:, None] * I + n[None, :]
    if A8:  # the contract's a8w8 rounding of the fp32 intermediate, each row's group whole
        h8, h_scale = e4m3_groups(h, UE8M0)
        tl.store(out, h8, mask=out_mask)
        tiles = tl.num_programs(1)
        tl.store(hs_ptr + rows.to(tl.int64) * tiles + tl.program_id(1), h_scale, mask=valid)
    elif F16:  # the contract's bf16 rounding first, then exactly into f16 with the tile's 2^s
        h16, h_scale = to_scaled_f16(h.to(tl.bfloat16).to(tl.float32))
        tl.store(out, h16, mask=out_mask)
        tiles = tl.num_programs(1)
        tl.store(hs_ptr + rows.to(tl.int64) * tiles + tl.program_id(1), h_scale, mask=valid)
    else:
        tl.store(out, h.to(tl.bfloat16), mask=out_mask)


@triton.jit
def _down_kernel(
    h_ptr,  # [P, I] bf16, f16 scaled by hs (F16), or uint8 e4m3 codes scaled by hs (A8)
    hs_ptr,  # [P, ceil(I/H_GROUP)] fp32 2^-s of h's row tiles (F16), or their e4m3 scales (A8)
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
    F16: tl.constexpr,
    H_GROUP: tl.constexpr,  # columns of h under one scale (the gate/up launch's BLOCK_N)
    TMA: tl.constexpr = False,  # e4m3 codes through a tensor descriptor (_code_tiles)
    codes_desc=None,  # HOST_TMA: the host's descriptor over every group's codes, stacked
    HOST_TMA: tl.constexpr = False,
    A8: tl.constexpr = False,  # a8w8: h is e4m3 codes (H_GROUP = BLOCK_K = 128), products e4m3
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < 0:
        return
    w_base, s_base = _expert_weights(
        expert, w_ptr, s_ptr, sw_ptr, ss_ptr, stride_we, stride_se, E, HAS_SHARED
    )
    if TMA:
        codes, row0 = _codes_of(
            codes_desc, expert, D, w_base, D, I, stride_wn, BLOCK_N, BLOCK_K, HOST_TMA
        )
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows)
    valid = slot >= 0
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < D
    h_groups = tl.cdiv(I, H_GROUP)
    acc = _zeros(BLOCK_M, BLOCK_N, A8)
    h_scales = hs_ptr + rows.to(tl.int64) * h_groups
    if FORMAT != 3:  # the step's scales, loaded a step ahead (_step_scales)
        a_scale, s = _step_scales(
            h_scales, valid, s_base, n, n_mask, 0, I, stride_sn, FORMAT, F16 or A8, H_GROUP
        )
    for k0 in range(0, I, BLOCK_K):
        if FORMAT == 3:
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
            a = _activation_tile(
                h_ptr + rows.to(tl.int64)[:, None] * I + kk[None, :],
                valid[:, None] & k_mask[None, :],
                WIDE,
                A8,
            )
            if TMA:
                w = codes.load([row0 + tl.program_id(1) * BLOCK_N, k0]).to(WIDE)
            else:  # (weight_tile's own scales go unused: the compiler drops their loads)
                w, _ = weight_tile(
                    w_base, s_base, n, n_mask, k0, kk, k_mask, stride_wn, stride_sn, FORMAT, WIDE
                )
            a_next, s_next = _step_scales(
                h_scales, valid, s_base, n, n_mask, k0 + BLOCK_K, I, stride_sn, FORMAT, F16 or A8,
                H_GROUP,
            )  # fmt: skip
            acc = _scaled_product(acc, a, w, s, a_scale, FORMAT, F16, A8)
            a_scale, s = a_next, s_next
    acc = _untransposed(acc, A8)
    safe_slot = tl.where(valid, slot, 0).to(tl.int64)
    routed = valid & (safe_slot < N)
    route = tl.where(routed, tl.load(route_ptr + safe_slot, mask=routed, other=0.0), 1.0)
    out = out_ptr + safe_slot[:, None] * D + n[None, :]
    tl.store(out, acc * route[:, None], mask=valid[:, None] & n_mask[None, :])


@triton.jit
def _combine_kernel(
    routed_ptr,  # [T * k, D] float32
    ids_ptr,  # [T * k] int32
    shared_ptr,  # [T, D] float32 (unused without HAS_SHARED)
    out_ptr,  # [T, D] x.dtype
    D,
    E,
    TOP_K: tl.constexpr,
    HAS_SHARED: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr = False,  # pdl.py's protocol
):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < D
    acc = tl.zeros((BLOCK_D,), tl.float32)
    # Unrolled, so that the k id loads and then the k row loads can all be in flight at once,
    # where a loop over a runtime k waited for an id, then its row, k times over. The sum stays
    # in slot order. H200, 64 tokens x 8 slots (2026-12-04): 7.1 -> 6.3 us exposed a call.
    for j in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + j + tl.zeros((BLOCK_D,), tl.int32))  # broadcast
        served = (e >= 0) & (e < E)
        acc += tl.load(routed_ptr + (t * TOP_K + j) * D + d, mask=d_mask & served, other=0.0)
    if HAS_SHARED:
        acc += tl.load(shared_ptr + t * D + d, mask=d_mask, other=0.0)
    tl.store(out_ptr + t * D + d, acc.to(out_ptr.dtype.element_ty), mask=d_mask)
