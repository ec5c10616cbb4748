"""indexer.logits_paged as Gluon kernels for Hopper (sm_90): mxfp4 index keys, and fp8 ones.

The Triton kernel (hwrun.kernels.triton.indexer_logits) reads an mxfp4 page at 2.25x DeepGEMM's
fp8 time on the H200 although it holds half the bytes: the packed keys load one byte a thread
and pass through shared memory byte by byte (66 ``STS.U8`` a page) to the layout its unpack
feeds the tensor cores, a layout Triton chooses and we cannot. Here every layout is written
out, so a page costs, per thread: two 16-byte copies of packed keys, 9 instructions per 4
packed bytes to unpack them in element order, four 16-byte shared stores of the e4m3 codes,
and one warpgroup MMA of 64 tokens x the heads x K=128 reading the codes and the queries from
shared memory.

Each key's four e8m0 group exponents are folded into its codes: a group 2^-d below the key's
largest has its e4m3 exponent field lowered by d (exact while d <= 5, index_key_tiles'
MAX_FOLD), so the page is one K=128 product and the key's largest power of two scales its
head sum once (relu commutes with a positive scale). A page holding a key whose groups span
more than that takes four products instead, one per group, each scaled by its power of two.

fp8 keys need no unpack: each page's codes go by cp.async straight into a ring stage in the
layout the MMA reads (DeepGEMM's paged kernel, which the engine uses for them, reads them by
TMA with warp-specialised producers).

Each page's block-table entry is read an iteration before its copy is issued, so that the
copy does not wait on it. mxfp4 keys take two pages an iteration (``pairs``: one ring wait,
one barrier and one fold decision for both; 317 instructions a page against 351 in the sm_90
cubin) with ptxas capped at 128 registers (four programs an SM instead of three, for a few
spill reloads a page): 347.6 us against ~425 one page an iteration uncapped at B=64 x 131072 on
an H100. fp8's ``overlap`` (each page's MMA async while the previous page's logits are stored)
timed no faster and stays off.

Where a program has 16 pages or more, mxfp4 keys take the register form (``registers``) instead,
which keeps the codes out of shared memory altogether: each thread loads the one packed group
its warpgroup MMA's register operand needs (group c = lane % 4 of its two rows), unpacks it in
place, and the MMA reads the codes from registers (the queries loaded in the K order that makes
this so). A page costs one barrier and no code stores: on its fast path 250 instructions a warp
against the paired form's ~330 in the same sm_90 build (Triton 3.6, 128 registers). On an H100
(2026-12-08) 285.0 us at B=64 x 131072 against DeepGEMM's fp8 386.8 (0.74x; 304.5 at 271
instructions, 313.7 at 284); on 2026-12-07, at 286 instructions, 317.3 against the paired
form's 349.0, 85.4 against 91.8 at 64 x 32768, and slower with few pages a program (1 x 131072:
10.6 against 8.2). ncu there (at 286): 57% of DRAM bandwidth, 0.53 instructions issued a cycle
a scheduler, 3.05 warps active a scheduler of the 4 its 128 registers allow, 1.07 eligible; yet
3 programs an SM were almost as fast as 4, so more warps alone would not help
(docs/benchmarks.md).
Its ``overlap`` option, tested and timed on an H100 (2026-12-07) and left off, issues each
page's MMA async and sums and stores the previous page's logits before waiting for it (311.5 us
against 314.7). ncu there has the form throttled on the half-rate ALU pipe, not on memory, and
its multiprocessors finishing within 2% of each other: hence relu as x + |x| and the unpack's
mul.hi, both on the FMA pipe (in the 2026-12-08 times above).

Both formats run the persistent grid by default (``persistent``): a fixed number of programs,
as many as the multiprocessors hold, each scoring an equal contiguous share of all requests'
pages. The split grid (``splits`` programs a request) left 4 of 132 multiprocessors idle at
B=64 and 5 programs each; at B=64 x 131072 on an H100 the persistent grid took fp8 keys to
387.1 us against DeepGEMM's 387.6 (split 391.9), and 399.5 against 399.7 on another (split
409-411); mxfp4 keys it leaves where the split grid was (352 against 348-350 us).

Tested: the sm_90 cubin of each form is built and read in CI (plugins/nvidia/tests/
test_gluon.py), the unpack is checked by tests/kernels/test_unpack_ptx.py, and plugins/nvidia/
tests/test_gluon_gpu.py compares every form with the reference on an H200 (passed there, 49
cases, on 2026-12-06; the persistent grid's cases first ran on an H100 on 2026-12-07, and all 64
cases, the register form's included, passed on an H100 on 2026-12-07; all 65 at 316027c on an H100
on 2026-12-08).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from hwrun.kernels.triton.indexer_logits import paged_kernel_args

BLOCK_SIZE = gl.constexpr(64)  # tokens a page: one MMA's 64 rows
ELEM_BYTES = gl.constexpr(64)  # packed e2m1 bytes a key
HEAD_DIM = gl.constexpr(128)
MAX_FOLD = gl.constexpr(5)  # as index_key_tiles.MAX_FOLD
MAX_HEADS = 128  # an fp32 accumulator of 64 x 128 is 64 registers a thread

# $2: 4 packed bytes (e2m1 nibbles, element 2i low); $3 / $4: the e4m3 codes of the eight
# e2m1 magnitudes (0, 0.5, 1, 1.5 / 2, 3, 4, 6), lowered by the group's fold; $0 / $1: the
# e4m3 codes of elements 0-3 / 4-7 in element order, 9 instructions in all. The nibbles'
# magnitude bits are prmt's selectors as they lie; a second prmt gathers, per output byte, a
# byte whose bit 7 is the nibble's sign (a high nibble's own byte, a low nibble's byte of the
# word shifted left by 4), and that bit is or-ed in. The upper selectors come down by 16 as
# a multiply's high word: an IMAD on the FMA pipe, where a shift would take the half-rate ALU
# pipe that the permutes and logic ops already fill.
UNPACK_NATURAL_ASM = gl.constexpr("""
{
.reg .b32 m, w4, s, t;
and.b32 m, $2, 0x77777777;
shl.b32 w4, $2, 4;
prmt.b32 s, $3, $4, m;
prmt.b32 t, w4, $2, 0x5140;
and.b32 t, t, 0x80808080;
or.b32 $0, s, t;
mul.hi.u32 m, m, 65536;
prmt.b32 s, $3, $4, m;
prmt.b32 t, w4, $2, 0x7362;
and.b32 t, t, 0x80808080;
or.b32 $1, s, t;
}
""")
# Gluon's API moved between Triton 3.6 (the H200's) and 3.9 (CI's CPU wheel, which builds the
# cubin in test_gluon.py): the cp.async copy, the CTA barrier and the shared-memory reinterpret
# were renamed.
GLUON_39 = gl.constexpr(hasattr(async_copy, "async_load"))
_copy = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier
# An async warpgroup MMA's result: Triton 3.9 returns a token that warpgroup_mma_wait turns
# into the tensor; older Gluon returns the tensor, and the wait returns nothing.
MMA_TOKENS = gl.constexpr(hasattr(hopper, "warpgroup_mma_accumulator"))
# The MMA's fp8 operands in shared memory (keys and queries, K contiguous), and rows of one word
# a token (the keys' scale words, copied one a thread).
FP8_OPERAND_SMEM = gl.constexpr(
    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
)
ROW_WORDS_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))
ROW_WORDS_COPY = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))
TABLE_LOW = gl.constexpr(0x3C383000)  # e4m3 codes of 0, 0.5, 1, 1.5 (byte 0 first)
TABLE_HIGH = gl.constexpr(0x4C484440)  # of 2, 3, 4, 6
# mxfp4 pages: packed words [row, group, word], a thread holding one group (16 bytes) of two
# rows; the groups and key rows sliced from it; the ring of packed pages; the codes' words
# (read by the MMA as fp8); each half page's widest spread, both in every thread.
PACKED_WORDS = gl.constexpr(gl.BlockedLayout([1, 1, 4], [8, 4, 1], [4, 1, 1], [2, 1, 0]))
PACKED_GROUPS = gl.constexpr(gl.SliceLayout(2, PACKED_WORDS))
PACKED_KEY_ROWS = gl.constexpr(gl.SliceLayout(1, PACKED_GROUPS))
PACKED_RING_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
CODE_WORDS_SMEM = gl.constexpr(
    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
)
FLAGS_LAYOUT = gl.constexpr(gl.BlockedLayout([2], [32], [4], [0]))
# A page's scale words for its fold decision: rows 32h..32h+31 one a lane in warp h, warps 2
# and 3 repeating 0 and 1. The product's rows (SliceLayout(1, acc_layout)) give a thread two
# rows, each repeated in 4 lanes: the spreads there took twice the instructions, and a half
# page's widest is then one warp's 32 lanes, a single REDUX instead of a shuffle tree.
NOTE_ROWS = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[],
        lane_bases=[[1], [2], [4], [8], [16]],
        warp_bases=[[32], [0]],
        block_bases=[],
        shape=[64],
    )
)
# The mxfp4 form with the keys in registers (``registers``): each thread loads group c (lane
# % 4) of rows r and r + 8 (r = 16 * warp + lane // 4), the rows the MMA's register operand
# gives it, so that the unpacked codes are that operand as they lie. Word j of group c
# unpacks to the codes of K positions 32j + 4c + (0..3) (its elements 0-3) and 32j + 16 + 4c +
# (0..3) (elements 4-7): the dot product runs over the key's elements in that order, and the
# queries are loaded in it (_queries_and_weights' REGISTER_ORDER).
KEY_WORDS = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[8, 0, 0], [0, 0, 1], [0, 0, 2]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[64, 4, 4],
    )
)
KEY_GROUPS = gl.constexpr(gl.SliceLayout(2, KEY_WORDS))
KEY_ROWS = gl.constexpr(gl.SliceLayout(1, KEY_GROUPS))
# The codes' words [64, 32] (word w: K positions 4w..4w+3) widened to one element a byte
# [64, 32, 4]: as [64, 128], the MMA's fp8 register operand (kWidth 4), element for element.
CODE_BYTES = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[64, 32, 4],
    )
)


@gluon.jit
def _mma_result(pending):
    """The product of the async MMA ``pending``, once it (and every earlier one) is done."""
    if MMA_TOKENS:
        return warpgroup_mma_wait(0, deps=[pending])
    else:
        warpgroup_mma_wait(0, deps=[pending])
        return pending


@gluon.jit
def _power_of_two(code):
    """fp32 2^(code - 127) of e8m0 codes (int32 0..255) from its bits: exact, 2^-127 included
    (a subnormal), NaN for 255."""
    bits = gl.where(code == 0, 0x00400000, code << 23)
    bits = gl.where(code == 255, 0x7FC00000, bits)
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _byte(word, i: gl.constexpr):
    return (word >> (8 * i)) & 0xFF


@gluon.jit
def _largest_code(scales):
    """Each key's largest e8m0 code (scales: its 4 codes as one word)."""
    return gl.maximum(
        gl.maximum(_byte(scales, 0), _byte(scales, 1)),
        gl.maximum(_byte(scales, 2), _byte(scales, 3)),
    )


@gluon.jit
def _smallest_code(scales):
    """Each key's smallest e8m0 code (scales: its 4 codes as one word)."""
    return gl.minimum(
        gl.minimum(_byte(scales, 0), _byte(scales, 1)),
        gl.minimum(_byte(scales, 2), _byte(scales, 3)),
    )


@gluon.jit
def _spread(scales):
    """Each key's largest e8m0 code minus its smallest."""
    return _largest_code(scales) - _smallest_code(scales)


@gluon.jit
def _group_bytes(key_words, groups):
    """[64, 4] byte g of each key's word (``key_words`` [64]) in column g."""
    return (gl.expand_dims(key_words, 1) >> gl.expand_dims(groups * 8, 0)) & 0xFF


@gluon.jit
def _shifts(key_scales, groups):
    """[64, 4] each key group's fold: its key's largest e8m0 code minus its own."""
    return gl.expand_dims(_largest_code(key_scales), 1) - _group_bytes(key_scales, groups)


@gluon.jit
def _page_codes(scale_words, page, length, ROWS: gl.constexpr = NOTE_ROWS):
    """Each key's scale word in page ``page`` (``scale_words``, shared [64]) in ``ROWS``, 0
    past the request's keys (stale bytes there: no spread, no shift)."""
    rows = gl.arange(0, BLOCK_SIZE, layout=ROWS)
    return gl.where(rows < length - page * BLOCK_SIZE, scale_words.load(ROWS), 0)


@gluon.jit
def _page_spread(scale_words, page, length):
    """Each key's spread in page ``page``, 0 past the request's keys, in NOTE_ROWS."""
    return _spread(_page_codes(scale_words, page, length))


@gluon.jit
def _note_widest(flags, spread):
    """Each half page's widest spread ([64] in NOTE_ROWS, rows 0-31 and 32-63) into ``flags``
    ([2] int32; warps 2 and 3 store the same words as warps 0 and 1)."""
    flags.store(gl.max(gl.reshape(spread, [2, 32]), axis=1))


@gluon.jit
def _note_fold(flags, shifts, scales, scale_words, page, length, ROWS: gl.constexpr = NOTE_ROWS):
    """Page ``page``'s fold worked out a page ahead, once a row (NOTE_ROWS, half the
    instructions of the product's rows): as _note_spread into ``flags``, each key's group
    shifts into ``shifts`` (byte g: its largest e8m0 code minus group g's; no byte borrows) and
    the bits of its scale 2^(largest - 127) into ``scales`` (both [64] int32, allocations of
    their own: the compiler puts a barrier between two stores into one). Zero codes past the
    request's keys: no shift, the smallest scale. ``ROWS``: any layout of the 64 rows whose
    [2, 32] reshape splits the halves (the warp-specialised form's one-warp loaders' own)."""
    codes = _page_codes(scale_words, page, length, ROWS)
    largest = _largest_code(codes)
    _note_widest(flags, largest - _smallest_code(codes))
    shifts.store(largest * 0x01010101 - codes)
    scales.store(_power_of_two(largest).to(gl.int32, bitcast=True))


@gluon.jit
def _note_spread(flags, scale_words, page, length):
    """Each half's widest key spread in page ``page`` into ``flags``: the page's fold
    decision, read after a later barrier, so that no barrier is spent on it."""
    _note_widest(flags, _page_spread(scale_words, page, length))


@gluon.jit
def _lowered_tables(shift, words):
    """The unpack's two code tables, each byte's exponent field lowered by ``shift`` [64, 4]
    (all but the zero code's), broadcast over ``words`` [64, 4, 4]. Each is one multiply-add
    (on the FMA pipe, not the ALU pipe the unpack fills): for shift < 32 no byte borrows, so
    shift * 0x08080800 is TABLE_LOW's lowering with its zero byte kept. Larger shifts never
    reach a product that is used (they do not fold)."""
    low = gl.expand_dims(TABLE_LOW - shift * 0x08080800, 2)
    high = gl.expand_dims(TABLE_HIGH - shift * 0x08080808, 2)
    return low + gl.zeros_like(words), high + gl.zeros_like(words)


@gluon.jit
def _unpacked(words, shift):
    """int32 [64, 32] e4m3 codes, four a word in element order, of packed ``words`` [64, 4, 4]
    (row, group, word), group g's lowered by ``shift`` [64, 4] (its exponent field minus
    shift; zero stays zero)."""
    low, high = _lowered_tables(shift, words)
    first, second = gl.inline_asm_elementwise(
        UNPACK_NATURAL_ASM,
        "=r,=r,r,r,r",
        [words, low, high],
        dtype=(gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )
    return gl.reshape(gl.join(first, second), [BLOCK_SIZE, 32])


@gluon.jit
def _page_product(a_words, a_codes, q_smem, codes, HP: gl.constexpr, acc_layout: gl.constexpr):
    """The [64, HP] fp32 product of the e4m3 ``codes`` (int32 [64, 32]) and the queries."""
    a_words.store(codes)
    fence_async_shared()  # the generic-proxy stores before the MMA's async-proxy reads
    zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
    return warpgroup_mma(a_codes, q_smem.permute((1, 0)), zero, use_acc=False)


@gluon.jit
def _group_product(a_words, a_codes, q_smem, words, groups, row_scales, g, HP: gl.constexpr,
                   acc_layout: gl.constexpr):  # fmt: skip
    """Group ``g``'s share of a page's products, 2^e_g * (k_g . q_g): the other groups' words
    zeroed, the codes unlowered."""
    mine = gl.expand_dims(gl.expand_dims(groups == g, 0), 2)
    unlowered = gl.zeros([BLOCK_SIZE, 4], gl.int32, PACKED_GROUPS)
    codes = _unpacked(gl.where(mine, words, 0), unlowered)
    part = _page_product(a_words, a_codes, q_smem, codes, HP, acc_layout)
    return part * gl.expand_dims(_power_of_two((row_scales >> (8 * g)) & 0xFF), 1)


@gluon.jit
def _four_products(a_words, a_codes, q_smem, words, groups, row_scales, HP: gl.constexpr,
                   acc_layout: gl.constexpr):  # fmt: skip
    """A page whose keys' groups span too much to fold: four products, group g's codes alone
    (the others' words zeroed) scaled by 2^e_g. The first outside the loop: its barrier then
    ends the caller's reads of the ring and the flags on this path too, so the writes that
    follow need none."""
    acc = _group_product(a_words, a_codes, q_smem, words, groups, row_scales, 0, HP, acc_layout)
    for g in range(1, 4):
        acc += _group_product(a_words, a_codes, q_smem, words, groups, row_scales, g, HP,
                              acc_layout)  # fmt: skip
    return acc


@gluon.jit
def _packed_word_offsets():
    """Each key row [64], group [4] and packed-word offset [64, 4, 4] in PACKED_WORDS."""
    rows = gl.arange(0, BLOCK_SIZE, layout=PACKED_KEY_ROWS)
    groups = gl.arange(0, 4, layout=gl.SliceLayout(0, PACKED_GROUPS))
    in_group = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, PACKED_WORDS)))
    word_offs = gl.expand_dims(
        gl.expand_dims(rows * 16, 1) + gl.expand_dims(groups * 4, 0), 2
    ) + gl.expand_dims(gl.expand_dims(in_group, 0), 1)
    return rows, groups, word_offs


@gluon.jit
def _reinterpreted(smem, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """``smem``'s bytes as a ``dtype`` buffer of ``shape`` in ``layout`` (the method's name
    differs between Gluon 3.6 and 3.9)."""
    if GLUON_39:
        return smem.reinterpret(dtype, shape, layout)
    else:
        return smem._reinterpret(dtype, shape, layout)


@gluon.jit
def _as_fp8(a_words):
    """The page's e4m3 codes, stored as int32 words, as the MMA's fp8 operand (same bytes: both
    layouts swizzle 16-byte chunks of 128-byte rows)."""
    return _reinterpreted(a_words, gl.float8e4nv, [BLOCK_SIZE, HEAD_DIM], FP8_OPERAND_SMEM)


@gluon.jit
def _page_block(table_row, j, key_blocks):
    """Page ``j``'s block in the cache (0 at or past ``key_blocks``), read an iteration before
    its copy is issued, so that no page's copy waits on the block table."""
    return gl.load(table_row + j, mask=j < key_blocks, other=0).to(gl.int64)


@gluon.jit
def _issue_page(
    keys_ring,
    scales_ring,
    stage,
    blk,
    j,
    key_blocks,
    cache_ptr,
    cache_block_stride,
    key_offs,
    scale_offs,
    KEY_BYTES: gl.constexpr,
):
    """cp.async of page ``j``'s keys (block ``blk``, as the ring's element type) and their scale
    words into ring ``stage``, as one commit group (no read for a page at or past
    ``key_blocks``: its stage is never scored, and its codes are masked where they are read
    ahead)."""
    live = j < key_blocks
    page = cache_ptr + blk * cache_block_stride
    keys = page.to(gl.pointer_type(keys_ring.dtype)) + key_offs
    _copy(keys_ring.index(stage), keys, mask=live)
    scales = (page + BLOCK_SIZE * KEY_BYTES).to(gl.pointer_type(gl.int32)) + scale_offs
    _copy(scales_ring.index(stage), scales, mask=live)
    async_copy.commit_group()


@gluon.jit
def _issue_pair(even_words, even_scales, odd_words, odd_scales, stage, blk, blk2, j, SPLITS,
                key_blocks, cache_ptr, cache_block_stride, word_offs, scale_offs):  # fmt: skip
    """Pages ``j`` (block ``blk``) and ``j + SPLITS`` (``blk2``) of mxfp4 keys into stage
    ``stage`` of the even and the odd ring, a commit group each."""
    _issue_page(
        even_words, even_scales, stage, blk, j, key_blocks, cache_ptr, cache_block_stride,
        word_offs, scale_offs, ELEM_BYTES,
    )  # fmt: skip
    _issue_page(
        odd_words, odd_scales, stage, blk2, j + SPLITS, key_blocks, cache_ptr,
        cache_block_stride, word_offs, scale_offs, ELEM_BYTES,
    )  # fmt: skip


@gluon.jit
def _query_tile(q_ptr, b, H: gl.constexpr, HP: gl.constexpr, REGISTER_ORDER: gl.constexpr):
    """Request b's queries [HP, 128] fp8 in registers (padded heads 0), K in the element order
    or, with REGISTER_ORDER, position k holding element 32c + 8j + 4h + i of k = 32j + 16h +
    4c + i, the order in which the keys-in-registers forms unpack a key (KEY_WORDS)."""
    q_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    qh = gl.arange(0, HP, layout=gl.SliceLayout(1, q_layout))
    qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
    if REGISTER_ORDER:
        qd = (qd >> 2 & 3) * 32 + (qd >> 5) * 8 + (qd >> 4 & 1) * 4 + (qd & 3)
    return gl.load(
        q_ptr + (b * H + gl.expand_dims(qh, 1)) * HEAD_DIM + gl.expand_dims(qd, 0),
        mask=gl.expand_dims(qh < H, 1),
        other=0.0,
    )


@gluon.jit
def _head_weights(w_ptr, b, H: gl.constexpr, HP: gl.constexpr, heads_layout: gl.constexpr):
    """Request b's head weights [HP] (padded heads 0)."""
    heads = gl.arange(0, HP, layout=heads_layout)
    return gl.load(w_ptr + b * H + heads, mask=heads < H, other=0.0)


@gluon.jit
def _queries_and_weights(q_ptr, w_ptr, b, H: gl.constexpr, HP: gl.constexpr,
                         heads_layout: gl.constexpr,
                         REGISTER_ORDER: gl.constexpr = False):  # fmt: skip
    """Request b's queries in shared memory as the MMA's right operand ([HP, 128], K
    contiguous; :func:`_query_tile`) and its head weights [HP]."""
    q = _query_tile(q_ptr, b, H, HP, REGISTER_ORDER)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [HP, HEAD_DIM], FP8_OPERAND_SMEM, q)
    return q_smem, _head_weights(w_ptr, b, H, HP, heads_layout)


@gluon.jit
def _store_logits(acc, w, scale, tok, length, max_ctx, out_row):
    """sum_h w_h relu(acc) * scale (a positive scale commutes with relu; NaN stays NaN) into the
    request's row, -inf at and past its length."""
    # 2 relu(x) as x + |x|: an add on the FMA pipe (with the sign dropped in the operand),
    # where a max takes the half-rate ALU pipe that the mxfp4 unpack already keeps busy.
    # Exact (x + |x| is 2x or +0; NaN stays NaN; the accumulators are finite), and the 2
    # goes with the scale, a power of two, so the logits are as sum_h w_h relu(x_h) rounds.
    doubled = acc + gl.abs(acc)
    logits = gl.sum(doubled * gl.expand_dims(w, 0), axis=1) * (scale * 0.5)
    logits = gl.where(tok < length, logits, float("-inf"))
    gl.store(out_row + tok, logits, mask=tok < max_ctx)


@gluon.jit
def _fill_past_keys(out_row, first, last, stride, max_ctx, out_rows):
    """-inf over pages first, first + stride, ... below ``last`` (past the request's keys)."""
    neg_inf = gl.full([BLOCK_SIZE], float("-inf"), gl.float32, out_rows.type.layout)
    for j in range(first, last, stride):
        tok = j * BLOCK_SIZE + out_rows
        gl.store(out_row + tok, neg_inf, mask=tok < max_ctx)


@gluon.jit
def _score_request(
    q_ptr, w_ptr, cache_ptr, table_ptr, lens_ptr, out_ptr, cache_block_stride, table_stride,
    out_stride, max_ctx, num_ctx_blocks, b, first, last, stride, H: gl.constexpr,
    HP: gl.constexpr, STAGES: gl.constexpr, MXFP4: gl.constexpr, OVERLAP: gl.constexpr,
    PAIRS: gl.constexpr, REGISTERS: gl.constexpr, acc_layout: gl.constexpr,
):  # fmt: skip
    """Request b's pages first, first + stride, ... below ``last``: those holding keys scored
    (STAGES pages in flight or in hand, by cp.async into a ring in shared memory), the rest
    written -inf."""
    length = gl.load(lens_ptr + b)
    key_blocks = gl.minimum((length + BLOCK_SIZE - 1) // BLOCK_SIZE, num_ctx_blocks)
    scored = gl.minimum(key_blocks, last)  # the scoring loops' end
    table_row = table_ptr + b * table_stride
    out_row = out_ptr + b * out_stride
    out_rows = gl.arange(0, BLOCK_SIZE, layout=gl.SliceLayout(1, acc_layout))
    if MXFP4 and REGISTERS:
        _score_mxfp4_registers(
            q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, first,
            length, scored, max_ctx, stride, H, HP, STAGES, OVERLAP, acc_layout,
        )  # fmt: skip
    elif MXFP4 and PAIRS:
        _score_mxfp4_pairs(
            q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, first,
            length, scored, max_ctx, stride, H, HP, STAGES, acc_layout,
        )  # fmt: skip
    elif MXFP4:
        _score_mxfp4_pages(
            q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, first,
            length, scored, max_ctx, stride, H, HP, STAGES, acc_layout,
        )  # fmt: skip
    else:
        _score_fp8_pages(
            q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, first,
            length, scored, max_ctx, stride, H, HP, STAGES, OVERLAP, acc_layout,
        )  # fmt: skip
    async_copy.wait_group(0)  # no copy outlives the request's share
    # The same pages' rest, those at or past key_blocks
    past = first + (gl.maximum(key_blocks - first, 0) + stride - 1) // stride * stride
    _fill_past_keys(out_row, past, last, stride, max_ctx, out_rows)


@gluon.jit
def _share(num_ctx_blocks, batch):
    """The persistent grid's share [lo, hi) of program p of P: the p-th of P equal contiguous
    shares of every request's pages laid end to end (num_ctx_blocks a request). int64 for the
    products only: the bounds are pages (< 2^31)."""
    program = gl.program_id(0).to(gl.int64)
    programs = gl.num_programs(0)
    lo = (program * batch * num_ctx_blocks // programs).to(gl.int32)
    hi = ((program + 1) * batch * num_ctx_blocks // programs).to(gl.int32)
    return lo, hi


@gluon.jit
def _paged_logits_kernel(
    q_ptr,  # [B, 1, H, 128] float8_e4m3fn
    w_ptr,  # [B, H] float32
    cache_ptr,  # [num_blocks, 64 * bytes_per_token] uint8: 64 keys' elements, then their scales
    table_ptr,  # [B, max_blocks] int32
    lens_ptr,  # [B, 1] int32
    out_ptr,  # [B, max_ctx] float32
    cache_block_stride,
    table_stride,
    out_stride,
    max_ctx,
    num_ctx_blocks,
    SPLITS,  # the split grid's programs a request (the persistent grid: unused)
    batch,
    H: gl.constexpr,
    HP: gl.constexpr,
    STAGES: gl.constexpr,
    MXFP4: gl.constexpr,  # mxfp4 keys (68 B a token), else fp8 (132 B)
    OVERLAP: gl.constexpr,  # fp8: each page's MMA async, beside the last page's sums
    PAIRS: gl.constexpr,  # mxfp4: two pages an iteration
    PERSISTENT: gl.constexpr = False,
    REGISTERS: gl.constexpr = False,  # mxfp4: the codes in registers (_score_mxfp4_registers)
):
    """The split grid: program (b, split) takes pages split, split + SPLITS, ... of request b.
    The persistent grid (PERSISTENT): program p of P takes the p-th of P equal contiguous
    shares of every request's pages laid end to end (num_ctx_blocks a request), so that no
    multiprocessor idles while others finish (B=64 x 10 split programs filled 128 of 132
    multiprocessors at 5 a multiprocessor)."""
    gl.static_assert(gl.num_warps() == 4, "one warpgroup: the MMA's 64 rows")
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HP, 32]
    )
    args = (q_ptr, w_ptr, cache_ptr, table_ptr, lens_ptr, out_ptr, cache_block_stride,
            table_stride, out_stride, max_ctx, num_ctx_blocks)  # fmt: skip
    if PERSISTENT:
        # (batch and num_ctx_blocks may arrive as constexpr 1s, specialised by the launch.)
        lo, hi = _share(num_ctx_blocks, batch)
        for b in range(lo // num_ctx_blocks, (hi + num_ctx_blocks - 1) // num_ctx_blocks):
            base = b * num_ctx_blocks
            first = gl.maximum(lo, base) - base
            last = gl.minimum(hi, base + num_ctx_blocks) - base
            _score_request(*args, b.to(gl.int64), first, last, 1, H, HP, STAGES, MXFP4,
                           OVERLAP, PAIRS, REGISTERS, acc_layout)  # fmt: skip
            _cta_barrier()  # every warp done with the request's shared memory
    else:
        _score_request(*args, gl.program_id(0).to(gl.int64), gl.program_id(1), num_ctx_blocks,
                       SPLITS, H, HP, STAGES, MXFP4, OVERLAP, PAIRS, REGISTERS,
                       acc_layout)  # fmt: skip


@gluon.jit
def _score_fp8_pages(
    q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, split, length,
    key_blocks, max_ctx, SPLITS, H: gl.constexpr, HP: gl.constexpr, STAGES: gl.constexpr,
    OVERLAP: gl.constexpr, acc_layout: gl.constexpr,
):  # fmt: skip
    """fp8 keys: each page's codes go by cp.async straight into an MMA-swizzled ring stage,
    which the warpgroup MMA reads as it lies; no register ever holds a key."""
    gl.static_assert(STAGES >= 2, "a page in hand and one in flight")
    rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    heads_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    keys_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])

    key_rows = gl.arange(0, BLOCK_SIZE, layout=gl.SliceLayout(1, keys_layout))
    key_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, keys_layout))
    key_offs = gl.expand_dims(key_rows * HEAD_DIM, 1) + gl.expand_dims(key_cols, 0)
    scale_offs = gl.arange(0, BLOCK_SIZE, layout=ROW_WORDS_COPY)
    keys_ring = gl.allocate_shared_memory(
        gl.float8e4nv, [STAGES, BLOCK_SIZE, HEAD_DIM], FP8_OPERAND_SMEM
    )
    scales_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_SIZE], ROW_WORDS_SMEM)
    for s in gl.static_range(STAGES - 1):
        first = split + s * SPLITS
        _issue_page(
            keys_ring, scales_ring, s, _page_block(table_row, first, key_blocks), first,
            key_blocks, cache_ptr, cache_block_stride, key_offs, scale_offs, HEAD_DIM,
        )  # fmt: skip
    ahead = (STAGES - 1) * SPLITS  # the page issued in an iteration, after the one it scores
    blk = _page_block(table_row, split + ahead, key_blocks)
    q_smem, w = _queries_and_weights(q_ptr, w_ptr, b, H, HP, heads_layout)

    # OVERLAP: each page's MMA runs while the previous page's logits are summed and stored.
    done = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)  # the previous page's product
    done_scale = gl.zeros([BLOCK_SIZE], gl.float32, rows_layout)
    i = 0
    for j in range(split, key_blocks, SPLITS):
        _issue_page(
            keys_ring, scales_ring, (i + STAGES - 1) % STAGES, blk, j + ahead, key_blocks,
            cache_ptr, cache_block_stride, key_offs, scale_offs, HEAD_DIM,
        )  # fmt: skip
        blk = _page_block(table_row, j + ahead + SPLITS, key_blocks)
        async_copy.wait_group(STAGES - 1)  # page j's group, the oldest
        fence_async_shared()  # this thread's copies before the MMA's async-proxy reads
        stage = i % STAGES
        scale = scales_ring.index(stage).load(rows_layout).to(gl.float32, bitcast=True)
        zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
        tok = j * BLOCK_SIZE + out_rows
        if OVERLAP:
            pending = warpgroup_mma(
                keys_ring.index(stage), q_smem.permute((1, 0)), zero, use_acc=False,
                is_async=True,
            )  # fmt: skip
            if i > 0:
                prev = tok - SPLITS * BLOCK_SIZE
                _store_logits(done, w, done_scale, prev, length, max_ctx, out_row)
            # Every warp waits for page j's MMA here, before the next iteration copies into
            # the stage it read (each copy goes into the stage read one iteration before).
            done = _mma_result(pending)
            done_scale = scale
        else:
            acc = warpgroup_mma(keys_ring.index(stage), q_smem.permute((1, 0)), zero, use_acc=False)
            _store_logits(acc, w, scale, tok, length, max_ctx, out_row)
        i += 1
    if OVERLAP and i > 0:
        last = (split + (i - 1) * SPLITS) * BLOCK_SIZE + out_rows
        _store_logits(done, w, done_scale, last, length, max_ctx, out_row)


@gluon.jit
def _score_mxfp4_pages(
    q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, split, length,
    key_blocks, max_ctx, SPLITS, H: gl.constexpr, HP: gl.constexpr, STAGES: gl.constexpr,
    acc_layout: gl.constexpr,
):  # fmt: skip
    """mxfp4 keys: each page's packed words and code words by cp.async into a ring, unpacked
    to e4m3 codes with the groups' exponents folded in, one MMA a page (module docstring)."""
    gl.static_assert(STAGES >= 3, "a page in hand, the next one's codes, one in flight")
    rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    heads_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    rows, groups, word_offs = _packed_word_offsets()
    scale_offs = gl.arange(0, BLOCK_SIZE, layout=ROW_WORDS_COPY)
    words_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_SIZE, 4, 4], PACKED_RING_SMEM)
    scales_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_SIZE], ROW_WORDS_SMEM)
    for s in gl.static_range(STAGES - 1):
        first = split + s * SPLITS
        _issue_page(
            words_ring, scales_ring, s, _page_block(table_row, first, key_blocks), first,
            key_blocks, cache_ptr, cache_block_stride, word_offs, scale_offs, ELEM_BYTES,
        )  # fmt: skip
    ahead = (STAGES - 1) * SPLITS  # the page issued in an iteration, after the one it scores
    blk = _page_block(table_row, split + ahead, key_blocks)

    q_smem, w = _queries_and_weights(q_ptr, w_ptr, b, H, HP, heads_layout)
    # The page's e4m3 codes: stored as int32 words, read by the MMA as fp8 (same bytes: both
    # layouts swizzle 16-byte chunks of 128-byte rows).
    a_words = gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE, 32], CODE_WORDS_SMEM)
    a_codes = _as_fp8(a_words)
    # flags.index(p): each half's widest key spread in the page of parity p (see _note_spread)
    flags = gl.allocate_shared_memory(gl.int32, [2, 2], ROW_WORDS_SMEM)
    async_copy.wait_group(STAGES - 2)  # the first page
    _note_spread(flags.index(0), scales_ring.index(0), split, length)
    # Once here, so that the loop's copies into the ring need none (without it the compiler
    # puts one before every page's copy, for the read above).
    _cta_barrier()

    i = 0
    for j in range(split, key_blocks, SPLITS):
        # Into the stage read in the last iteration: that iteration's product barrier ended
        # its reads, so this copy needs no barrier of its own.
        _issue_page(
            words_ring, scales_ring, (i + STAGES - 1) % STAGES, blk, j + ahead, key_blocks,
            cache_ptr, cache_block_stride, word_offs, scale_offs, ELEM_BYTES,
        )  # fmt: skip
        blk = _page_block(table_row, j + ahead + SPLITS, key_blocks)
        # Pages j and j + SPLITS complete (the next page's codes decide its fold, below)
        async_copy.wait_group(STAGES - 2)
        stage = i % STAGES
        words = words_ring.index(stage).load(PACKED_WORDS)
        # Each key's 4 group codes as one word, read where the unpack and the product need it;
        # zero past the keys (stale bytes there, whose scores are written as -inf).
        key_scales = scales_ring.index(stage).load(PACKED_KEY_ROWS)
        key_scales = gl.where(j * BLOCK_SIZE + rows < length, key_scales, 0)
        row_scales = scales_ring.index(stage).load(rows_layout)
        tok = j * BLOCK_SIZE + out_rows
        row_scales = gl.where(tok < length, row_scales, 0)

        shift = _shifts(key_scales, groups)
        widest = gl.max(flags.index(i % 2).load(FLAGS_LAYOUT), axis=0)
        if widest <= MAX_FOLD:
            acc = _page_product(a_words, a_codes, q_smem, _unpacked(words, shift), HP, acc_layout)
            scale = _power_of_two(_largest_code(row_scales))
        else:
            # Four products, group g's codes alone (the others' words zeroed) scaled by 2^e_g.
            # The first outside the loop: its barrier then ends this iteration's reads of the
            # ring and the flags on this path too, so the writes that follow need none.
            acc = _four_products(a_words, a_codes, q_smem, words, groups, row_scales, HP,
                                 acc_layout)  # fmt: skip
            scale = gl.full([BLOCK_SIZE], 1.0, gl.float32, rows_layout)
        _store_logits(acc, w, scale, tok, length, max_ctx, out_row)
        # The next page's decision, after this page's product (its barrier ends the reads of
        # the flags above) and before the next wait's barrier (which makes them visible).
        _note_spread(flags.index((i + 1) % 2), scales_ring.index((i + 1) % STAGES), j + SPLITS,
                     length)  # fmt: skip
        i += 1  # noqa: SIM113 (a kernel loop has no enumerate)


@gluon.jit
def _score_mxfp4_pairs(
    q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, split, length,
    key_blocks, max_ctx, SPLITS, H: gl.constexpr, HP: gl.constexpr, STAGES: gl.constexpr,
    acc_layout: gl.constexpr,
):  # fmt: skip
    """mxfp4 keys, two pages an iteration: one ring wait and one barrier serve both pages'
    codes and their fold decision (each half's widest key spread over the two, noted before
    that barrier). A program's even pages go to one ring and its odd pages to another, so that
    the two copies an iteration issues need no barrier between them."""
    gl.static_assert(STAGES >= 4 and STAGES % 2 == 0, "a pair in hand, pairs in flight")
    RING: gl.constexpr = STAGES // 2  # pairs in flight or in hand
    rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    heads_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    rows, groups, word_offs = _packed_word_offsets()
    scale_offs = gl.arange(0, BLOCK_SIZE, layout=ROW_WORDS_COPY)
    even_words = gl.allocate_shared_memory(gl.int32, [RING, BLOCK_SIZE, 4, 4], PACKED_RING_SMEM)
    odd_words = gl.allocate_shared_memory(gl.int32, [RING, BLOCK_SIZE, 4, 4], PACKED_RING_SMEM)
    even_scales = gl.allocate_shared_memory(gl.int32, [RING, BLOCK_SIZE], ROW_WORDS_SMEM)
    odd_scales = gl.allocate_shared_memory(gl.int32, [RING, BLOCK_SIZE], ROW_WORDS_SMEM)
    for s in gl.static_range(RING - 1):
        first = split + 2 * s * SPLITS
        _issue_pair(
            even_words, even_scales, odd_words, odd_scales, s,
            _page_block(table_row, first, key_blocks),
            _page_block(table_row, first + SPLITS, key_blocks), first, SPLITS, key_blocks,
            cache_ptr, cache_block_stride, word_offs, scale_offs,
        )  # fmt: skip
    ahead = (STAGES - 2) * SPLITS  # the pair issued in an iteration, after the one it scores
    blk = _page_block(table_row, split + ahead, key_blocks)
    blk2 = _page_block(table_row, split + ahead + SPLITS, key_blocks)

    q_smem, w = _queries_and_weights(q_ptr, w_ptr, b, H, HP, heads_layout)
    words_first = gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE, 32], CODE_WORDS_SMEM)
    words_second = gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE, 32], CODE_WORDS_SMEM)
    codes_first = _as_fp8(words_first)
    codes_second = _as_fp8(words_second)
    flags = gl.allocate_shared_memory(gl.int32, [2, 2], ROW_WORDS_SMEM)
    _cta_barrier()  # the queries' store, once here (else the compiler puts one in the loop)

    p = 0
    for j in range(split, key_blocks, 2 * SPLITS):
        # Into the stages read in the last iteration, whose code barrier ended those reads.
        stage = p % RING
        _issue_pair(
            even_words, even_scales, odd_words, odd_scales, (p + RING - 1) % RING, blk, blk2,
            j + ahead, SPLITS, key_blocks, cache_ptr, cache_block_stride, word_offs, scale_offs,
        )  # fmt: skip
        blk = _page_block(table_row, j + ahead + 2 * SPLITS, key_blocks)
        blk2 = _page_block(table_row, j + ahead + 3 * SPLITS, key_blocks)
        async_copy.wait_group(STAGES - 2)  # pages j and j + SPLITS
        j2 = j + SPLITS
        words = even_words.index(stage).load(PACKED_WORDS)
        words2 = odd_words.index(stage).load(PACKED_WORDS)
        key_scales = even_scales.index(stage).load(PACKED_KEY_ROWS)
        key_scales = gl.where(j * BLOCK_SIZE + rows < length, key_scales, 0)
        key_scales2 = odd_scales.index(stage).load(PACKED_KEY_ROWS)
        key_scales2 = gl.where(j2 * BLOCK_SIZE + rows < length, key_scales2, 0)
        tok = j * BLOCK_SIZE + out_rows
        tok2 = j2 * BLOCK_SIZE + out_rows
        row_scales = gl.where(tok < length, even_scales.index(stage).load(rows_layout), 0)
        row_scales2 = gl.where(tok2 < length, odd_scales.index(stage).load(rows_layout), 0)

        words_first.store(_unpacked(words, _shifts(key_scales, groups)))
        words_second.store(_unpacked(words2, _shifts(key_scales2, groups)))
        spread = gl.maximum(
            _page_spread(even_scales.index(stage), j, length),
            _page_spread(odd_scales.index(stage), j2, length),
        )
        _note_widest(flags.index(p % 2), spread)
        fence_async_shared()  # the generic-proxy stores before the MMA's async-proxy reads
        widest = gl.max(flags.index(p % 2).load(FLAGS_LAYOUT), axis=0)  # after the barrier
        zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
        if widest <= MAX_FOLD:
            acc = warpgroup_mma(codes_first, q_smem.permute((1, 0)), zero, use_acc=False)
            scale = _power_of_two(_largest_code(row_scales))
            _store_logits(acc, w, scale, tok, length, max_ctx, out_row)
            if j2 < key_blocks:
                acc = warpgroup_mma(codes_second, q_smem.permute((1, 0)), zero, use_acc=False)
                scale = _power_of_two(_largest_code(row_scales2))
                _store_logits(acc, w, scale, tok2, length, max_ctx, out_row)
        else:
            one = gl.full([BLOCK_SIZE], 1.0, gl.float32, rows_layout)
            acc = _four_products(words_first, codes_first, q_smem, words, groups, row_scales,
                                 HP, acc_layout)  # fmt: skip
            _store_logits(acc, w, one, tok, length, max_ctx, out_row)
            if j2 < key_blocks:
                acc = _four_products(words_first, codes_first, q_smem, words2, groups,
                                     row_scales2, HP, acc_layout)  # fmt: skip
                _store_logits(acc, w, one, tok2, length, max_ctx, out_row)
        p += 1  # noqa: SIM113 (a kernel loop has no enumerate)


@gluon.jit
def _register_operand(words, shift, acc_layout: gl.constexpr):
    """The MMA's fp8 register operand [64, 128] of packed ``words`` [64, 4, 4] (KEY_WORDS),
    group g's codes lowered by ``shift`` [64, 4] (KEY_GROUPS). Every layout step below is
    the same registers renamed (asserted trivial): the unpack's two words a packed word go
    to K positions 16 apart, then each code word is read as four fp8 bytes."""
    low, high = _lowered_tables(shift, words)
    first, second = gl.inline_asm_elementwise(
        UNPACK_NATURAL_ASM,
        "=r,=r,r,r,r",
        [words, low, high],
        dtype=(gl.int32, gl.int32),
        is_pure=True,
        pack=1,
    )
    # [row, group c, word j, half h] -> code word 8j + 4h + c
    codes = gl.reshape(gl.permute(gl.join(first, second), (0, 2, 3, 1)), [BLOCK_SIZE, 32])
    codes = gl.convert_layout(codes, gl.SliceLayout(2, CODE_BYTES), assert_trivial=True)
    widened = gl.expand_dims(codes, 2) + gl.zeros([BLOCK_SIZE, 32, 4], gl.int32, CODE_BYTES)
    # pack=4: the four copies of a word in, its four bytes out as one register of fp8
    operand = gl.inline_asm_elementwise(
        "mov.b32 $0, $1;",
        "=r,r,r,r,r",
        [gl.reshape(widened, [BLOCK_SIZE, HEAD_DIM])],
        dtype=gl.float8e4nv,
        is_pure=True,
        pack=4,
    )
    key_operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4)
    return gl.convert_layout(operand, key_operand, assert_trivial=True)


@gluon.jit
def _register_four_products(q_smem, words, groups, row_scales, HP: gl.constexpr,
                            acc_layout: gl.constexpr):  # fmt: skip
    """As _four_products, the codes in registers: group g's words alone (a thread holds one
    group), unlowered, scaled by 2^e_g."""
    zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
    unlowered = gl.zeros([BLOCK_SIZE, 4], gl.int32, KEY_GROUPS)
    acc = zero
    for g in range(4):  # a loop, not unrolled: the path is rare and its code would be 4x
        mine = gl.expand_dims(gl.expand_dims(groups == g, 0), 2)
        operand = _register_operand(gl.where(mine, words, 0), unlowered, acc_layout)
        part = warpgroup_mma(operand, q_smem.permute((1, 0)), zero, use_acc=False)
        acc += part * gl.expand_dims(_power_of_two((row_scales >> (8 * g)) & 0xFF), 1)
    return acc


@gluon.jit
def _score_register_page(
    q_smem, w, words, scales, next_scales, free_words, free_scales, decide, decide_shifts,
    decide_scales, note, note_shifts, note_scales, cache_ptr, cache_block_stride, table_row,
    out_row, out_rows, groups, word_offs, scale_offs, blk, j, first, done, done_scale, length,
    key_blocks, max_ctx, SPLITS, HP: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
    acc_layout: gl.constexpr,
):  # fmt: skip
    """Page j from its stage (``words``, ``scales``) at one barrier, after which every thread's
    copies of pages j and j + SPLITS are visible and every read of the stage the last page
    used (``free_words``, ``free_scales``) is done, so page j + (STAGES - 1) * SPLITS may be
    copied into it. ``decide``, ``decide_shifts`` and ``decide_scales`` hold page j's fold
    (_note_fold), noted before that barrier; page j + SPLITS's (from ``next_scales``) go into
    ``note``, ``note_shifts`` and ``note_scales``, which the next page's barrier makes
    visible. Returns the block of the page copied at the next page, and with
    OVERLAP page j's product and scales, whose logits the next page (or the loop's end) stores
    as this one stores the previous page's (``done``, ``done_scale``)."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    async_copy.wait_group(STAGES - 3)  # pages j and j + SPLITS
    _cta_barrier()
    ahead = (STAGES - 1) * SPLITS
    _issue_page(
        free_words, free_scales, 0, blk, j + ahead, key_blocks, cache_ptr, cache_block_stride,
        word_offs, scale_offs, ELEM_BYTES,
    )  # fmt: skip
    blk = _page_block(table_row, j + ahead + SPLITS, key_blocks)
    packed = words.index(0).load(KEY_WORDS)
    tok = j * BLOCK_SIZE + out_rows
    # the same rows in each thread as its packed words: the unpack's folds read them so
    key_shifts = gl.convert_layout(decide_shifts.load(rows_layout), KEY_ROWS,
                                   assert_trivial=True)  # fmt: skip
    shift = _group_bytes(key_shifts, groups)
    widest = gl.max(decide.load(FLAGS_LAYOUT), axis=0)
    _note_fold(note, note_shifts, note_scales, next_scales.index(0), j + SPLITS, length)
    if OVERLAP:
        # The folded product async (its result discarded where the page does not fold),
        # the previous page's logits summed and stored while it runs.
        operand = _register_operand(packed, shift, acc_layout)
        zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
        pending = warpgroup_mma(operand, q_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
        # (no branch: ptxas then keeps it before the wait; the first page's goes past max_ctx)
        prev = gl.where(j > first, tok - SPLITS * BLOCK_SIZE, max_ctx)
        _store_logits(done, w, done_scale, prev, length, max_ctx, out_row)
        acc = _mma_result(pending)
        scale = decide_scales.load(rows_layout).to(gl.float32, bitcast=True)
        if widest > MAX_FOLD:
            row_scales = gl.where(tok < length, scales.index(0).load(rows_layout), 0)
            acc = _register_four_products(q_smem, packed, groups, row_scales, HP, acc_layout)
            scale = gl.full([BLOCK_SIZE], 1.0, gl.float32, rows_layout)
        return blk, acc, scale
    else:
        if widest <= MAX_FOLD:
            operand = _register_operand(packed, shift, acc_layout)
            zero = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
            acc = warpgroup_mma(operand, q_smem.permute((1, 0)), zero, use_acc=False)
            scale = decide_scales.load(rows_layout).to(gl.float32, bitcast=True)
        else:
            row_scales = gl.where(tok < length, scales.index(0).load(rows_layout), 0)
            acc = _register_four_products(q_smem, packed, groups, row_scales, HP, acc_layout)
            scale = gl.full([BLOCK_SIZE], 1.0, gl.float32, rows_layout)
        _store_logits(acc, w, scale, tok, length, max_ctx, out_row)
        return blk, done, done_scale


@gluon.jit
def _stage_buffers(STAGES: gl.constexpr):
    """STAGES packed-word stages and their scale rows, each an allocation of its own."""
    words = ()
    scales = ()
    for _ in gl.static_range(STAGES):
        words += (gl.allocate_shared_memory(gl.int32, [1, BLOCK_SIZE, 4, 4], PACKED_RING_SMEM),)
        scales += (gl.allocate_shared_memory(gl.int32, [1, BLOCK_SIZE], ROW_WORDS_SMEM),)
    return words, scales


@gluon.jit
def _score_mxfp4_registers(
    q_ptr, w_ptr, cache_ptr, cache_block_stride, table_row, out_row, out_rows, b, split, length,
    key_blocks, max_ctx, SPLITS, H: gl.constexpr, HP: gl.constexpr, STAGES: gl.constexpr,
    OVERLAP: gl.constexpr, acc_layout: gl.constexpr,
):  # fmt: skip
    """mxfp4 keys, the codes in registers: each page's packed words load from the ring into
    the rows and K positions the MMA's register operand holds (KEY_WORDS), unpack there and
    feed the MMA as they lie, so no code goes through shared memory and a page costs one
    barrier. That needs every ring stage and both flag buffers (taken in turn) to be
    allocations of their own, known at compile time: the compiler's barrier placement does
    not tell apart the slices of one allocation, and would add a barrier between a page's
    reads of the ring and its copy into it. So the loop takes STAGES pages an iteration."""
    # a page in hand, the next one's scales, pages in flight; an even count: the flags in turn
    gl.static_assert(STAGES >= 4 and STAGES % 2 == 0, "registers takes an even stages >= 4")
    heads_layout: gl.constexpr = gl.SliceLayout(0, acc_layout)
    rows_layout: gl.constexpr = gl.SliceLayout(1, acc_layout)
    _, _, word_offs = _packed_word_offsets()
    groups = gl.arange(0, 4, layout=gl.SliceLayout(0, KEY_GROUPS))
    scale_offs = gl.arange(0, BLOCK_SIZE, layout=ROW_WORDS_COPY)
    words, scales = _stage_buffers(STAGES)
    flags = (
        gl.allocate_shared_memory(gl.int32, [2], ROW_WORDS_SMEM),
        gl.allocate_shared_memory(gl.int32, [2], ROW_WORDS_SMEM),
    )
    # each page's shifts and scales beside its flags, taken in turn alike (_note_fold):
    # (shifts, scales) of the even pages, then of the odd ones
    folds = (
        gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE], ROW_WORDS_SMEM),
        gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE], ROW_WORDS_SMEM),
        gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE], ROW_WORDS_SMEM),
        gl.allocate_shared_memory(gl.int32, [BLOCK_SIZE], ROW_WORDS_SMEM),
    )
    for s in gl.static_range(STAGES - 1):
        page = split + s * SPLITS
        _issue_page(
            words[s], scales[s], 0, _page_block(table_row, page, key_blocks), page, key_blocks,
            cache_ptr, cache_block_stride, word_offs, scale_offs, ELEM_BYTES,
        )  # fmt: skip
    blk = _page_block(table_row, split + (STAGES - 1) * SPLITS, key_blocks)
    q_smem, w = _queries_and_weights(q_ptr, w_ptr, b, H, HP, heads_layout, True)
    # The queries' generic-proxy stores before the MMAs' async-proxy reads (the barrier below
    # then orders every thread's stores before any warp's first MMA).
    fence_async_shared()
    async_copy.wait_group(STAGES - 2)  # the first page
    _cta_barrier()
    _note_fold(flags[0], folds[0], folds[1], scales[0].index(0), split, length)

    # OVERLAP: the page before's product and scales, summed and stored beside this page's MMA
    done = gl.zeros([BLOCK_SIZE, HP], gl.float32, acc_layout)
    done_scale = gl.zeros([BLOCK_SIZE], gl.float32, rows_layout)
    for j in range(split, key_blocks, STAGES * SPLITS):
        for s in gl.static_range(STAGES):
            page = j + s * SPLITS
            if page < key_blocks:
                blk, done, done_scale = _score_register_page(
                    q_smem, w, words[s], scales[s], scales[(s + 1) % STAGES],
                    words[(s + STAGES - 1) % STAGES], scales[(s + STAGES - 1) % STAGES],
                    flags[s % 2], folds[2 * (s % 2)], folds[2 * (s % 2) + 1],
                    flags[(s + 1) % 2], folds[2 * ((s + 1) % 2)], folds[2 * ((s + 1) % 2) + 1],
                    cache_ptr, cache_block_stride, table_row,
                    out_row, out_rows, groups, word_offs, scale_offs, blk, page, split, done,
                    done_scale, length, key_blocks, max_ctx, SPLITS, HP, STAGES, OVERLAP,
                    acc_layout,
                )  # fmt: skip
    if OVERLAP and split < key_blocks:  # the last page's logits
        last = split + (key_blocks - 1 - split) // SPLITS * SPLITS
        _store_logits(done, w, done_scale, last * BLOCK_SIZE + out_rows, length, max_ctx, out_row)


class KeyKernel(NamedTuple):
    """A key format's kernel and its launch defaults (from gpu_ops.py --tune)."""

    mxfp4: bool  # the kernel's MXFP4 switch
    elem_bytes: int  # bytes of a key's elements
    stages: int
    pairs: bool  # mxfp4: two pages an iteration
    max_registers: int | None  # ptxas's cap a thread, None for none
    per_sm: int  # programs a multiprocessor holds uncapped
    persistent: bool  # the persistent grid, else the split one
    registers_from: int | None = None  # mxfp4: the register form from this many pages a program


# mxfp4: 161 registers a thread uncapped, 3 programs of 4 warps (shared memory holds 5); capped
# at 128, 4. fp8: 64-79 registers, 5 programs by shared memory at up to 4 stages of 8.25 KiB and
# the queries. Tuned on H100s (B=64, H=64, DeepGEMM's fp8 in the same run; docs/benchmarks.md,
# 2026-12-06 and 2026-12-07): mxfp4 paired and capped, 131072 tokens: the split grid at 6 stages
# 347.6 us (paired uncapped ~370, one page an iteration ~425); the persistent grid at 4 stages
# par with it (352 against 348-350 in one run). fp8: persistent at 2 stages 387.1 us against
# DeepGEMM 387.6 (split at 4: 391.9), 399.5 against 399.7 on another H100 (split 409-411);
# batch 1 5.9 us against DeepGEMM 5.6 (3 stages 6.6). mxfp4's register form (H100, 2026-12-07,
# persistent, 4 stages, capped at 128; paired in the same run): 317.3 against 349.0 us at 64 x
# 131072 (248 pages a program), 85.4 against 91.8 at 64 x 32768 (62), par at 4 x 131072 (15.5:
# 24.5 / 24.4), slower below (8 x 32768, 7.8 pages: 14.7 / 13.8; 1 x 131072, 3.9: 10.6 / 8.2),
# where its longer start (three pages issued, the queries gathered in its K order) is most of
# a program's time. 6 and 8 stages 319.8 and 325.5; 96 registers (5 programs an SM) 346.6. At
# 250 instructions a page (316027c, 2026-12-08): 285.0 against DeepGEMM's 386.8 at 64 x 131072.
KERNELS = {
    "mxfp4": KeyKernel(
        True, 64, 4, pairs=True, max_registers=128, per_sm=3, persistent=True, registers_from=16
    ),
    "fp8": KeyKernel(False, 128, 2, pairs=False, max_registers=None, per_sm=5, persistent=True),
}


def default_splits(batch: int, num_ctx_blocks: int, multiprocessors: int, per_sm: int) -> int:
    """Programs per request: about ``per_sm`` resident programs a multiprocessor in one wave,
    each with at least 4 pages."""
    waves_worth = max(1, per_sm * multiprocessors // max(batch, 1))
    return max(1, min(triton.cdiv(num_ctx_blocks, 4), waves_worth))


def takes_registers(fmt: str, stages: int, pairs: bool | None, pages_a_program: float) -> bool:
    """Whether :func:`logits_paged` takes the register form by default: mxfp4 keys, an even
    stage count of at least 4, ``pairs`` unset, and each program at least the format's
    ``registers_from`` pages (below that the form's longer start costs more than it saves)."""
    start = KERNELS[fmt].registers_from
    even = stages >= 4 and stages % 2 == 0
    return start is not None and even and pairs is None and pages_a_program >= start


def logits_paged(
    q: torch.Tensor,  # [B, 1, H, 128] float8_e4m3fn
    weights: torch.Tensor,  # [B, H] float32
    cache: torch.Tensor,  # [num_blocks, 64 * bytes_per_token] uint8
    fmt: str,  # "mxfp4" or "fp8"
    block_table: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B, 1] int32
    max_ctx: int,
    splits: int | None = None,
    stages: int | None = None,
    overlap: bool = False,
    max_registers: int | None = -1,
    pairs: bool | None = None,
    persistent: bool | None = None,
    registers: bool | None = None,
    specialised: bool = False,
) -> torch.Tensor:  # [B, max_ctx] float32, -inf past each row's length
    """The kernels' launch; the caller (hwrun_nvidia.gluon) has checked the shapes with
    :func:`shape_reasons`. ``splits``: programs a request (default :func:`default_splits`);
    ``stages``: pages a program has in flight or in hand (mxfp4: at least 3, the page scored,
    the next one, whose codes decide its fold, and one in flight; fp8: at least 2); ``overlap``
    (fp8 keys, and the mxfp4 register form, which it then implies): each page's MMA runs async
    while the previous page's logits are summed and stored (fp8: 116 registers a thread against
    64, timed no faster; mxfp4: 128 registers, 1% faster on an H100; off by default);
    ``max_registers``: ptxas's cap a thread, None for none (default -1: the format's, mxfp4
    128: four programs an SM instead of three, for ~10 spill reloads a page from L1); ``pairs``
    (mxfp4 keys, an even number of stages of at least 4): two pages an iteration, one ring wait
    and one barrier for both (default None: the format's, mxfp4 paired when the stages allow
    and the register form is not taken);
    ``persistent``: ``per_sm`` programs a multiprocessor (or fewer, each with at least 4 pages),
    each taking an equal contiguous share of all requests' pages (default None: the format's,
    persistent unless ``splits`` is given); ``registers`` (mxfp4 keys): each page's codes
    unpacked into the MMA's register operand as they lie, one barrier a page and no code in
    shared memory (:func:`_score_mxfp4_registers`; default None: taken where the grid gives
    each program at least the format's ``registers_from`` pages and ``pairs`` is unset);
    ``specialised`` (mxfp4 keys, at most 64 heads; off by default, not yet run on a GPU): the
    register form fed by loader warps (gluon_paged_logits_ws), ``stages`` its ring's pages
    (default 12), no other option."""
    if specialised:
        unset = {"splits": None, "overlap": False, "max_registers": -1, "pairs": None,
                 "persistent": None, "registers": None}  # fmt: skip
        given = {"splits": splits, "overlap": overlap, "max_registers": max_registers,
                 "pairs": pairs, "persistent": persistent, "registers": registers}  # fmt: skip
        others = [name for name, value in given.items() if value != unset[name]]
        return _launch_specialised(q, weights, cache, fmt, block_table, context_lens, max_ctx,
                                   stages, others)  # fmt: skip
    kernel = KERNELS[fmt]
    mxfp4, per_sm = kernel.mxfp4, kernel.per_sm
    stages = kernel.stages if stages is None else stages
    if persistent is None:
        persistent = kernel.persistent and splits is None
    if overlap and mxfp4:
        if registers is False or pairs:
            raise ValueError(
                "gluon logits_paged: overlap is a form of the fp8 keys' kernel and of the "
                "mxfp4 register form (leave registers and pairs unset)"
            )
        registers = True
    if registers and not mxfp4:
        raise ValueError("gluon logits_paged: registers is a form of the mxfp4 keys' kernel only")
    if registers and pairs:
        raise ValueError("gluon logits_paged: registers has its own page loop (leave pairs unset)")
    if registers and (stages < 4 or stages % 2):
        raise ValueError(f"gluon logits_paged: registers takes an even stages >= 4, got {stages}")
    if max_registers == -1:
        max_registers = kernel.max_registers
    if max_registers is not None:  # registers bind: shared memory holds 5 mxfp4 programs
        per_sm = max(1, 65536 // (128 * max_registers))
    if stages < (3 if fmt == "mxfp4" else 2):
        raise ValueError(f"gluon logits_paged: stages={stages} is too few for {fmt} keys")
    if pairs and not mxfp4:
        raise ValueError("gluon logits_paged: pairs is a form of the mxfp4 keys' kernel only")
    if pairs and (stages < 4 or stages % 2):
        raise ValueError(f"gluon logits_paged: pairs takes an even stages >= 4, got {stages}")
    if persistent and splits is not None:
        raise ValueError(
            f"gluon logits_paged: splits={splits} sets the split grid; persistent=True shares "
            "the pages out itself (leave splits unset)"
        )
    B, H = q.shape[0], q.shape[2]
    out = torch.empty((B, max_ctx), dtype=torch.float32, device=q.device)
    if B == 0 or max_ctx == 0:
        return out
    num_ctx_blocks = triton.cdiv(max_ctx, BLOCK_SIZE.value)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    if persistent:
        grid = (max(1, min(per_sm * sms, triton.cdiv(B * num_ctx_blocks, 4))),)
        splits = 1
    else:
        if splits is None:
            splits = default_splits(B, num_ctx_blocks, sms, per_sm)
        grid = (B, splits)
    if registers is None:
        registers = takes_registers(fmt, stages, pairs, B * num_ctx_blocks / math.prod(grid))
    if pairs is None:
        pairs = kernel.pairs and stages >= 4 and stages % 2 == 0 and not registers
    table = block_table.to(torch.int32)
    _paged_logits_kernel[grid](
        *paged_kernel_args(q, weights, cache, table, context_lens, out, max_ctx, num_ctx_blocks),
        splits,
        B,
        H=H,
        HP=max(16, triton.next_power_of_2(H)),
        STAGES=stages,
        MXFP4=mxfp4,
        OVERLAP=overlap,
        PAIRS=pairs,
        REGISTERS=registers,
        PERSISTENT=persistent,
        num_warps=4,
        **({} if max_registers is None else {"maxnreg": max_registers}),
    )
    return out


def _launch_specialised(q, weights, cache, fmt, block_table, context_lens, max_ctx, stages,
                        others: list[str]) -> torch.Tensor:  # fmt: skip
    """logits_paged(..., specialised=True), its options checked: its own grid, ring and
    registers, so the other forms' options (``others``: those the caller set) do not apply."""
    from hwrun_nvidia import gluon_paged_logits_ws

    if fmt != "mxfp4":
        raise ValueError(
            f"gluon logits_paged: specialised is a form of the mxfp4 kernel, got {fmt}"
        )
    if q.shape[2] > gluon_paged_logits_ws.MAX_HEADS:
        raise ValueError(
            f"gluon logits_paged: specialised takes at most {gluon_paged_logits_ws.MAX_HEADS} "
            f"heads (its consumers' registers), got {q.shape[2]}"
        )
    if others:
        raise ValueError(
            f"gluon logits_paged: specialised has its own grid, ring and registers, got "
            f"{', '.join(others)} (leave them unset)"
        )
    return gluon_paged_logits_ws.logits_paged(
        q, weights, cache, block_table, context_lens, max_ctx,
        **({} if stages is None else {"stages": stages}),
    )  # fmt: skip


def shape_reasons(q: torch.Tensor, cache: torch.Tensor, fmt: str) -> list[str]:
    """Why these kernels cannot take the call (empty when they can); such calls go to Triton's."""
    if fmt not in KERNELS:
        return [f"it reads {list(KERNELS)} index keys, got {fmt!r}"]
    reasons = []
    if q.dtype != torch.float8_e4m3fn:
        reasons.append(f"it multiplies fp8 queries, got {q.dtype}")
    if q.dim() != 4 or q.shape[1] != 1 or q.shape[3] != HEAD_DIM.value or q.shape[2] > MAX_HEADS:
        reasons.append(
            f"it takes q [B, 1, H <= {MAX_HEADS}, {HEAD_DIM.value}] (one query row a request), got "
            f"{tuple(q.shape)}"
        )
    page_bytes = BLOCK_SIZE.value * (KERNELS[fmt].elem_bytes + 4)
    if cache.dim() != 2 or cache.shape[1] != page_bytes or cache.stride(1) != 1:
        reasons.append(f"it reads contiguous 64-token pages of {page_bytes} B for {fmt} keys")
    elif cache.stride(0) % 16 or cache.data_ptr() % 16:
        reasons.append(
            "it copies 16-byte chunks: the page stride and start must be 16-byte aligned"
        )
    return reasons
