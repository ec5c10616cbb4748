"""sparse_mla.decode as a Gluon kernel for Hopper (sm_90), over fp8_ds_mla latent rows.

The Triton kernel takes 2.2x FlashMLA's time at B=64, 128 heads, top-2048: Triton keeps the
dequantized tile in registers and stages it through shared memory for every product, in layouts
it chooses. Here, as in FlashMLA's sm_90 kernel, the tile is decoded once into shared memory as
bf16, in the layout the warpgroup MMA reads, and both products read it there. A program is
(row, 64 heads, split); the queries ([64, 576] bf16) stay in shared memory; a tile is 64 top-k
entries, its rows (656 B: 512 e4m3 codes, four fp32 group scales, 64 bf16 rope values) gathered
16 bytes at a time and decoded as the format decodes (each code times its group's scale rounded
to bf16, the product rounded to bf16) into a ring stage ([64, 512] + [64, 64] bf16).

``_sparse_mla_decode_ws_kernel`` runs three warpgroups, FlashMLA's layout. A producer gathers
half a tile ahead and decodes into a free stage by placing each code in a bf16's bits
(:data:`PLACED_DECODE_ASM`); a softmax warpgroup computes S = Q K^T over the whole tile, the
online softmax (base 2) and O += P V over output columns 0..255; a PV warpgroup O += P V over
columns 256..511 with the softmax warpgroup's P (bf16, in shared memory) and rescale. Stages,
P and the final normalisation are handed over by mbarriers; each warpgroup's registers are set
apart (208 / 168 / 128). The two-warpgroup kernel it replaced (everything in turn, the codes
decoded by conversion instructions; 5fd630f .. f4395e8) was slower at every shape timed: 156.2
us at B=64, 19.6 at B=1 (docs/benchmarks.md).

``decode(..., crossover=True)`` (128 heads; off by default): FlashMLA's crossover. A row's two
head blocks run as one cluster of two CTAs; each producer gathers and decodes half of every
tile and stores it into both CTAs' stages (st.async, 16 bytes a store, whole 128-byte rows a
warp). Correct on an H100 (2026-12-07: outputs equal to the one-CTA kernel's), but not yet
faster: B=64 135.4 us against 129.7, B=128 265.2 against 266.4, B=1 20.1 against 18.8
(docs/benchmarks.md, twenty-sixth session, has the ablations and what is left to try); with
both producers' slots loaded ahead (2026-12-08) B=64 128.8 against 113.3, B=1 20.0 against 18.0.

With more splits than one, the parts are merged by lse_combine, as the Triton kernel's are.
Numerics are the Triton kernel's: the same decode, P rounded to bf16, fp32 accumulators.

Built for sm_90 in CI (plugins/nvidia/tests/test_gluon.py). On an H100 (2026-12-07) it passed
its GPU tests (plugins/nvidia/tests/test_gluon_sparse_mla_gpu.py) and
`hwrun conformance --ops sparse_mla.decode` with HWRUN_GLUON=1 and no FlashMLA was conformant
(51 run, 51 passed). Time at B=64, 128 heads, top-2048 of 262,144 tokens (H100, 2026-12-08):
113.3 us against FlashMLA's 98.6 (1.15x; 129.2 before each half tile's slots were loaded a half
tile ahead of its gathers, whose addresses had held the producer's in-order issue for a load's
latency twice a tile); at B=1 with 16 splits 18.0 us against 17.3 (1.04x) (docs/benchmarks.md).
"""

from __future__ import annotations

import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
)

from hwrun.kernels.triton.lse_combine import combine_parts
from hwrun.kernels.triton.sparse_mla import LATENT_ROW_BYTES
from hwrun_nvidia.gluon_paged_logits import _cta_barrier, _mma_result, _reinterpreted

ROW_BYTES = LATENT_ROW_BYTES["fp8_ds_mla"]  # 512 e4m3 codes, 4 fp32 scales, 64 bf16 rope
BLOCK_N = gl.constexpr(64)  # top-k entries a tile
HEADS = gl.constexpr(64)  # heads a program: the MMA's 64 rows
NOPE = gl.constexpr(512)
ROPE = gl.constexpr(64)
GROUP = gl.constexpr(128)  # codes a scale
LN2 = gl.constexpr(0.6931471805599453)
_LOG2E = math.log2(math.e)
# gl.multiple_of, as Triton 3.9 has it (the H200's 3.6 may not: its loads are then narrower)
HAS_MULTIPLE_OF = gl.constexpr(hasattr(gl, "multiple_of"))

BF16_OPERAND_SMEM = gl.constexpr(
    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
)


@gluon.jit
def _row_slots(slot_row, start, hi, ROWS: gl.constexpr, LAYOUT: gl.constexpr):
    """Entries start .. start+ROWS-1's cache slots (-1 for invalid entries and those past
    ``hi``), in the rows of ``LAYOUT``. Loaded a step before :func:`_gather_rows` takes them:
    the gathers' addresses wait on these, and in a warp's in-order issue so would everything
    after them."""
    j = start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
    return gl.load(slot_row + j, mask=j < hi, other=-1)


@gluon.jit
def _gather_rows(cache_ptr, slot, block_size, block_stride, row_stride, LAYOUT: gl.constexpr):
    """The rows of ``slot`` (a :func:`_row_slots` tensor) as stored (zeros where it is -1), as
    one tuple: the four groups' codes and the rope values ([n, 32] int32 words each for n
    slots, in ``LAYOUT``) and the groups' scales ([n] fp32 each) (w0..w3, s0..s3, rope)."""
    valid = slot >= 0
    safe = gl.where(valid, slot, 0)  # a slot fits int32: the block and row in 32-bit division
    block = (safe // block_size).to(gl.int64)
    row = (safe % block_size).to(gl.int64)
    offs = block * block_stride + row * row_stride
    if HAS_MULTIPLE_OF:  # noqa: SIM108 (constexpr branches as statements, as the jit reads them)
        rows = cache_ptr + gl.multiple_of(offs, 16)
    else:
        rows = cache_ptr + offs
    words = gl.expand_dims(rows.to(gl.pointer_type(gl.int32)), 1) + gl.expand_dims(
        gl.arange(0, 32, layout=gl.SliceLayout(0, LAYOUT)), 0
    )
    live = gl.expand_dims(valid, 1)
    w0 = gl.load(words, mask=live, other=0)
    w1 = gl.load(words + GROUP // 4, mask=live, other=0)
    w2 = gl.load(words + 2 * GROUP // 4, mask=live, other=0)
    w3 = gl.load(words + 3 * GROUP // 4, mask=live, other=0)
    rope = gl.load(words + (NOPE + 16) // 4, mask=live, other=0)
    scales = (rows + NOPE).to(gl.pointer_type(gl.float32))
    s0 = gl.load(scales, mask=valid, other=0.0)
    s1 = gl.load(scales + 1, mask=valid, other=0.0)
    s2 = gl.load(scales + 2, mask=valid, other=0.0)
    s3 = gl.load(scales + 3, mask=valid, other=0.0)
    return (w0, w1, w2, w3, s0, s1, s2, s3, rope)


# $2: four e4m3 codes (element i in byte i); $3: the group's scale rounded to bf16, in both
# halves; $0 / $1: elements 0, 1 / 2, 3 decoded, as bf16 pairs (first low). Each code is placed
# in a bf16's bits (sign to bit 15, exponent and mantissa to bits 10..4: the code's value
# times 2^-120 for every code, subnormals included, as both formats' subnormals have exponent
# field 0); times 2^120, exact, that is the code's value, and times the scale it is rounded
# once, as the format decodes (code times bf16 scale, rounded to bf16). NaN codes (0x7F,
# 0xFF), which the format's encoder never writes, decode to +-480 times the scale.
PLACED_DECODE_ASM = gl.constexpr("""
{
.reg .b32 a, b, p;
mov.b32 p, 0x7B807B80;
prmt.b32 a, $2, 0, 0x9180;
prmt.b32 b, $2, 0, 0xB3A2;
shl.b32 a, a, 4;
shl.b32 b, b, 4;
and.b32 a, a, 0x87F087F0;
and.b32 b, b, 0x87F087F0;
mul.rn.bf16x2 a, a, p;
mul.rn.bf16x2 b, b, p;
mul.rn.bf16x2 $0, a, $3;
mul.rn.bf16x2 $1, b, $3;
}
""")


@gluon.jit
def _rope_values(words):
    """The rope values ([n, 32] int32 words, two bf16 each, first lowest) as [n, 64] bf16."""
    low = (words & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True)
    high = (words >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
    return gl.reshape(gl.join(low, high), [words.shape[0], ROPE])


@gluon.jit
def _span(r, split, slots_ptr, lens_ptr, k, chunk, HAS_LENS: gl.constexpr):
    """The entries lo .. hi-1 of row r's top-k list that part ``split`` attends (each part
    ``chunk`` long, none past the row's length), and the row's slots."""
    limit = k
    if HAS_LENS:
        limit = gl.minimum(gl.load(lens_ptr + r), k)
    lo = split * chunk
    return lo, gl.minimum(lo + chunk, limit), slots_ptr + r * k


@gluon.jit
def _online_softmax(scores, valid, scale_log2, m_i, l_i):
    """A tile's step of the online softmax in base 2: P (invalid entries 0), the rescale of
    what came before, the new running maximum and sum."""
    scores = gl.where(gl.expand_dims(valid, 0), scores * scale_log2, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(scores, axis=1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_safe)
    p = gl.exp2(scores - gl.expand_dims(m_safe, 1))
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _normalisation(l_i, m_i, hb, H, sink_ptr, HAS_SINK: gl.constexpr, layout: gl.constexpr):
    """Heads hb*64 .. hb*64+63 in ``layout`` and which exist, their 1 / sum (0 for a row with
    no valid entry) and natural-log LSE (-inf there) from the online softmax's sum and base-2
    maximum; with HAS_SINK (only where the kernel writes the final output, one split; else
    lse_combine does it) the sink's share taken out."""
    heads = hb * HEADS + gl.arange(0, HEADS, layout=layout)
    h_mask = heads < H
    l_o = gl.convert_layout(l_i, layout)
    m_o = gl.convert_layout(m_i, layout)
    empty = l_o == 0.0
    inv = gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_o))
    lse = gl.where(empty, float("-inf"), (m_o + gl.log2(gl.where(empty, 1.0, l_o))) * LN2)
    if HAS_SINK:
        sink = gl.load(sink_ptr + heads, mask=h_mask, other=0.0)
        inv = inv * gl.where(empty, 0.0, 1.0 / (1.0 + gl.exp(sink - gl.where(empty, 0.0, lse))))
    return heads, h_mask, inv, lse


# Layouts of one warpgroup (4 warps): each partition is one.
HALF = gl.constexpr(32)  # entries the producer gathers at once: half a tile
S_WG_LAYOUT = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
)
O_WG_LAYOUT = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
)
WORDS_WG_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))
Q_WG_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
ROW_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))
SIGNAL_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
# Registers a thread of the PV warpgroup (its [64, 256] fp32 accumulator is 128) and of the
# producer (two half tiles of words in flight, 96); the softmax warpgroup has the rest.
PV_REGS = gl.constexpr(168)
PRODUCER_REGS = gl.constexpr(128)


@gluon.jit
def _placed_words(words, scale):
    """A group's codes ([n, 32] int32 words) decoded by :data:`PLACED_DECODE_ASM`: [n, 64]
    int32 words of bf16 pairs in element order."""
    half = scale.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    pair = gl.expand_dims(half | (half << 16), 1) + gl.zeros_like(words)
    first, second = gl.inline_asm_elementwise(
        PLACED_DECODE_ASM, "=r,=r,r,r", [words, pair], dtype=(gl.int32, gl.int32),
        is_pure=True, pack=1,
    )  # fmt: skip
    return gl.reshape(gl.join(first, second), [words.shape[0], 2 * words.shape[1]])


@gluon.jit
def _store_placed(k_words, k_rope, rows):
    """Gathered rows (a :func:`_gather_rows` tuple), decoded, into a stage's rows: k_words
    [n, 256] (the NoPE values' bf16 pairs, as int32) and k_rope [n, 64]."""
    k_words.slice(0, GROUP // 2, dim=1).store(_placed_words(rows[0], rows[4]))
    k_words.slice(GROUP // 2, GROUP // 2, dim=1).store(_placed_words(rows[1], rows[5]))
    k_words.slice(GROUP, GROUP // 2, dim=1).store(_placed_words(rows[2], rows[6]))
    k_words.slice(3 * GROUP // 2, GROUP // 2, dim=1).store(_placed_words(rows[3], rows[7]))
    k_rope.store(_rope_values(rows[8]))


WORDS_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))


@gluon.jit
def _as_words(k_nope):
    """A stage's bf16 [64, 512] as int32 [64, 256] (same bytes: both layouts swizzle 16-byte
    chunks of 128-byte rows)."""
    return _reinterpreted(k_nope, gl.int32, [BLOCK_N, NOPE // 2], WORDS_SMEM)


# The crossover (FlashMLA's name): the two programs of a 128-head row run as one cluster of two
# CTAs; each gathers and decodes half of every tile (rows rank*32 .. rank*32+31) and stores it
# into its own stage and, from the same registers, into its peer's (the same offsets of the
# peer's shared memory), so each decodes half the rows it reads. Gluon 3.6 has no cluster
# operations, so these are PTX; the offsets of the stages and barriers come from the allocation
# the compiler made (:func:`_crossover_offsets`), the cluster from the launch
# (:func:`_crossover_launch`).
SMEM_BASE_ASM = gl.constexpr("mov.b32 $0, global_smem;")
# Every thread of both CTAs, at the start and end of each partition: the barriers are
# initialised before the peer touches them, and no CTA exits while its peer's stores or
# signals may still reach it.
CLUSTER_SYNC_ASM = gl.constexpr(
    "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;"
)
NOPE_STAGE_BYTES = gl.constexpr(64 * 512 * 2)
ROPE_STAGE_BYTES = gl.constexpr(64 * 64 * 2)
HALF_TILE_BYTES = gl.constexpr(9 * 32 * 128)  # the peer's half: 8 NoPE blocks and the rope
# $1: a word of the peer's, $2: the peer's barrier of a stage (shared::cluster addresses): each
# thread of the warpgroup stores 4 bytes, completing that many of the barrier's expected bytes.
# (One thread's arrival, chosen by %tid.x in the asm, makes ptxas spill the softmax
# warpgroup's MMA descriptors: 320 bytes of stack against 40.)
SIGNAL_ASM = gl.constexpr(
    "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [$1], $1, [$2]; mov.u32 $0, 0;"
)
SIGNAL_BYTES = gl.constexpr(128 * 4)
SIGNAL_LAYOUT = gl.constexpr(gl.BlockedLayout([1], [32], [4], [0]))


# $4..$7: 16 bytes of a row (four int32 words, in order) into the peer at $8, completing on the
# peer's ready barrier $12 (the asm takes four elements of each operand: pack=4).
REMOTE_STORE_ASM = gl.constexpr(
    "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [$8], {$4, $5, $6, $7}, [$12];"
    " mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0;"
)
REMOTE_STORE_CONSTRAINTS = gl.constexpr("=r,=r,=r,=r," + ",".join(["r"] * 12))
# A group's decoded words [32, 64] as the stores take them: 4 consecutive words (a 16-byte
# piece) a thread, 8 threads a 128-byte row, so a warp's remote store covers whole rows (the
# decode's own layout, 32 contiguous bytes a thread, covers every other piece: 161.6 us at B=64
# against 135.4).
STORE_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0]))


@gluon.jit
def _remote_address(local, peer):
    """The peer's address (shared::cluster) of this CTA's shared address ``local``."""
    return gl.inline_asm_elementwise(
        "mapa.shared::cluster.u32 $0, $1, $2;", "=r,r,r", [local, peer], dtype=gl.int32,
        is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def _stage_offsets(rank, WORDS: gl.constexpr, LAYOUT: gl.constexpr):
    """Byte offsets in a stage of this CTA's half's int32 words [32, WORDS] (word w: bytes
    4w .. 4w+3 of the row). A stage in 128-byte swizzle is blocks of 64 bf16 columns (8 KB:
    64 rows of 128 B), each row's 16-byte pieces permuted by the row's index mod 8."""
    i = gl.arange(0, HALF, layout=gl.SliceLayout(1, LAYOUT))
    w = gl.arange(0, WORDS, layout=gl.SliceLayout(0, LAYOUT))
    row = gl.expand_dims(rank * HALF + i, 1)
    piece = gl.expand_dims(w // 4, 0)
    within = gl.expand_dims((w % 4) * 4, 0)
    return (piece // 8) * 8192 + row * 128 + (((piece % 8) ^ (row % 8)) * 16) + within


@gluon.jit
def _remote_store(words, addresses, barrier):
    gl.inline_asm_elementwise(
        REMOTE_STORE_ASM, REMOTE_STORE_CONSTRAINTS,
        [words, addresses, gl.zeros_like(words) + barrier], dtype=gl.int32, is_pure=False,
        pack=4,
    )  # fmt: skip


@gluon.jit
def _store_placed_crossed(k_words, k_rope, rows, remote_nope, remote_rope, remote_ready,
                          nope_offsets, rope_offsets):  # fmt: skip
    """:func:`_store_placed` into this CTA's stage rows (``k_words`` / ``k_rope``, its half)
    and, from the same registers, into the peer's (remote_nope / remote_rope: the peer's stage,
    the offsets of :func:`_stage_offsets`), completing on the peer's ready barrier."""
    for g in gl.static_range(4):
        words = gl.convert_layout(_placed_words(rows[g], rows[4 + g]), STORE_LAYOUT)
        k_words.slice(g * GROUP // 2, GROUP // 2, dim=1).store(words)
        _remote_store(words, remote_nope + g * 2 * 8192 + nope_offsets, remote_ready)
    k_rope.store(_rope_values(rows[8]))
    _remote_store(rows[8], remote_rope + rope_offsets, remote_ready)


@gluon.jit
def _cluster_sync(anchor):
    """Every thread of the cluster here (``anchor``: any int32 scalar, the asm's operand)."""
    gl.inline_asm_elementwise(
        CLUSTER_SYNC_ASM, "=r,r", [anchor], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _signal(words, barrier):
    """4 bytes a thread into the peer's ``words`` (128 of them), completing as many on its
    ``barrier``."""
    addresses = words + gl.arange(0, 128, layout=SIGNAL_LAYOUT) * 4
    gl.inline_asm_elementwise(
        SIGNAL_ASM, "=r,r,r", [addresses, gl.zeros_like(addresses) + barrier], dtype=gl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@gluon.jit
def _opaque(x):
    """``x``, hidden from the compiler's loop-invariant hoisting (what depends on it is computed
    where it is used, not kept in registers across the loop)."""
    return gl.inline_asm_elementwise(
        "mov.b32 $0, $1;", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1
    )


@gluon.jit
def _tile_count(lo, hi):
    return gl.maximum(hi - lo + BLOCK_N - 1, 0) // BLOCK_N


@gluon.jit
def _ws_producer(cache_ptr, slot_row, lo, hi, block_size, block_stride, row_stride,
                 k_nope, k_rope, k_ready, k_free, STAGES: gl.constexpr):  # fmt: skip
    """The producer warpgroup: each tile's rows gathered (half a tile ahead, so that a half's
    loads are in flight while the one before it is decoded), decoded into a free ring stage,
    and the stage handed to the consumers. Each half's slots are loaded a half tile before its
    gathers, so the gathers' addresses are in registers when they issue."""
    # each half's slots a half tile before its gathers are issued
    slots = _row_slots(slot_row, lo, hi, HALF, WORDS_WG_LAYOUT)
    slots_second = _row_slots(slot_row, lo + HALF, hi, HALF, WORDS_WG_LAYOUT)
    half = _gather_rows(cache_ptr, slots, block_size, block_stride, row_stride, WORDS_WG_LAYOUT)
    slots = _row_slots(slot_row, lo + BLOCK_N, hi, HALF, WORDS_WG_LAYOUT)
    for t in range(_tile_count(lo, hi)):
        stage = t % STAGES
        start = lo + t * BLOCK_N
        second = _gather_rows(
            cache_ptr, slots_second, block_size, block_stride, row_stride, WORDS_WG_LAYOUT
        )
        slots_second = _row_slots(slot_row, start + BLOCK_N + HALF, hi, HALF, WORDS_WG_LAYOUT)
        mbarrier.wait(k_free.index(stage), (t // STAGES) & 1 ^ 1)
        nope = k_nope.index(stage)
        rope = k_rope.index(stage)
        nope_words = _as_words(nope)
        _store_placed(nope_words.slice(0, HALF, dim=0), rope.slice(0, HALF, dim=0), half)
        half = _gather_rows(cache_ptr, slots, block_size, block_stride, row_stride, WORDS_WG_LAYOUT)
        slots = _row_slots(slot_row, start + 2 * BLOCK_N, hi, HALF, WORDS_WG_LAYOUT)
        _store_placed(nope_words.slice(HALF, HALF, dim=0), rope.slice(HALF, HALF, dim=0), second)
        fence_async_shared()  # this warpgroup's stores before the MMAs' async-proxy reads
        _cta_barrier()  # every warp's, before the one arrival
        mbarrier.arrive(k_ready.index(stage))


@gluon.jit
def _ws_producer_crossover(cache_ptr, slot_row, lo, hi, block_size, block_stride, row_stride,
                           k_nope, k_rope, k_ready, k_free, peer_free, rank, smem, nope_offset,
                           rope_offset, ready_offset, peer_free_offset, signal_offset,
                           STAGES: gl.constexpr):  # fmt: skip
    """The producer warpgroup of a crossover pair: this CTA's half of each tile gathered a tile
    ahead, decoded and stored into this CTA's stage and, from the same registers, into the
    peer's. A stage is written once this CTA's consumers are done with it (k_free) and the
    peer's producer says the peer's are (peer_free: each producer signals the other's once its
    own consumers are done); it is ready once this half is stored and the peer's bytes
    have arrived (k_ready, a transaction barrier)."""
    _cluster_sync(rank)
    peer = 1 - rank
    remote_nope = _remote_address(smem + nope_offset, peer)
    remote_rope = _remote_address(smem + rope_offset, peer)
    remote_ready = _remote_address(smem + ready_offset, peer)
    remote_free = _remote_address(smem + peer_free_offset, peer)
    remote_signal = _remote_address(smem + signal_offset, peer)
    slots = _row_slots(slot_row, lo + rank * HALF, hi, HALF, WORDS_WG_LAYOUT)
    mine = _gather_rows(cache_ptr, slots, block_size, block_stride, row_stride, WORDS_WG_LAYOUT)
    slots = _row_slots(slot_row, lo + BLOCK_N + rank * HALF, hi, HALF, WORDS_WG_LAYOUT)
    for t in range(_tile_count(lo, hi)):
        stage = t % STAGES
        ahead = _gather_rows(
            cache_ptr, slots, block_size, block_stride, row_stride, WORDS_WG_LAYOUT
        )
        slots = _row_slots(slot_row, lo + (t + 2) * BLOCK_N + rank * HALF, hi, HALF,
                           WORDS_WG_LAYOUT)  # fmt: skip
        mbarrier.wait(k_free.index(stage), (t // STAGES) & 1 ^ 1)
        _signal(remote_signal + stage * SIGNAL_BYTES, remote_free + stage * 8)  # free for the peer
        mbarrier.expect(peer_free.index(stage), SIGNAL_BYTES)  # and the peer's stage for this CTA
        mbarrier.wait(peer_free.index(stage), (t // STAGES) & 1)
        nope_words = _as_words(k_nope.index(stage))
        rope = k_rope.index(stage)
        # the offsets computed here, each tile (held across the loop, their 24 registers spill)
        nope_offsets = _stage_offsets(_opaque(rank), GROUP // 2, STORE_LAYOUT)
        rope_offsets = _stage_offsets(_opaque(rank), ROPE // 2, WORDS_WG_LAYOUT)
        nope_at = remote_nope + stage * NOPE_STAGE_BYTES
        rope_at = remote_rope + stage * ROPE_STAGE_BYTES
        ready_at = remote_ready + stage * 8
        if rank == 0:
            _store_placed_crossed(
                nope_words.slice(0, HALF, dim=0), rope.slice(0, HALF, dim=0), mine, nope_at,
                rope_at, ready_at, nope_offsets, rope_offsets,
            )  # fmt: skip
        else:
            _store_placed_crossed(
                nope_words.slice(HALF, HALF, dim=0), rope.slice(HALF, HALF, dim=0), mine,
                nope_at, rope_at, ready_at, nope_offsets, rope_offsets,
            )  # fmt: skip
        mine = ahead
        fence_async_shared()  # this warpgroup's stores before the MMAs' reads
        _cta_barrier()
        mbarrier.expect(k_ready.index(stage), HALF_TILE_BYTES)  # the arrival, and the bytes
    _cluster_sync(rank)


@gluon.jit
def _ws_producer_any(cache_ptr, slot_row, lo, hi, block_size, block_stride, row_stride, k_nope,
                     k_rope, k_ready, k_free, peer_free, rank, smem, nope_offset, rope_offset,
                     ready_offset, peer_free_offset, signal_offset, STAGES: gl.constexpr,
                     CROSSOVER: gl.constexpr):  # fmt: skip
    """The producer partition: :func:`_ws_producer_crossover` or :func:`_ws_producer`."""
    if CROSSOVER:
        _ws_producer_crossover(
            cache_ptr, slot_row, lo, hi, block_size, block_stride, row_stride, k_nope, k_rope,
            k_ready, k_free, peer_free, rank, smem, nope_offset, rope_offset, ready_offset,
            peer_free_offset, signal_offset, STAGES,
        )  # fmt: skip
    else:
        _ws_producer(
            cache_ptr, slot_row, lo, hi, block_size, block_stride, row_stride, k_nope, k_rope,
            k_ready, k_free, STAGES,
        )  # fmt: skip


@gluon.jit
def _store_half(part_out_ptr, part, hb, H, o, inv, FIRST: gl.constexpr):
    """Output columns FIRST .. FIRST+255 of heads hb*64 ..: ``o`` times ``inv`` a head."""
    layout: gl.constexpr = gl.SliceLayout(1, O_WG_LAYOUT)
    heads = hb * HEADS + gl.arange(0, HEADS, layout=layout)
    cols = FIRST + gl.arange(0, NOPE // 2, layout=gl.SliceLayout(0, O_WG_LAYOUT))
    rows = part_out_ptr + gl.expand_dims((part * H + heads) * NOPE, 1)
    out = o * gl.expand_dims(inv, 1)
    gl.store(
        rows + gl.expand_dims(cols, 0),
        out.to(part_out_ptr.dtype.element_ty),
        mask=gl.expand_dims(heads < H, 1),
    )


@gluon.jit
def _ws_softmax(q_nope, q_rope, k_nope, k_rope, p_smem, alpha_smem, inv_smem,
                k_ready, k_free, p_ready, p_free, done, slot_row, lo, hi, scale_log2,
                sink_ptr, part_out_ptr, part_lse_ptr, part, hb, H,
                HAS_SINK: gl.constexpr, STAGES: gl.constexpr, CROSSOVER: gl.constexpr):  # fmt: skip
    """The softmax warpgroup: S = Q K^T over the whole tile, the online softmax, P and the
    rescale handed to the PV warpgroup, O += P V over output columns 0 .. 255; at the end the
    normalisation (shared with the PV warpgroup) and the LSE."""
    rows_layout: gl.constexpr = gl.SliceLayout(1, S_WG_LAYOUT)
    entries_layout: gl.constexpr = gl.SliceLayout(0, S_WG_LAYOUT)
    out_rows_layout: gl.constexpr = gl.SliceLayout(1, O_WG_LAYOUT)
    if CROSSOVER:
        _cluster_sync(hb)
    m_i = gl.full([HEADS], float("-inf"), gl.float32, rows_layout)
    l_i = gl.zeros([HEADS], gl.float32, rows_layout)
    o = gl.zeros([HEADS, NOPE // 2], gl.float32, O_WG_LAYOUT)
    for t in range(_tile_count(lo, hi)):
        stage = t % STAGES
        mbarrier.wait(k_ready.index(stage), (t // STAGES) & 1)
        if CROSSOVER:
            fence_async_shared()  # the peer's remote stores (generic proxy) before the MMAs
        zero = gl.zeros([HEADS, BLOCK_N], gl.float32, S_WG_LAYOUT)
        pending = warpgroup_mma(
            q_nope, k_nope.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True
        )
        pending = warpgroup_mma(q_rope, k_rope.index(stage).permute((1, 0)), pending, is_async=True)
        j = lo + t * BLOCK_N + gl.arange(0, BLOCK_N, layout=entries_layout)
        valid = gl.load(slot_row + j, mask=j < hi, other=-1) >= 0
        scores = _mma_result(pending)
        p, alpha, m_i, l_i = _online_softmax(scores, valid, scale_log2, m_i, l_i)
        mbarrier.wait(p_free, t & 1 ^ 1)  # the PV warpgroup done with the last tile's P
        p_smem.store(p.to(gl.bfloat16))
        alpha_smem.store(alpha)
        fence_async_shared()
        _cta_barrier()
        mbarrier.arrive(p_ready)
        o = o * gl.expand_dims(gl.convert_layout(alpha, out_rows_layout), 1)
        o = warpgroup_mma(p_smem, k_nope.index(stage).slice(0, NOPE // 2, dim=1), o)
        _cta_barrier()  # every warp's part of the product done reading the stage
        mbarrier.arrive(k_free.index(stage))

    heads, h_mask, inv, lse = _normalisation(l_i, m_i, hb, H, sink_ptr, HAS_SINK, out_rows_layout)
    inv_smem.store(inv)
    _cta_barrier()
    mbarrier.arrive(done)
    gl.store(part_lse_ptr + part * H + heads, lse, mask=h_mask)
    _store_half(part_out_ptr, part, hb, H, o, inv, 0)
    if CROSSOVER:
        _cluster_sync(hb)


@gluon.jit
def _ws_pv(k_nope, p_smem, alpha_smem, inv_smem, k_free, p_ready, p_free, done, lo, hi,
           part_out_ptr, part, hb, H, STAGES: gl.constexpr,
           CROSSOVER: gl.constexpr):  # fmt: skip
    """The PV warpgroup: O += P V over output columns 256 .. 511, P and the rescale from the
    softmax warpgroup."""
    out_rows_layout: gl.constexpr = gl.SliceLayout(1, O_WG_LAYOUT)
    if CROSSOVER:
        _cluster_sync(hb)
    o = gl.zeros([HEADS, NOPE // 2], gl.float32, O_WG_LAYOUT)
    for t in range(_tile_count(lo, hi)):
        stage = t % STAGES
        mbarrier.wait(p_ready, t & 1)
        if CROSSOVER:
            fence_async_shared()
        alpha = alpha_smem.load(out_rows_layout)
        o = o * gl.expand_dims(alpha, 1)
        o = warpgroup_mma(p_smem, k_nope.index(stage).slice(NOPE // 2, NOPE // 2, dim=1), o)
        _cta_barrier()
        mbarrier.arrive(p_free)
        mbarrier.arrive(k_free.index(stage))
    mbarrier.wait(done, 0)
    _store_half(part_out_ptr, part, hb, H, o, inv_smem.load(out_rows_layout), NOPE // 2)
    if CROSSOVER:
        _cluster_sync(hb)


@gluon.jit(
    do_not_specialize=[
        "nope_offset",
        "rope_offset",
        "ready_offset",
        "peer_free_offset",
        "signal_offset",
    ]
)
def _sparse_mla_decode_ws_kernel(
    q_ptr,  # [R, H, 576] bfloat16
    cache_ptr,  # uint8 fp8_ds_mla rows, block stride and row stride below
    slots_ptr,  # [R, k] int32, -1 invalid
    lens_ptr,  # [R] int32 (unused without HAS_LENS)
    sink_ptr,  # [H] float32 (unused without HAS_SINK)
    part_out_ptr,  # [SPLITS, R, H, 512] float32, or the final [R, H, 512] output
    part_lse_ptr,  # [SPLITS, R, H] float32, natural log
    k,
    H,
    chunk,  # entries per split, a multiple of 64
    block_size,
    cache_block_stride,
    cache_row_stride,
    scale_log2,  # softmax_scale * log2(e)
    nope_offset,  # with CROSSOVER, the offsets in shared memory of k_nope, k_rope, k_ready,
    rope_offset,  # peer_free and signal (_crossover_offsets); else unused
    ready_offset,
    peer_free_offset,
    signal_offset,
    HAS_LENS: gl.constexpr,
    HAS_SINK: gl.constexpr,
    STAGES: gl.constexpr,  # ring stages, 1 or 2
    CROSSOVER: gl.constexpr,  # a 128-head row's two CTAs one cluster (launched as one)
):
    """A program (row, 64 heads, split) by three warpgroups: a producer gathering and decoding
    tiles into the ring, a softmax warpgroup (QK, softmax, PV over the first 256 output
    columns) and a PV warpgroup (the other 256), handing stages and P over by mbarriers, as
    FlashMLA's sm_90 kernel does."""
    gl.static_assert(gl.num_warps() == 4, "the default partition is one warpgroup")
    if CROSSOVER:  # the CTAs of a cluster are consecutive: rank = the head block
        r = (gl.program_id(0) // 2).to(gl.int64)
        hb = gl.program_id(0) % 2
        rows = gl.num_programs(0) // 2
    else:
        r = gl.program_id(0).to(gl.int64)
        hb = gl.program_id(1)
        rows = gl.num_programs(0)
    split = gl.program_id(2)
    lo, hi, slot_row = _span(r, split, slots_ptr, lens_ptr, k, chunk, HAS_LENS)
    part = split * rows + r

    heads = hb * HEADS + gl.arange(0, HEADS, layout=gl.SliceLayout(1, Q_WG_LAYOUT))
    q_rows = q_ptr + (r * H + gl.expand_dims(heads, 1).to(gl.int64)) * (NOPE + ROPE)
    live = gl.expand_dims(heads < H, 1)
    # In four column chunks: the whole [64, 512] at one warpgroup would hold 128 registers a
    # thread.
    q_nope = gl.allocate_shared_memory(gl.bfloat16, [HEADS, NOPE], BF16_OPERAND_SMEM)
    for c in gl.static_range(NOPE // GROUP):
        cols = c * GROUP + gl.arange(0, GROUP, layout=gl.SliceLayout(0, Q_WG_LAYOUT))
        chunk_q = gl.load(q_rows + gl.expand_dims(cols, 0), mask=live, other=0.0)
        q_nope.slice(c * GROUP, GROUP, dim=1).store(chunk_q)
    rope_cols = gl.arange(0, ROPE, layout=gl.SliceLayout(0, Q_WG_LAYOUT))
    rope_q = gl.load(q_rows + NOPE + gl.expand_dims(rope_cols, 0), mask=live, other=0.0)
    q_rope = gl.allocate_shared_memory(gl.bfloat16, [HEADS, ROPE], BF16_OPERAND_SMEM, rope_q)

    k_nope = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, NOPE], BF16_OPERAND_SMEM)
    k_rope = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, ROPE], BF16_OPERAND_SMEM)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [HEADS, BLOCK_N], BF16_OPERAND_SMEM)
    alpha_smem = gl.allocate_shared_memory(gl.float32, [HEADS], ROW_SMEM)
    inv_smem = gl.allocate_shared_memory(gl.float32, [HEADS], ROW_SMEM)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    peer_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    # where the peer's signals land (found by _crossover_offsets)
    signal = gl.allocate_shared_memory(gl.int32, [STAGES, 128], SIGNAL_SMEM)
    p_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    p_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_free.index(s), count=2)  # both consumer warpgroups
        mbarrier.init(peer_free.index(s), count=1)  # the producer's, and the peer's signal
    mbarrier.init(p_ready, count=1)
    mbarrier.init(p_free, count=1)
    mbarrier.init(done, count=1)
    fence_async_shared()  # the queries' stores before the MMA's reads
    _cta_barrier()  # and every thread's, before any warp's MMA

    if CROSSOVER:
        zeros_layout: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 4], [1, 0])
        signal.store(gl.zeros([STAGES, 128], gl.int32, zeros_layout))  # and the buffer kept
        smem = gl.inline_asm_elementwise(
            SMEM_BASE_ASM, "=r,r", [hb], dtype=gl.int32, is_pure=True, pack=1
        )
        gl.inline_asm_elementwise(
            "fence.mbarrier_init.release.cluster; mov.u32 $0, 0;", "=r,r", [hb],
            dtype=gl.int32, is_pure=False, pack=1,
        )  # fmt: skip
    else:
        smem = 0
    gl.warp_specialize(
        [
            (
                _ws_softmax,
                (q_nope, q_rope, k_nope, k_rope, p_smem, alpha_smem, inv_smem, k_ready, k_free,
                 p_ready, p_free, done, slot_row, lo, hi, scale_log2, sink_ptr, part_out_ptr,
                 part_lse_ptr, part, hb, H, HAS_SINK, STAGES, CROSSOVER),
            ),
            (
                _ws_pv,
                (k_nope, p_smem, alpha_smem, inv_smem, k_free, p_ready, p_free, done, lo, hi,
                 part_out_ptr, part, hb, H, STAGES, CROSSOVER),
            ),
            (
                _ws_producer_any,
                (cache_ptr, slot_row, lo, hi, block_size, cache_block_stride, cache_row_stride,
                 k_nope, k_rope, k_ready, k_free, peer_free, hb, smem, nope_offset, rope_offset,
                 ready_offset, peer_free_offset, signal_offset, STAGES, CROSSOVER),
            ),
        ],
        [4, 4],
        [PV_REGS, PRODUCER_REGS],
    )  # fmt: skip


def shape_reasons(q: torch.Tensor, cache: torch.Tensor, fmt: str) -> list[str]:
    """Why this kernel does not take a call (empty: it does), in words for the adapter."""
    reasons = []
    if fmt != "fp8_ds_mla":
        reasons.append(f"it reads fp8_ds_mla rows, got {fmt!r}")
    if q.dtype != torch.bfloat16 or q.dim() != 4 or q.shape[-1] != 576:
        reasons.append(f"it takes bf16 queries [B, s, H, 576], got {q.dtype} {tuple(q.shape)}")
    if cache.dim() != 3 or cache.shape[2] != ROW_BYTES:
        reasons.append(f"it needs a [blocks, block_size, {ROW_BYTES}] cache")
    elif cache.stride(2) != 1 or cache.stride(1) % 16 or cache.stride(0) % 16:
        reasons.append("its rows must be contiguous and 16-byte aligned")
    return reasons


def default_splits(rows: int, head_blocks: int, k: int, multiprocessors: int) -> int:
    """Parts of the top-k list a row's program is cut into: one program an SM at most, at
    least 2 tiles a part (on an H100 at B=1, 128 heads, top-2048: 16 parts 18.6 us, 32 parts
    19.2, 8 parts 22.6, 4 parts 33.4)."""
    programs = max(rows * head_blocks, 1)
    return max(1, min(triton.cdiv(k, 2 * 64), multiprocessors // programs))


_CROSSOVER_BUFFERS = ("k_nope", "k_rope", "k_ready", "peer_free", "signal")


def _crossover_offsets(compiled) -> tuple[int, ...]:
    """Where the compiler put k_nope, k_rope, k_ready, peer_free and signal in shared memory:
    the passes of the backend's make_llir up to its shared-memory allocation, run again over
    the kernel's TTGIR (the same input, so the same offsets), and the allocation's offsets read
    back. The crossover's PTX addresses the peer's copies of these buffers by them."""
    import re
    import tempfile

    from triton._C.libtriton import ir, nvidia, passes
    from triton.backends.nvidia.compiler import get_ptx_version_from_options

    context = ir.context()
    ir.load_dialects(context)
    nvidia.load_dialects(context)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir") as source:
        source.write(compiled.asm["ttgir"])
        source.flush()
        module = ir.parse_mlir_module(source.name, context)
    module.context = context
    arch = compiled.metadata.target.arch
    manager = ir.pass_manager(context)
    passes.ttgpuir.add_combine_tensor_select_and_if(manager)
    passes.ttgpuir.add_allocate_warp_groups(manager)
    passes.convert.add_scf_to_cf(manager)
    passes.gluon.add_inliner(manager)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(
        manager, arch, get_ptx_version_from_options(compiled.metadata, arch)
    )
    manager.run(module, "crossover_offsets")
    text = str(module)
    offsets = []
    for name in _CROSSOVER_BUFFERS:
        found = re.findall(rf"%{name} = ttg\.local_alloc[^\n]*allocation\.offset = (\d+)", text)
        if len(found) != 1:
            raise RuntimeError(f"sparse_mla.decode (gluon): no single offset for {name} ({found})")
        offsets.append(int(found[0]))
    return tuple(offsets)


def _crossover_launch(grid, args, constexprs) -> None:
    """Launch the crossover kernel as clusters of two CTAs, one cluster a 128-head row: Gluon
    3.6 builds it for one CTA (its layouts know no clusters), so the compiled kernel's launch
    metadata is given two CTAs a cluster (the launcher then starts twice grid[0] CTAs, in
    clusters of two), and the buffers' offsets are found once a compiled kernel."""
    kernel = _sparse_mla_decode_ws_kernel
    compiled = kernel.warmup(*args, 0, 0, 0, 0, 0, grid=grid, CROSSOVER=True, **constexprs)
    offsets = getattr(compiled, "_hwrun_crossover_offsets", None)
    if offsets is None:
        warps, ctas, shared = compiled.packed_metadata
        if ctas != 1:
            raise RuntimeError(f"sparse_mla.decode (gluon): built for {ctas} CTAs, not one")
        offsets = _crossover_offsets(compiled)
        compiled.packed_metadata = (warps, 2, shared)
        compiled._hwrun_crossover_offsets = offsets
    kernel[grid](*args, *offsets, CROSSOVER=True, **constexprs)


def decode(
    q: torch.Tensor,  # [B, s, H, 576] bfloat16
    cache: torch.Tensor,  # [num_blocks, block_size, 656] uint8, fp8_ds_mla rows
    slots: torch.Tensor,  # [B, s, k] int32, -1 invalid
    softmax_scale: float,
    topk_length: torch.Tensor | None = None,  # [B, s] int32
    attn_sink: torch.Tensor | None = None,  # [H] float32
    splits: int | None = None,
    stages: int = 2,
    crossover: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # out [B, s, H, 512] bf16, lse [B, s, H] fp32
    """``sparse_mla.decode`` over fp8_ds_mla rows (see :func:`shape_reasons`); ``splits``:
    parts of the top-k list (default :func:`default_splits`), ``stages``: 2 or 1 ring stages;
    ``crossover``: a 128-head row's two programs as one cluster, each decoding half of every
    tile for both."""
    problems = shape_reasons(q, cache, "fp8_ds_mla")
    if problems:
        raise ValueError("sparse_mla.decode (gluon): " + "; ".join(problems))
    B, S, H, _ = q.shape
    rows = B * S
    k = slots.shape[-1]
    if slots.shape != (B, S, k) or k < 1:
        raise ValueError(f"sparse_mla.decode (gluon): slots must be [B={B}, s={S}, k >= 1]")
    if stages not in (1, 2):
        raise ValueError(f"sparse_mla.decode (gluon): stages must be 1 or 2, got {stages}")
    head_blocks = triton.cdiv(H, 64)
    if crossover and H != 128:
        raise ValueError(f"sparse_mla.decode (gluon): the crossover pairs 128 heads, got {H}")
    if splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count
        splits = default_splits(rows, head_blocks, k, sms)
    chunk = triton.cdiv(triton.cdiv(k, splits), 64) * 64
    splits = triton.cdiv(k, chunk)
    direct = splits == 1  # one part: the kernel writes the final output, sink applied
    part_out = torch.empty(
        (splits, rows, H, 512), dtype=q.dtype if direct else torch.float32, device=q.device
    )
    part_lse = torch.empty((splits, rows, H), dtype=torch.float32, device=q.device)
    if rows == 0:
        return part_out[0].reshape(B, S, H, 512), part_lse[0].reshape(B, S, H)
    lens = part_lse if topk_length is None else topk_length.reshape(rows).to(torch.int32)
    args = (
        q.reshape(rows, H, 576).contiguous(),
        cache,
        slots.reshape(rows, k).to(torch.int32).contiguous(),
        lens.contiguous(),
        attn_sink.float().contiguous() if attn_sink is not None else part_lse,
        part_out,
        part_lse,
        k,
        H,
        chunk,
        cache.shape[1],
        cache.stride(0),
        cache.stride(1),
        float(softmax_scale) * _LOG2E,
    )
    constexprs = dict(
        HAS_LENS=topk_length is not None,
        HAS_SINK=direct and attn_sink is not None,
        STAGES=stages,
        num_warps=4,
    )
    if crossover:
        _crossover_launch((rows, 1, splits), args, constexprs)
    else:
        _sparse_mla_decode_ws_kernel[(rows, head_blocks, splits)](
            *args, 0, 0, 0, 0, 0, CROSSOVER=False, **constexprs
        )
    if direct:
        out, lse = part_out[0], part_lse[0]
    else:
        out, lse = combine_parts(part_out, part_lse, attn_sink, q.dtype)
    return out.reshape(B, S, H, 512), lse.reshape(B, S, H)
