"""mxfp4 paged logits as a warp-specialised Gluon kernel for Hopper (sm_90): the register form
(gluon_paged_logits, ``registers``) fed by loader warps.

The register form spends, of its 250 instructions a page-warp, about 90 on what is not the
page's unpack, product and head sum: the page's cp.async copies and their 64-bit addresses,
its fold decision worked out a page ahead, and the barrier every page needs so that each warp
sees the other warps' copies and decisions. Its warps (four programs of one warpgroup a
multiprocessor) issue about one cycle in two (ncu, docs/benchmarks.md), a tenth of their
stall samples at that barrier.

Here one program a multiprocessor runs three consumer warpgroups and four one-warp loaders:

- loader w takes the program's pages w, w + 4, ...: it copies each (its 4096 bytes of packed
  keys and 256 of scale words) by TMA into a ring stage once a consumer has freed it, and
  LAG pages later, once the scale words have landed, works out the page's fold (as
  gluon_paged_logits._note_fold: each key's group shifts and scale, each half page's widest
  spread) into the stage's side buffers and hands the stage over by an mbarrier. One loader
  a scheduler: their ~111 instructions a page of their own come to ~28 a page a scheduler;
- consumer k takes the program's pages k, k + 3, ...: it waits for the decision and the keys,
  loads its packed words and shifts, unpacks them into the MMA's register operand as the
  register form does, multiplies, frees the stage and sums and stores the logits (215
  instructions a page-warp in Triton 3.6's build). No barrier is shared between consumers,
  and none spans the program; a consumer takes two a page of its own (the compiler adds one
  before each mbarrier wait, which it takes for a read of what the last page's free wrote).

The ring holds STAGES pages, LAG (a multiple of the loaders) of them copied ahead of the
decisions. Pages past a request's keys are written -inf by loader 0. A page whose fold would
reach past MAX_FOLD takes the register form's four products, as there. The loaders decide on
all 64 rows of a page: rows past the request's keys hold whatever the cache block holds, which
may send a request's last page to the four products (exact either way; those rows' logits are
-inf).

Built for sm_90 in CI (plugins/nvidia/tests/test_gluon.py); not yet run on a GPU, so not the
default: ``gluon_paged_logits.logits_paged(..., specialised=True)`` takes it (at most 64 heads:
128 heads' accumulators and weights spill at the consumers' registers).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from hwrun_nvidia.gluon_paged_logits import (
    BLOCK_SIZE,
    FLAGS_LAYOUT,
    FP8_OPERAND_SMEM,
    HEAD_DIM,
    KEY_GROUPS,
    KEY_ROWS,
    KEY_WORDS,
    MAX_FOLD,
    PACKED_RING_SMEM,
    ROW_WORDS_SMEM,
    _cta_barrier,
    _fill_past_keys,
    _group_bytes,
    _head_weights,
    _note_fold,
    _query_tile,
    _register_four_products,
    _register_operand,
    _reinterpreted,
    _share,
    _store_logits,
)

MAX_HEADS = 64  # 128 heads' accumulators and weights spill at CONSUMER_REGS
CONSUMERS = gl.constexpr(3)  # consumer warpgroups a program
LOADERS = gl.constexpr(4)  # loader warps a program, one a scheduler
PAGE_WORD_BYTES = gl.constexpr(64 * 64)  # a page's packed keys
PAGE_BYTES = gl.constexpr(64 * (64 + 4))  # and its scale words
# The cache as [blocks, 17, 256] bytes: a page's keys are rows 0..15, its scale words row 16
# (a TMA box's dimensions are powers of two of at most 256 elements).
PAGE_ROW_BYTES = 256
PAGE_ROWS = PAGE_BYTES.value // PAGE_ROW_BYTES
TMA_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=3))
# The loader is one warp: a page's rows r and r + 32 in lane r (each half page's widest spread
# one warp reduction a register), and the -inf it writes two tokens a lane.
DECIDE_ROWS = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[32]],
        lane_bases=[[1], [2], [4], [8], [16]],
        warp_bases=[],
        block_bases=[],
        shape=[64],
    )
)
FILL_LAYOUT = gl.constexpr(gl.BlockedLayout([2], [32], [1], [0]))
# setmaxnreg's shares of a multiprocessor's 64K registers (16 warps at 128 launched): the
# loaders' few, the rest to the consumers (each page's accumulator, its operand, the weights)
LOADER_REGS = gl.constexpr(56)
CONSUMER_REGS = gl.constexpr(152)
# TMA's load was renamed between Triton 3.6 (the H200's) and 3.9 (CI's)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _request_pages(lens_ptr, b, lo, hi, num_ctx_blocks):
    """Request b's pages in the share: the first, the end of those holding keys (scored), the
    end of all, and the request's length."""
    base = b * num_ctx_blocks
    first = gl.maximum(lo, base) - base
    last = gl.minimum(hi, base + num_ctx_blocks) - base
    length = gl.load(lens_ptr + b)
    key_blocks = gl.minimum((length + BLOCK_SIZE - 1) // BLOCK_SIZE, num_ctx_blocks)
    return first, gl.maximum(gl.minimum(key_blocks, last), first), last, length


@gluon.jit
def _decide(u, scales_ring, flags, shifts, scale_bits, scales_full, decided,
            STAGES: gl.constexpr):  # fmt: skip
    """A loader's fold decision for the program's page u once its scale words have landed, as
    gluon_paged_logits._note_fold's (each half page's widest spread, each key's group shifts
    and scale), on every row as stored and in the loader's one warp."""
    s = u % STAGES
    mbarrier.wait(scales_full.index(s), (u // STAGES) & 1)
    # every row as stored (page 0 of a request BLOCK_SIZE long: no row masked)
    _note_fold(flags.index(s), shifts.index(s), scale_bits.index(s), scales_ring.index(s), 0,
               BLOCK_SIZE, DECIDE_ROWS)  # fmt: skip
    _cta_barrier()  # the warp's every store before its one arrival
    mbarrier.arrive(decided.index(s))


@gluon.jit
def _ws_loader(words_desc, scales_desc, table_ptr, lens_ptr, out_ptr, table_stride, out_stride,
               max_ctx, num_ctx_blocks, batch, words_tma, scales_tma, scales_ring, flags, shifts,
               scale_bits, full, scales_full, decided, free, W: gl.constexpr,
               STAGES: gl.constexpr, LAG: gl.constexpr):  # fmt: skip
    """Loader W (one warp): the share's keyed pages W, W + LOADERS, ... by TMA into the ring
    (each once a consumer has freed its stage), each of them decided LAG pages behind (LAG a
    multiple of LOADERS: its own pages); loader 0 also writes -inf over the share's pages past
    each request's keys."""
    lo, hi = _share(num_ctx_blocks, batch)
    out_rows = gl.arange(0, BLOCK_SIZE, layout=FILL_LAYOUT)
    t = 0  # the share's keyed pages before this request's
    for b in range(lo // num_ctx_blocks, (hi + num_ctx_blocks - 1) // num_ctx_blocks):
        first, scored, last, _ = _request_pages(lens_ptr, b, lo, hi, num_ctx_blocks)
        table_row = table_ptr + b.to(gl.int64) * table_stride
        start = first + (W - t % LOADERS + LOADERS) % LOADERS
        blk = gl.load(table_row + start, mask=start < scored, other=0)
        for j in range(start, scored, LOADERS):
            u = t + j - first
            s = u % STAGES
            mbarrier.wait(free.index(s), (u // STAGES) & 1 ^ 1)
            mbarrier.expect(full.index(s), PAGE_WORD_BYTES)
            _tma_load(words_desc, [blk, 0, 0], full.index(s), words_tma.index(s))
            mbarrier.expect(scales_full.index(s), BLOCK_SIZE * 4)
            _tma_load(scales_desc, [blk, PAGE_WORD_BYTES // 256, 0], scales_full.index(s),
                      scales_tma.index(s))  # fmt: skip
            # the next page's block read a page ahead, so that its copy does not wait on it
            blk = gl.load(table_row + j + LOADERS, mask=j + LOADERS < scored, other=0)
            if u >= LAG:
                _decide(
                    u - LAG, scales_ring, flags, shifts, scale_bits, scales_full, decided, STAGES
                )
        t += scored - first
        if W == 0:
            out_row = out_ptr + b.to(gl.int64) * out_stride
            _fill_past_keys(out_row, scored, last, 1, max_ctx, out_rows)
    tail = gl.maximum(t - LAG, 0)
    for u in range(tail + (W - tail % LOADERS + LOADERS) % LOADERS, t, LOADERS):
        _decide(u, scales_ring, flags, shifts, scale_bits, scales_full, decided, STAGES)


@gluon.jit
def _ws_score_page(q_smem, w, words, scale_words, flags, shifts, scale_bits, free, groups, tok,
                   length, max_ctx, out_row, HP: gl.constexpr,
                   acc_layout: gl.constexpr):  # fmt: skip
    """A consumer's page from its decided stage: the register form's product (or its four
    products), the stage freed once every warp's reads of it are done, the logits summed and
    stored."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    packed = words.load(KEY_WORDS)
    # the same rows in each thread as its packed words: the unpack's folds read them so
    key_shifts = gl.convert_layout(shifts.load(rows_layout), KEY_ROWS, assert_trivial=True)
    shift = _group_bytes(key_shifts, groups)
    widest = gl.max(flags.load(FLAGS_LAYOUT), axis=0)
    if widest <= MAX_FOLD:
        operand = _register_operand(packed, shift, acc_layout)
        zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
        acc = warpgroup_mma(operand, q_smem.permute((1, 0)), zero, use_acc=False)
        scale = scale_bits.load(rows_layout).to(gl.float32, bitcast=True)
    else:
        row_scales = gl.where(tok < length, scale_words.load(rows_layout), 0)
        acc = _register_four_products(q_smem, packed, groups, row_scales, HP, acc_layout)
        scale = gl.full([BLOCK_SIZE], 1.0, gl.float32, rows_layout)
    # (The compiler adds a barrier of its own before the next page's wait, which it takes
    # for a read of memory that this arrival may have written: two barriers a page.)
    _cta_barrier()
    mbarrier.arrive(free)
    _store_logits(acc, w, scale, tok, length, max_ctx, out_row)


@gluon.jit
def _ws_consumer(q_ptr, w_ptr, lens_ptr, out_ptr, out_stride, max_ctx, num_ctx_blocks, batch,
                 words_ring, scales_ring, flags, shifts, scale_bits, q_smem, full, decided, free,
                 K: gl.constexpr, H: gl.constexpr, HP: gl.constexpr,
                 STAGES: gl.constexpr):  # fmt: skip
    """Consumer K: the program's pages K, K + CONSUMERS, ... (counted over the share's keyed
    pages), each request's queries in its own shared memory."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HP, 32]
    )
    heads_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    out_rows = gl.arange(0, BLOCK_SIZE, layout=gl.SliceLayout(1, acc_layout))
    groups = gl.arange(0, 4, layout=gl.SliceLayout(0, KEY_GROUPS))
    lo, hi = _share(num_ctx_blocks, batch)
    t = 0  # the share's keyed pages before this request's
    for b in range(lo // num_ctx_blocks, (hi + num_ctx_blocks - 1) // num_ctx_blocks):
        first, scored, _, length = _request_pages(lens_ptr, b, lo, hi, num_ctx_blocks)
        b64 = b.to(gl.int64)
        # this request's queries, once the last request's products are done reading them
        q_smem.store(_query_tile(q_ptr, b64, H, HP, True))
        fence_async_shared()  # the generic-proxy stores before the MMAs' async-proxy reads
        _cta_barrier()
        w = _head_weights(w_ptr, b64, H, HP, heads_layout)
        out_row = out_ptr + b64 * out_stride
        n = scored - first
        for i in range((K - t % CONSUMERS + CONSUMERS) % CONSUMERS, n, CONSUMERS):
            u = t + i
            s = u % STAGES
            phase = (u // STAGES) & 1
            mbarrier.wait(decided.index(s), phase)
            # the keys' TMA too: the loader waited only for the scale words
            mbarrier.wait(full.index(s), phase)
            tok = (first + i) * BLOCK_SIZE + out_rows
            _ws_score_page(
                q_smem, w, words_ring.index(s), scales_ring.index(s), flags.index(s),
                shifts.index(s), scale_bits.index(s), free.index(s), groups, tok, length,
                max_ctx, out_row, HP, acc_layout,
            )  # fmt: skip
        t += n
        _cta_barrier()  # every warp's products done with the queries before the next's


@gluon.jit
def _paged_logits_ws_kernel(
    q_ptr,  # [B, 1, H, 128] float8_e4m3fn
    w_ptr,  # [B, H] float32
    words_desc,  # the cache as [blocks, 17, 256] uint8, boxes [1, 16, 256]: a page's keys
    scales_desc,  # the same, boxes [1, 1, 256]: its scale words
    table_ptr,  # [B, max_blocks] int32
    lens_ptr,  # [B, 1] int32
    out_ptr,  # [B, max_ctx] float32
    table_stride,
    out_stride,
    max_ctx,
    num_ctx_blocks,
    batch,
    H: gl.constexpr,
    HP: gl.constexpr,
    STAGES: gl.constexpr,  # ring stages
    LAG: gl.constexpr,  # pages copied ahead of the loaders' decisions
):
    """The persistent grid (one program a multiprocessor): program p takes the p-th of P equal
    contiguous shares of every request's pages, by four loader warps and three consumer
    warpgroups."""
    gl.static_assert(gl.num_warps() == 4, "the default partition is one warpgroup")
    gl.static_assert(LAG < STAGES, "a stage for the loaders to copy into while they decide")
    gl.static_assert(LAG % LOADERS == 0, "each loader decides its own pages")
    # TMA's destinations, row-major [1, rows, 256] bytes a stage, and the same bytes as the
    # consumers read them
    words_tma = gl.allocate_shared_memory(
        gl.uint8, [STAGES, 1, PAGE_WORD_BYTES // 256, 256], TMA_SMEM
    )
    scales_tma = gl.allocate_shared_memory(gl.uint8, [STAGES, 1, 1, 256], TMA_SMEM)
    words_ring = _reinterpreted(words_tma, gl.int32, [STAGES, BLOCK_SIZE, 4, 4], PACKED_RING_SMEM)
    scales_ring = _reinterpreted(scales_tma, gl.int32, [STAGES, BLOCK_SIZE], ROW_WORDS_SMEM)
    flags = gl.allocate_shared_memory(gl.int32, [STAGES, 2], ROW_WORDS_SMEM)
    shifts = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_SIZE], ROW_WORDS_SMEM)
    scale_bits = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_SIZE], ROW_WORDS_SMEM)
    queries = (
        gl.allocate_shared_memory(gl.float8e4nv, [HP, HEAD_DIM], FP8_OPERAND_SMEM),
        gl.allocate_shared_memory(gl.float8e4nv, [HP, HEAD_DIM], FP8_OPERAND_SMEM),
        gl.allocate_shared_memory(gl.float8e4nv, [HP, HEAD_DIM], FP8_OPERAND_SMEM),
    )
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    scales_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    decided = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(full.index(s), count=1)
        mbarrier.init(scales_full.index(s), count=1)
        mbarrier.init(decided.index(s), count=1)
        mbarrier.init(free.index(s), count=1)
    fence_async_shared()  # the barriers' initialisation before any partition's use
    _cta_barrier()

    gl.warp_specialize(
        [
            (
                _ws_consumer,
                (q_ptr, w_ptr, lens_ptr, out_ptr, out_stride, max_ctx, num_ctx_blocks, batch,
                 words_ring, scales_ring, flags, shifts, scale_bits, queries[0], full, decided,
                 free, 0, H, HP, STAGES),
            ),
            (
                _ws_consumer,
                (q_ptr, w_ptr, lens_ptr, out_ptr, out_stride, max_ctx, num_ctx_blocks, batch,
                 words_ring, scales_ring, flags, shifts, scale_bits, queries[1], full, decided,
                 free, 1, H, HP, STAGES),
            ),
            (
                _ws_consumer,
                (q_ptr, w_ptr, lens_ptr, out_ptr, out_stride, max_ctx, num_ctx_blocks, batch,
                 words_ring, scales_ring, flags, shifts, scale_bits, queries[2], full, decided,
                 free, 2, H, HP, STAGES),
            ),
            (
                _ws_loader,
                (words_desc, scales_desc, table_ptr, lens_ptr, out_ptr, table_stride, out_stride,
                 max_ctx, num_ctx_blocks, batch, words_tma, scales_tma, scales_ring, flags,
                 shifts, scale_bits, full, scales_full, decided, free, 0, STAGES, LAG),
            ),
            (
                _ws_loader,
                (words_desc, scales_desc, table_ptr, lens_ptr, out_ptr, table_stride, out_stride,
                 max_ctx, num_ctx_blocks, batch, words_tma, scales_tma, scales_ring, flags,
                 shifts, scale_bits, full, scales_full, decided, free, 1, STAGES, LAG),
            ),
            (
                _ws_loader,
                (words_desc, scales_desc, table_ptr, lens_ptr, out_ptr, table_stride, out_stride,
                 max_ctx, num_ctx_blocks, batch, words_tma, scales_tma, scales_ring, flags,
                 shifts, scale_bits, full, scales_full, decided, free, 2, STAGES, LAG),
            ),
            (
                _ws_loader,
                (words_desc, scales_desc, table_ptr, lens_ptr, out_ptr, table_stride, out_stride,
                 max_ctx, num_ctx_blocks, batch, words_tma, scales_tma, scales_ring, flags,
                 shifts, scale_bits, full, scales_full, decided, free, 3, STAGES, LAG),
            ),
        ],
        [4, 4, 1, 1, 1, 1],
        [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS, LOADER_REGS, LOADER_REGS, LOADER_REGS],
    )  # fmt: skip


def page_descriptors(cache: torch.Tensor) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of the mxfp4 cache [blocks, 4352] uint8 (16-byte aligned rows): a
    page's packed keys and its scale words."""
    shape = [cache.shape[0], PAGE_ROWS, PAGE_ROW_BYTES]
    strides = [cache.stride(0), PAGE_ROW_BYTES, 1]
    layout = TMA_SMEM.value
    words = TensorDescriptor(cache, shape, strides, [1, PAGE_WORD_BYTES.value // 256, 256], layout)
    scales = TensorDescriptor(cache, shape, strides, [1, 1, 256], layout)
    return words, scales


def logits_paged(
    q: torch.Tensor,  # [B, 1, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [B, H] float32
    cache: torch.Tensor,  # [num_blocks, 64 * 68] uint8, mxfp4 keys
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, 1] int32
    max_ctx: int,
    stages: int = 12,
) -> torch.Tensor:  # [B, max_ctx] float32, -inf past each row's length
    """The launch (the caller has checked the shapes with gluon_paged_logits.shape_reasons and
    the heads against MAX_HEADS): one program a multiprocessor, ``stages`` pages in its ring
    (at least 5), the largest multiple of LOADERS below it copied ahead of the loaders' fold
    decisions."""
    if stages < LOADERS.value + 1:
        raise ValueError(f"gluon logits_paged: specialised takes stages >= 5, got {stages}")
    lag = (stages - 1) // LOADERS.value * LOADERS.value
    B, H = q.shape[0], q.shape[2]
    out = torch.empty((B, max_ctx), dtype=torch.float32, device=q.device)
    if B == 0 or max_ctx == 0:
        return out
    num_ctx_blocks = triton.cdiv(max_ctx, BLOCK_SIZE.value)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (max(1, min(sms, triton.cdiv(B * num_ctx_blocks, 4))),)
    words_desc, scales_desc = page_descriptors(cache)
    table = block_table.to(torch.int32)
    _paged_logits_ws_kernel[grid](
        q.contiguous(),
        weights.contiguous().float(),
        words_desc,
        scales_desc,
        table,
        context_lens.to(torch.int32).contiguous(),
        out,
        table.stride(0),
        out.stride(0),
        max_ctx,
        num_ctx_blocks,
        B,
        H=H,
        HP=max(16, triton.next_power_of_2(H)),
        STAGES=stages,
        LAG=lag,
        num_warps=4,
    )
    return out
