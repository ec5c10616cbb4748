"""moe.experts: a fused MoE over tokens grouped by expert, bf16, fp8 block-128 and W4A16 weights.

Four launches, none of which needs a device value on the host (no ``.item()``, ``.tolist()``
or ``torch.unique``), so a decode step that calls it can be captured in a CUDA graph:

1. ``_align_kernel`` (in ``moe_align.py``): the ``N = T * k`` slots grouped by expert id,
   each expert's run padded to a multiple of ``BLOCK_M`` rows, and the expert of every row
   block. The number of blocks is bounded by the shapes alone (each nonempty run wastes at most
   ``BLOCK_M - 1`` rows); blocks past the last run exit at once. The shared experts are one
   more group, E, holding one slot per token (slot ``N + t``), so they ride in the same
   launches as the routed ones.
2. ``_gate_up_kernel`` (this and the next two live in ``moe_kernels.py``): per (row block,
   I tile), ``x @ W13_e^T`` for the gate and the up rows together, then ``silu(gate) * up``
   rounded to bf16 (the contract's activation rounding).
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

f16 products (``TileConfig.f16_products``, the decode tiles' default on GPUs): with e4m3 weights
the codes meet f16 activations instead of bf16 ones: one conversion for two codes, where bf16
takes about two instructions a code, one of them a quarter-rate conversion (f16_rows.py says
why it is exact). ``x`` goes to f16 with a power-of-two scale per row and 128 columns in one
launch before the GEMMs; the gate/up kernel writes the intermediate, rounded to bf16 first, as
f16 with a scale per row and I tile, which the down kernel reads in K steps of at most that
tile.

Numerics against the reference (``hwrun.ops.moe_experts``): the GEMM inputs are the same bf16
values and the products accumulate in fp32, but in tiles rather than one token at a time, so
the bits differ (the reference is bitwise batch-invariant, this is not: a token's rows share a
tile with whichever tokens chose the same expert). The differences are fp32 summation order,
which can flip a bf16 rounding of the intermediate or of the output by one unit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from hwrun.formats.int4 import INT4_GROUP
from hwrun.kernels.triton.activation_quant import quantize_activations
from hwrun.kernels.triton.descriptors import (
    nvidia_sm90_or_later,
    tma_alignment_problems,
    use_torch_allocator,
)
from hwrun.kernels.triton.f16_rows import F16_WEIGHT_FORMATS, rows_to_f16
from hwrun.kernels.triton.index_key_tiles import wide_dtype
from hwrun.kernels.triton.interpreter import prepare_launch
from hwrun.kernels.triton.linear import multiprocessors
from hwrun.kernels.triton.moe_align import ExpertLayout, align_by_expert
from hwrun.kernels.triton.moe_kernels import _combine_kernel, _down_kernel, _gate_up_kernel
from hwrun.kernels.triton.pdl import pdl_options
from hwrun.kernels.triton.split_counters import zeroed_counters
from hwrun.kernels.triton.weight_tiles import FORMAT_CODES, WEIGHT_FORMATS
from hwrun.ops.quantized_weight import FP8_BLOCK, QuantizedWeight, stack_shared_group  # noqa: F401 (re-exported for the kernel's tests)

ACTIVATION_MODES = ("bf16", "a8w8")  # the reference's modes this kernel computes
A8W8_FORMATS = ("fp8_block128", "fp8_block128_ue8m0")


@dataclass(frozen=True)
class TileConfig:
    """Launch shape of the two GEMM kernels (BLOCK_K must divide 128: one scale tile or int4
    group per step)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    f16_products: bool = False  # e4m3 weights against f16 activations (the module doc)
    # Programs per gate/up tile, each over a run of the K steps (their sums added by the last):
    # at decode the gate/up grid is a wave and a half of long programs on the H200.
    gate_up_splits: int = 1
    # e4m3 codes through tensor descriptors (the module doc): their copies are pipelined over
    # the K loop, where the pointer loads of codes decoded before the product are not.
    tma: bool = False
    # With tma: one descriptor per weight over every group's codes stacked, built on the host
    # and passed to the kernel, not one built by each program (a global write and a fence
    # before its first load). Needs the shared group, if any, stored as group E of the routed
    # experts' tensor (stack_shared_group, as the engine loads them); where it is not, the
    # launch takes pointer loads. The decode default on Hopper (default_tiles).
    host_descriptors: bool = False


# Tuned on the H200 by rows per expert (docs/benchmarks.md): the middle and prefill tiles at
# DeepSeek-V3's expert shapes, the decode tiles at the bench model's too (64 x 4096 x 512, where
# f16 products took 64 tokens from 213 to 151 us). Decode takes the wide tiles (16 x 128) but
# where even they leave most multiprocessors idle (1-2 tokens), then the narrow ones, split.
DECODE_TILES = TileConfig(16, 128, 128, num_warps=4, num_stages=4, f16_products=True)
NARROW_DECODE_TILES = TileConfig(16, 64, 128, num_warps=4, num_stages=4, f16_products=True)
MIDDLE_TILES = TileConfig(32, 64, 128, num_warps=4, num_stages=4)
PREFILL_TILES = TileConfig(64, 128, 64, num_warps=4, num_stages=3)
INTERPRETER_TILES = TileConfig(16, 32, 32, num_warps=4, num_stages=1)
# The decode gate/up kernel's programs resident per multiprocessor by tile width (16 x 64: 3,
# from ncu on the H200, 142 registers a thread at 128 threads; 16 x 128, which holds twice the
# accumulators: 2, the count that the timings in default_tiles fit), the most K splits, and what
# a split costs against the idle share of a last wave (a tie goes to fewer splits).
GATE_UP_RESIDENT = {64: 3, 128: 2}
MAX_GATE_UP_SPLITS = 4
SPLIT_COST = 0.03
# Below this share of a wave the wide tiles' programs are too few to keep the memory busy.
FEW_PROGRAMS = 0.25


def default_tiles(
    num_slots: int,
    num_experts: int,
    on_gpu: bool,
    *,
    tokens: int | None = None,
    inter: int | None = None,
    num_sms: int | None = None,
    descriptors: bool = False,
    a8w8: bool = False,
) -> TileConfig:
    """Row blocks as tall as the experts' typical number of rows (padding rows cost MMA time
    and registers, not memory traffic); at decode, given the tokens, the expert width and the
    device's multiprocessors, the tile width and the gate/up K split by :func:`gate_up_waves`.

    On the H200 (2026-12-03, us per call; DeepSeek-V3: 256 experts of 7168 x 2048, the bench
    model: 64 of 4096 x 512), the wide tiles against the narrow ones' best split:

    ===========  ======  ======  ======  ======  ======  ======
    experts      bench   bench   bench   bench   V3      V3
    tokens       1       8       16      64      8       64
    narrow       30.7    100.5   122.4   147.9   739.5   2911.9
    wide         33.7    97.3    111.1   146.3   644.6   2465.8
    ===========  ======  ======  ======  ======  ======  ======

    The rule misses by at most 5% at the token counts timed (1-64): DeepSeek-V3's 1 token took
    143.4 us unsplit (0.54 waves) and 136.4 split in 4.

    ``descriptors`` (an NVIDIA GPU of sm_90 or later): the decode tiles read the e4m3 codes
    through host descriptors, 3 stages up to 16 tokens and 4 above. H200, 2026-12-04, us,
    pointer loads -> host descriptors: bench model T=1 31.5 -> 31.0, T=8 94.5 -> 89.2, T=16
    108.4 -> 104.5, T=64 145.1 -> 142.9; DeepSeek-V3 T=1 141.4 -> 126.5, T=8 646.0 -> 637.4,
    T=64 2483.4 -> 2471.4 (3 stages 2463.2, 6 stages slower everywhere).
    """
    tiles = _default_tiles(num_slots, num_experts, on_gpu, tokens, inter, num_sms, a8w8)
    decode = tiles.block_m == DECODE_TILES.block_m and tokens is not None
    if descriptors and decode:
        tiles = replace(tiles, tma=True, host_descriptors=True, num_stages=3 if tokens <= 16 else 4)
    if a8w8:
        tiles = a8w8_tiles(tiles)
    if a8w8 and decode and on_gpu:
        # H200, 2026-12-04, us (bench/moe_gpu.py shapes, stages x K splits x warps swept): the
        # bench model at 64 tokens 127.8 at 2 stages unsplit against 152.4 at 4 stages split
        # in 4 (and 136.2 at 3 stages); 8 and 16 tokens 87.0 and 102.6 at 3 stages unsplit;
        # DeepSeek-V3 at 64 tokens 2360.8 at 3 stages against 2409.5 at 4. e4m3 tiles leave
        # the registers free: shared memory (34 KB a gate/up stage) sets the programs
        # resident, and short programs (the bench model's 4096-wide K) want more of them.
        stages = 3 if tokens <= 16 or (inter or 0) > 1024 else 2
        tiles = replace(tiles, num_stages=stages)
    return tiles


def _default_tiles(
    num_slots: int,
    num_experts: int,
    on_gpu: bool,
    tokens: int | None,
    inter: int | None,
    num_sms: int | None,
    a8w8: bool = False,
) -> TileConfig:
    if not on_gpu:
        return INTERPRETER_TILES
    rows_per_expert = num_slots / max(num_experts, 1)
    if rows_per_expert > 8:
        return MIDDLE_TILES if rows_per_expert < 64 else PREFILL_TILES
    if tokens is None or inter is None or num_sms is None:
        return DECODE_TILES
    shape = (tokens, num_slots, num_experts, inter, num_sms)
    waves = gate_up_waves(DECODE_TILES, *shape)
    if waves < FEW_PROGRAMS and a8w8:  # the narrow tiles would cut h's 128-column groups
        return replace(DECODE_TILES, gate_up_splits=gate_up_splits(waves))
    if waves < FEW_PROGRAMS:
        narrow = gate_up_waves(NARROW_DECODE_TILES, *shape)
        return replace(NARROW_DECODE_TILES, gate_up_splits=gate_up_splits(narrow))
    # With less than a wave every program is resident from the start: a split only adds sums
    # (8 and 16 tokens at the bench model: 97.3 and 111.1 us unsplit, 100.5 and 115.1 split).
    # a8w8 at 64 tokens (~1 wave by this count, which is the f16 tiles' residency): unsplit
    # 127.8 us against 136.5 split in 4 (H200, 2026-12-04).
    split = waves >= 1 and not a8w8
    return replace(DECODE_TILES, gate_up_splits=gate_up_splits(waves) if split else 1)


def gate_up_waves(
    tiles: TileConfig, tokens: int, num_slots: int, num_experts: int, inter: int, num_sms: int
) -> float:
    """Waves of the gate/up launch's working programs: the row blocks of the experts the batch
    is expected to touch (uniform routing; blocks of more than ``block_m`` rows counted by the
    slots) plus the shared group's, times the I tiles, over the programs resident at once."""
    touched = num_experts * (1 - (1 - 1 / max(num_experts, 1)) ** num_slots)
    blocks = max(touched, num_slots / tiles.block_m) + triton.cdiv(tokens, tiles.block_m)
    resident = GATE_UP_RESIDENT.get(tiles.block_n, min(GATE_UP_RESIDENT.values()))
    return blocks * triton.cdiv(inter, tiles.block_n) / (resident * num_sms)


def gate_up_splits(waves: float) -> int:
    """K splits that leave the least of the gate/up launch's last wave idle. On the H200 at the
    bench model's experts (2026-12-03): 64 tokens (~1.03 waves of wide tiles) 146.3 us at 4
    splits against 158.4 unsplit; 1 token (~0.17 waves of narrow ones) 30.7-31.4 at 3-4 splits
    against 44.7."""
    if waves >= 2:  # the last wave's idle share is small already; splits there are untimed
        return 1

    def cost(splits: int) -> float:
        return math.ceil(splits * waves) / (splits * waves) + SPLIT_COST * (splits - 1)

    return min(range(1, MAX_GATE_UP_SPLITS + 1), key=cost)


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


def _codes_take_descriptors(
    w13: QuantizedWeight,
    w2: QuantizedWeight,
    shared: tuple[QuantizedWeight, QuantizedWeight] | None,
) -> bool:
    """Every weight of the launch is e4m3 codes a tensor descriptor can read: each expert's
    [rows, cols] matrix 16-byte aligned with a 16-byte row stride (its base is the tensor's
    plus a multiple of the expert stride)."""
    for w in (w13, w2, *(shared or ())):
        if w.format not in ("fp8_block128", "fp8_block128_ue8m0"):
            return False
        three_d = w.data.dim() == 3
        if three_d and w.data.stride(0) % 16:
            return False
        if tma_alignment_problems(w.name, w.data[0] if three_d else w.data):
            return False
    return True


def _stacked_codes(
    routed: QuantizedWeight, extra: QuantizedWeight | None, block_n: int, block_k: int
) -> TensorDescriptor | None:
    """A host tensor descriptor over the routed experts' e4m3 codes [E, rows, cols] as one
    [E * rows, cols] matrix, the shared group (``extra``) included as group E when it is
    stored right after them in the same tensor; None when it is stored elsewhere, or the
    groups are not back to back."""
    data = routed.data
    groups, rows, cols = data.shape
    if data.stride(0) != rows * data.stride(1):
        return None
    if extra is not None:
        if extra.data.data_ptr() != data.data_ptr() + groups * data.stride(0) * data.element_size():
            return None
        groups += 1
    codes = torch.as_strided(
        data.view(torch.float8_e4m3fn), (groups * rows, cols), (data.stride(1), 1)
    )
    return TensorDescriptor(codes, list(codes.shape), list(codes.stride()), [block_n, block_k])


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
    a8w8: bool = False,  # e4m3 activations (the module doc); tiles 128 wide and deep
    xq: tuple[torch.Tensor, torch.Tensor] | None = None,  # a8w8: x's codes, scales (row-major)
) -> torch.Tensor:  # [slots, D] float32, rows of unserved slots unwritten
    hidden = x.shape[1]
    inter = w13.shape[-2] // 2
    rows = layout.sorted_slots.shape[0]
    out = torch.empty(out_rows, hidden, dtype=torch.float32, device=x.device)
    if layout.num_blocks == 0:
        return out
    f16 = (
        not a8w8
        and tiles.f16_products
        and all(w.format in F16_WEIGHT_FORMATS for w in (w13, w2, *(shared or ())))
    )
    h_tiles = triton.cdiv(inter, tiles.block_n)
    ue8m0 = w13.format == "fp8_block128_ue8m0"
    wide = wide_dtype()
    if a8w8:
        x, x_scales = xq
        h = torch.empty(rows, inter, dtype=torch.uint8, device=x.device)
        h_scales = torch.empty(rows, h_tiles, dtype=torch.float32, device=x.device)
        if wide == tl.bfloat16:  # compiled: e4m3 on the matrix units (fp32 in the interpreter)
            wide = tl.float8e4nv
    elif f16:
        x, x_scales = rows_to_f16(x)
        h = torch.empty(rows, inter, dtype=torch.float16, device=x.device)
        h_scales = torch.empty(rows, h_tiles, dtype=torch.float32, device=x.device)
    else:  # the scale pointers are never read
        x_scales = h_scales = torch.empty(1, dtype=torch.float32, device=x.device)
        h = torch.empty(rows, inter, dtype=torch.bfloat16, device=x.device)
    group_e = w13.shape[0] if w13.data.dim() == 3 else 0
    tma = tiles.tma and _codes_take_descriptors(w13, w2, shared)
    # f16: a K step of the down product stays inside one of h's scale tiles
    down_k = min(tiles.block_k, tiles.block_n) if f16 else tiles.block_k
    descriptors = (None, None)
    if tma and tiles.host_descriptors and w13.data.dim() == 3:
        descriptors = (
            _stacked_codes(w13, shared and shared[0], tiles.block_n, tiles.block_k),
            _stacked_codes(w2, shared and shared[1], tiles.block_n, down_k),
        )
        if None in descriptors:
            # Each program's own descriptors lost to the pointer loads in every H200 timing.
            descriptors, tma = (None, None), False
    host = descriptors[0] is not None
    if tma and not host:
        use_torch_allocator()
    common = {
        "HAS_SHARED": shared is not None,
        "WIDE": tl.float16 if f16 else wide,
        "F16": f16,
        "BLOCK_M": tiles.block_m,
        "BLOCK_N": tiles.block_n,
        "num_warps": tiles.num_warps,
        "num_stages": tiles.num_stages,
        "TMA": tma,
        "A8": a8w8,
    }
    splits = max(1, min(tiles.gate_up_splits, triton.cdiv(hidden, tiles.block_k)))
    if splits > 1:
        parts = torch.empty(splits, rows, 2 * inter, dtype=torch.float32, device=x.device)
        counts = zeroed_counters(layout.num_blocks * h_tiles, x.device)
    else:  # never read
        parts, counts = h_scales, h_scales
    data, scales, we, wn, se, sn = _weight_args(w13)
    shared_data, shared_scales = _weight_args(shared[0])[:2] if shared else (data, scales)
    _gate_up_kernel[(layout.num_blocks, h_tiles, splits)](
        x, x_scales, data, scales, shared_data, shared_scales, layout.sorted_slots,
        layout.block_expert, h, h_scales, parts, counts, hidden, inter, layout.routed_slots,
        top_k, group_e, we, wn, se, sn, FORMAT=FORMAT_CODES[w13.format], BLOCK_K=tiles.block_k,
        SPLITS=splits, codes_desc=descriptors[0], HOST_TMA=host, UE8M0=ue8m0, **common,
        **pdl_options(x.device),
    )  # fmt: skip
    data, scales, we, wn, se, sn = _weight_args(w2)
    shared_data, shared_scales = _weight_args(shared[1])[:2] if shared else (data, scales)
    _down_kernel[(layout.num_blocks, triton.cdiv(hidden, tiles.block_n))](
        h, h_scales, data, scales, shared_data, shared_scales, layout.sorted_slots,
        layout.block_expert, route, out, hidden, inter, layout.routed_slots, group_e, we, wn, se,
        sn, FORMAT=FORMAT_CODES[w2.format], BLOCK_K=down_k, H_GROUP=tiles.block_n,
        codes_desc=descriptors[1], HOST_TMA=host, **common, **pdl_options(x.device),
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
    """What this kernel cannot compute, beyond the contract's own checks (on a GPU, a8w8's
    shape rules too: the contract's checks read device values there)."""
    problems = []
    weights = [w13, w2, *(shared or ())]
    if activation_mode not in ACTIVATION_MODES:
        problems.append(
            f"activation_mode {activation_mode!r} has no kernel here; only {list(ACTIVATION_MODES)}"
        )
    elif activation_mode == "a8w8":
        problems += _a8w8_problems(weights, tiles)
    for w in weights:
        if w.format not in WEIGHT_FORMATS:
            problems.append(f"{w.name} is {w.format}; the kernel reads {list(WEIGHT_FORMATS)}")
    if FP8_BLOCK % tiles.block_k and any(w.format != "bf16" for w in weights):
        problems.append(
            f"block_k {tiles.block_k} must divide the fp8 scale tile {FP8_BLOCK} and the int4 "
            f"group {INT4_GROUP}"
        )
    if any(w.device != x.device for w in weights) or ids.device != x.device:
        problems.append("x, ids and every weight must be on one device")
    if problems:
        raise ValueError("moe.experts (triton): " + "; ".join(problems))


def _a8w8_problems(weights: list[QuantizedWeight], tiles: TileConfig) -> list[str]:
    problems = []
    for w in weights:
        if w.format not in A8W8_FORMATS:
            problems.append(f"a8w8 multiplies e4m3 codes: {w.name} is {w.format}")
        elif any(size % FP8_BLOCK for size in w.shape[-2:]):
            problems.append(
                f"a8w8 quantizes groups of {FP8_BLOCK}: {w.name} {list(w.shape)} must have "
                f"both matrix sizes multiples of {FP8_BLOCK}"
            )
    if tiles.block_n != FP8_BLOCK or tiles.block_k != FP8_BLOCK:
        problems.append(
            f"a8w8 tiles must be {FP8_BLOCK} wide and deep (a gate/up tile holds its rows' "
            f"intermediate groups whole, a K step one scale), got block_n {tiles.block_n}, "
            f"block_k {tiles.block_k}"
        )
    return problems


def a8w8_tiles(tiles: TileConfig) -> TileConfig:
    """Default tiles made a8w8's: 128 output columns and 128-deep K steps, no f16 products."""
    return replace(tiles, block_n=FP8_BLOCK, block_k=FP8_BLOCK, f16_products=False)


def experts(
    x: torch.Tensor,  # [T, D] bfloat16 (any float dtype; the output has the same)
    w13: QuantizedWeight,  # [E, 2I, D], rows [0, I) gate, [I, 2I) up
    w2: QuantizedWeight,  # [E, D, I]
    ids: torch.Tensor,  # [T, k] int32/int64, -1 = slot not served here
    weights: torch.Tensor,  # [T, k] float32
    activation_mode: str = "bf16",
    shared_experts: tuple[QuantizedWeight, QuantizedWeight] | None = None,  # [2Is, D], [D, Is]
    quantized: tuple[torch.Tensor, torch.Tensor] | None = None,  # a8w8: x's codes and scales
    tiles: TileConfig | None = None,
) -> torch.Tensor:  # [T, D] x.dtype
    """The contract of ``hwrun.ops.moe_experts.experts`` through the grouped kernels.

    On CPU tensors (the interpreter) every argument is checked as the reference checks it; on
    a GPU only the shapes are (checking id values would synchronise the host), and an id
    outside -1..E-1 contributes nothing. ``quantized`` (a8w8) is read in place of quantizing
    ``x``: by the routed and the shared experts' gate/up products.
    """
    from hwrun.ops.moe_experts import _check_experts_args, quantized_problems

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
        problems = quantized_problems(x, activation_mode, quantized)
        if problems:
            raise ValueError("moe.experts: " + "; ".join(problems))
    else:
        _check_experts_args(x, w13, w2, ids, weights, activation_mode, shared_experts, quantized)
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    num_experts = w13.shape[0]
    a8w8 = activation_mode == "a8w8"
    if tiles is None:
        sms = multiprocessors(x.device.index or 0) if x.is_cuda else None
        inter = w13.shape[-2] // 2
        tiles = default_tiles(
            tokens * top_k, num_experts, x.is_cuda, tokens=tokens, inter=inter, num_sms=sms,
            descriptors=nvidia_sm90_or_later(x.device), a8w8=a8w8,
        )  # fmt: skip
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
    # a8w8: x's codes and scales made once (or handed over) for every gate/up product below
    xq = None
    if a8w8 and quantized is not None:  # the kernels read both row-major and contiguous
        xq = (quantized[0].contiguous(), quantized[1].contiguous())
    elif a8w8:
        xq = quantize_activations(xb, w13.format == "fp8_block128_ue8m0")
    routed = _swiglu_grouped(
        xb, w13, w2, shared_group, layout, route, slots + tokens * fuse, top_k, tiles, a8w8, xq
    )
    shared = routed[slots:] if fuse else routed  # routed: any float32 rows when unused
    if shared_experts is not None and not fuse:  # its own launch, as the only group
        shared_w13, shared_w2 = shared_experts
        only_shared = align_by_expert(ids[:, :0], 0, tiles.block_m, with_shared=True)
        shared = _swiglu_grouped(
            xb, shared_w13, shared_w2, shared_experts, only_shared, route, tokens, 1, tiles, a8w8,
            xq,
        )  # fmt: skip
    block_d = min(1024, triton.next_power_of_2(hidden))
    _combine_kernel[(tokens, triton.cdiv(hidden, block_d))](
        routed,
        flat_ids,
        shared,
        out,
        hidden,
        num_experts,
        TOP_K=top_k,
        HAS_SHARED=shared_experts is not None,
        BLOCK_D=block_d,
        **pdl_options(out.device),
    )
    return out
