"""Scoring one tile of packed index keys against the query heads (shared by paged and ragged).

Both index-key formats are read as stored, never widened in memory: an fp8 key is one
[BLOCK_N, 128] e4m3 tile and its fp32 scale; an mxfp4 key (68 B instead of 132) is four groups
of 16 packed bytes, each unpacked in registers to 32 e2m1 values, which are exact in e4m3 (and
in bf16), so each group is one matrix product of K=32 whose result is scaled by that group's
power of two. With fp8 queries the products run on the fp8 tensor cores; other query dtypes
are rounded to bf16 (keys convert exactly) and use the bf16 ones. Accumulation is fp32.
Triton's CPU interpreter multiplies bf16 tiles wrongly (NumPy has no bf16), so under
TRITON_INTERPRET=1 the non-fp8 path computes in fp32 instead (``WIDE`` below).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hwrun import knobs

FMT_FP8 = 0
FMT_MXFP4 = 1


@triton.jit
def _e2m1_as_e4m3_bits(code):
    # E2M1 magnitude m (3 bits) -> E4M3 bits: 0 -> 0, 0.5 -> 0x30, and for m >= 2 the exponent
    # (m >> 1) + 6 with mantissa bit (m & 1) << 2, which is m * 4 + 48. The sign moves to bit 7.
    mag = code & 7
    bits = tl.where(mag >= 2, mag * 4 + 48, tl.where(mag == 1, 0x30, 0))
    return (bits | ((code & 8) << 4)).to(tl.uint8)


@triton.jit
def load_query_fp8_keys(
    q_ptr, m_offs, m_mask, D: tl.constexpr, Q_FP8: tl.constexpr, WIDE: tl.constexpr
):
    """Queries as the [128, M] right-hand operand for fp8 keys."""
    d = tl.arange(0, D)
    qt = tl.load(q_ptr + m_offs[None, :] * D + d[:, None], mask=m_mask[None, :], other=0.0)
    if not Q_FP8:
        qt = qt.to(WIDE)
    return qt


@triton.jit
def load_query_group(
    q_ptr, m_offs, m_mask, g: tl.constexpr, D: tl.constexpr, Q_FP8: tl.constexpr, WIDE: tl.constexpr
):
    """Queries of one 32-wide mxfp4 group as a [32, M] right-hand operand."""
    d = g * 32 + tl.arange(0, 32)
    qt = tl.load(q_ptr + m_offs[None, :] * D + d[:, None], mask=m_mask[None, :], other=0.0)
    if not Q_FP8:
        qt = qt.to(WIDE)
    return qt


@triton.jit
def fp8_key_scores(elem_rows, scale_rows, n_mask, qt, Q_FP8: tl.constexpr, WIDE: tl.constexpr):
    """[BLOCK_N, M] fp32 = k_scale * (k . q) for fp8 keys.

    ``elem_rows``: [BLOCK_N] pointers to each key's 128 e4m3 bytes; ``scale_rows``: [BLOCK_N]
    pointers to its fp32 scale.
    """
    scale = tl.load(scale_rows.to(tl.pointer_type(tl.float32)), mask=n_mask, other=0.0)
    return fp8_key_products(elem_rows, n_mask, qt, Q_FP8, WIDE) * scale[:, None]


@triton.jit
def fp8_key_products(elem_rows, n_mask, qt, Q_FP8: tl.constexpr, WIDE: tl.constexpr):
    """[BLOCK_N, M] fp32 = k . q for fp8 keys, before their scales (fp8_key_scores)."""
    d = tl.arange(0, 128)
    # Loaded as e4m3 (not bytes bitcast after the load), so that on Hopper the pipelined copy
    # feeds the MMA from shared memory, with no ldmatrix into registers a tile.
    fp8_rows = elem_rows.to(tl.pointer_type(tl.float8e4nv))
    keys = tl.load(fp8_rows[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
    if not Q_FP8:
        keys = keys.to(WIDE)
    return tl.dot(keys, qt)


def _use_ptx_unpack() -> bool:
    import torch

    interpreting = knobs.triton_interpret()
    return not interpreting and torch.version.cuda is not None and torch.version.hip is None


# On NVIDIA, 4 packed bytes become 8 e4m3 bytes in ~20 instructions: byte permutes (prmt)
# against a 16-byte table of the e4m3 codes of the eight e2m1 magnitudes, sign bits moved by
# a shift and a mask. The arithmetic version (_e2m1_as_e4m3_bits) costs ~6x more issue slots,
# which made the mxfp4 kernel instruction-bound (ncu: 72% SM busy, 10% DRAM) on the H200.
UNPACK_PTX = tl.constexpr(_use_ptx_unpack())
# $2: 4 packed bytes; $0 / $1: the e4m3 codes of their low / high nibbles; la, lb: the table.
_UNPACK_BODY = """
and.b32 t, $2, 0x07070707;
shr.b32 s, t, 4;
or.b32 s, s, t;
and.b32 sel, s, 0xFF;
shr.b32 s, s, 8;
and.b32 s, s, 0xFF00;
or.b32 sel, sel, s;
prmt.b32 m, la, lb, sel;
shl.b32 g, $2, 4;
and.b32 g, g, 0x80808080;
or.b32 $0, m, g;
shr.b32 t, $2, 4;
and.b32 t, t, 0x07070707;
shr.b32 s, t, 4;
or.b32 s, s, t;
and.b32 sel, s, 0xFF;
shr.b32 s, s, 8;
and.b32 s, s, 0xFF00;
or.b32 sel, sel, s;
prmt.b32 m, la, lb, sel;
and.b32 g, $2, 0x80808080;
or.b32 $1, m, g;
}
"""
_UNPACK_ASM = tl.constexpr(
    """
{
.reg .b32 t, s, sel, m, g, la, lb;
mov.b32 la, 0x3C383000;
mov.b32 lb, 0x4C484440;"""
    + _UNPACK_BODY
)
# The same with every nonzero code of the table lowered by $3 (4 equal bytes: a group's shift
# times 8, the exponent field's place): no borrow crosses a byte, the smallest nonzero code
# (0x30) minus at most MAX_FOLD * 8 staying positive.
_UNPACK_LOWERED_ASM = tl.constexpr(
    """
{
.reg .b32 t, s, sel, m, g, la, lb, z;
and.b32 z, $3, 0xFFFFFF00;
mov.b32 la, 0x3C383000;
sub.u32 la, la, z;
mov.b32 lb, 0x4C484440;
sub.u32 lb, lb, $3;"""
    + _UNPACK_BODY
)


@triton.jit
def _mxfp4_group(elem_rows, n_mask, g: tl.constexpr, Q_FP8: tl.constexpr, WIDE: tl.constexpr):
    b = g * 16 + tl.arange(0, 16)
    packed = tl.load(elem_rows[:, None] + b[None, :], mask=n_mask[:, None], other=0)
    if UNPACK_PTX:
        lo, hi = tl.inline_asm_elementwise(
            _UNPACK_ASM,
            "=r,=r,r",
            [packed],
            dtype=(tl.uint8, tl.uint8),
            is_pure=True,
            pack=4,
        )
    else:
        lo = _e2m1_as_e4m3_bits(packed & 15)  # element 2i
        hi = _e2m1_as_e4m3_bits(packed >> 4)  # element 2i + 1
    pairs = tl.join(lo, hi)  # [BLOCK_N, 16, 2]: natural element order once flattened
    keys = tl.reshape(pairs, (pairs.shape[0], 32)).to(tl.float8e4nv, bitcast=True)
    if not Q_FP8:
        keys = keys.to(WIDE)
    return keys


@triton.jit
def mxfp4_key_scores(
    elem_rows, scale_rows, n_mask, q0, q1, q2, q3, Q_FP8: tl.constexpr, WIDE: tl.constexpr
):
    """[BLOCK_N, M] fp32 = sum_g 2^(e_g - 127) * (k_g . q_g) for mxfp4 keys.

    ``elem_rows``: [BLOCK_N] pointers to each key's 64 packed bytes; ``scale_rows``: [BLOCK_N]
    pointers to its 4 E8M0 codes; ``q0..q3``: the [32, M] query groups.
    """
    codes = tl.load(scale_rows[:, None] + tl.arange(0, 4)[None, :], mask=n_mask[:, None], other=0)
    # E8M0 code c is 2^(c - 127), NaN for 0xFF (kept: a NaN scale poisons that key's score).
    scales = tl.where(codes == 255, float("nan"), tl.exp2(codes.to(tl.float32) - 127.0))
    s0, s1, s2, s3 = _split4(scales)
    acc = tl.dot(_mxfp4_group(elem_rows, n_mask, 0, Q_FP8, WIDE), q0) * s0[:, None]
    acc += tl.dot(_mxfp4_group(elem_rows, n_mask, 1, Q_FP8, WIDE), q1) * s1[:, None]
    acc += tl.dot(_mxfp4_group(elem_rows, n_mask, 2, Q_FP8, WIDE), q2) * s2[:, None]
    acc += tl.dot(_mxfp4_group(elem_rows, n_mask, 3, Q_FP8, WIDE), q3) * s3[:, None]
    return acc


# Largest difference between a key's group exponents that folding keeps exact: the smallest
# nonzero e2m1 magnitude (0.5, e4m3 exponent field 6) lowered by d stays a normal e4m3 value
# (field >= 1) for d <= 5, and every e2m1 value times 2^-d is then an e4m3 value.
MAX_FOLD = tl.constexpr(5)


@triton.jit
def mxfp4_key_scores_folded(
    elem_rows, scale_rows, n_mask, qt, q0, q1, q2, q3, Q_FP8: tl.constexpr, WIDE: tl.constexpr
):
    """:func:`mxfp4_key_scores` as one K=128 product where that is exact: each group's power of
    two relative to the key's largest, 2^-d, is folded into its e4m3 codes (the exponent field
    lowered by d), the product runs over all 128 elements against ``qt`` ([128, M]), and the
    key's largest power of two scales the result once. A tile holding a key whose group
    exponents differ by more than MAX_FOLD takes the four products of ``q0..q3`` instead."""
    codes = tl.load(scale_rows[:, None] + tl.arange(0, 4)[None, :], mask=n_mask[:, None], other=0)
    codes = codes.to(tl.int32)
    top = tl.max(codes, axis=1)  # [BLOCK_N]
    shift = top[:, None] - codes  # [BLOCK_N, 4], each >= 0
    if tl.max(tl.max(shift, axis=1), axis=0) <= MAX_FOLD:
        keys = _mxfp4_folded(elem_rows, n_mask, shift, Q_FP8, WIDE)
        # One NaN code makes the key's top 255 (NaN) or its spread too wide (the four products
        # then keep the NaN): either way a NaN scale poisons the key's score, as unfolded.
        scale = tl.where(top == 255, float("nan"), tl.exp2(top.to(tl.float32) - 127.0))
        acc = tl.dot(keys, qt) * scale[:, None]
    else:
        acc = mxfp4_key_scores(elem_rows, scale_rows, n_mask, q0, q1, q2, q3, Q_FP8, WIDE)
    return acc


@triton.jit
def _mxfp4_folded(elem_rows, n_mask, shift, Q_FP8: tl.constexpr, WIDE: tl.constexpr):
    """A key tile's 128 elements as e4m3 codes, group g's lowered by ``shift[:, g]`` (exponent
    field minus shift; zero stays zero): [BLOCK_N, 128] in natural element order."""
    rows: tl.constexpr = shift.shape[0]
    b = tl.arange(0, 64)
    packed = tl.load(elem_rows[:, None] + b[None, :], mask=n_mask[:, None], other=0)
    # shift * 8 (the exponent field's place) for each packed byte: byte b is in group b // 16
    lowered = tl.reshape(tl.broadcast_to((shift * 8)[:, :, None], (rows, 4, 16)), (rows, 64))
    lowered = lowered.to(tl.uint8)
    if UNPACK_PTX:
        lo, hi = tl.inline_asm_elementwise(
            _UNPACK_LOWERED_ASM,
            "=r,=r,r,r",
            [packed, lowered],
            dtype=(tl.uint8, tl.uint8),
            is_pure=True,
            pack=4,
        )
    else:
        lo = _lowered(_e2m1_as_e4m3_bits(packed & 15), lowered)  # element 2i
        hi = _lowered(_e2m1_as_e4m3_bits(packed >> 4), lowered)  # element 2i + 1
    pairs = tl.join(lo, hi)  # [BLOCK_N, 64, 2]: natural element order once flattened
    keys = tl.reshape(pairs, (rows, 128)).to(tl.float8e4nv, bitcast=True)
    if not Q_FP8:
        keys = keys.to(WIDE)
    return keys


@triton.jit
def _lowered(bits, lowered):
    return tl.where((bits & 0x7F) != 0, bits - lowered, bits)


@triton.jit
def _split4(x):
    # [BLOCK_N, 4] -> four [BLOCK_N] columns.
    a, b = tl.split(tl.reshape(x, (x.shape[0], 2, 2)))
    s0, s1 = tl.split(a)
    s2, s3 = tl.split(b)
    return s0, s2, s1, s3


@triton.jit
def relu(x):
    """max(x, 0) keeping NaN, as torch's relu (a NaN key or scale code poisons its score, as in
    the reference); tl.maximum's default returns the other operand."""
    return tl.maximum(x, 0.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def weighted_relu_sum(scores, w, NEXT_N: tl.constexpr, HP: tl.constexpr):
    """[BLOCK_N, NEXT_N * HP] scores, [NEXT_N * HP] weights -> [BLOCK_N, NEXT_N] logits."""
    s = relu(scores) * w[None, :]
    return tl.sum(tl.reshape(s, (s.shape[0], NEXT_N, HP)), axis=2)


def wide_dtype():
    """The dtype non-fp8 queries and keys are multiplied in: bf16, fp32 in the interpreter."""
    return tl.float32 if knobs.triton_interpret() else tl.bfloat16


def padded_heads(num_heads: int) -> int:
    """Heads padded to a power of two of at least 16 (the matrix units' smallest N)."""
    return max(16, triton.next_power_of_2(num_heads))
