"""moe.experts Triton kernels against the reference (CPU interpreter, tiny shapes).

Tolerance: the kernel multiplies the same bf16 GEMM inputs and accumulates in fp32, but in
tiles, so its sums run in another order than the reference's per-token products. That can flip
a bf16 rounding of the intermediate or of the output by one unit (2^-8 relative), so outputs
are compared to 4 bf16 units of the reference (rtol 2^-6) plus an atol of 1e-3 of the output's
scale for values near zero. In the interpreter the kernel computes in fp32 and usually lands
exactly on the reference.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from hwrun.kernels.triton import moe
from hwrun.kernels.triton.moe import TileConfig, experts
from hwrun.kernels.triton.moe_align import align_by_expert
from hwrun.ops.moe_experts import experts as reference
from hwrun.ops.quantized_weight import quantize_weight

FORMATS = ["bf16", "fp8_block128", "fp8_block128_ue8m0"]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = float(want.float().abs().amax()) if want.numel() else 1.0
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-6, atol=1e-3 * scale)


def _problem(g, fmt, tokens, experts_, hidden, inter, k, shared_inter=None, dtype=torch.bfloat16):
    def weight(shape, name):
        return quantize_weight(torch.randn(*shape, generator=g) * 0.1, fmt, name)

    ids = torch.empty(tokens, k, dtype=torch.int32)
    for t in range(tokens):
        ids[t] = torch.randperm(experts_, generator=g)[:k]
    shared = None
    if shared_inter is not None:
        shared = (weight((2 * shared_inter, hidden), "sw13"), weight((hidden, shared_inter), "sw2"))
    return {
        "x": torch.randn(tokens, hidden, generator=g).to(dtype),
        "w13": weight((experts_, 2 * inter, hidden), "w13"),
        "w2": weight((experts_, hidden, inter), "w2"),
        "ids": ids,
        "weights": torch.rand(tokens, k, generator=g),
        "shared_experts": shared,
    }


@pytest.mark.parametrize(
    "fmt,shared_inter",
    [
        ("bf16", 48),  # shared experts wider than the routed: launches of their own
        ("fp8_block128", 48),
        ("fp8_block128_ue8m0", 48),
        ("fp8_block128", 32),  # same width and format: group E of the routed launch
    ],
)
def test_matches_reference_with_shared_experts_and_unserved_slots(fmt, shared_inter):
    g = torch.Generator().manual_seed(11)
    args = _problem(g, fmt, 9, 8, 64, 32, 3, shared_inter=shared_inter)
    args["ids"][0, 1] = -1  # one slot served by another rank
    args["ids"][4, :] = -1  # a token with no expert here: only the shared experts
    args["ids"][args["ids"] == 5] = 4  # expert 5 empty; a token may now choose 4 twice
    _close(experts(**args), reference(**args))


def test_many_rows_per_expert_span_several_row_blocks():
    g = torch.Generator().manual_seed(12)
    args = _problem(g, "fp8_block128", tokens=40, experts_=4, hidden=64, inter=32, k=2)
    tiles = TileConfig(block_m=16, block_n=32, block_k=64, num_warps=4, num_stages=1)
    _close(experts(**args, tiles=tiles), reference(**args))


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize("fmt", ["fp8_block128", "fp8_block128_ue8m0"])
def test_f16_products_match_the_reference_across_the_bf16_range(fmt, block_n):
    # f16 products scale each activation row by a power of two into f16's range: rows whose
    # magnitudes sit far outside it (1e15, 1e-15; their intermediates square that) and span
    # many binades inside one row must still match, as must an all-zero row.
    g = torch.Generator().manual_seed(21)
    args = _problem(g, fmt, 7, 4, 256, 96, 2, shared_inter=96)
    x = args["x"].float()
    x[1] *= 1e15
    x[2] *= 1e-15
    x[3] *= torch.logspace(-12, 12, x.shape[1]).to(x.dtype)  # 24 decades in one row
    x[4] = 0
    args["x"] = x.to(torch.bfloat16)
    # I = 96 with block_n 64: h's second scale tile is partial; block_n 32: the down product's
    # K steps (32) are narrower than the tiles' block_k (64)
    tiles = TileConfig(16, block_n, 64, 4, 1, f16_products=True)
    got, want = experts(**args, tiles=tiles), reference(**args)
    assert torch.isfinite(want.float()).all()
    for row in range(got.shape[0]):  # rows differ by up to 60 decades: each at its own scale
        _close(got[row : row + 1], want[row : row + 1])


def test_f16_products_hold_rows_that_f16_alone_would_overflow():
    # Without the row scaling the 1e15 rows would overflow f16: the kernel's output there is
    # finite and right, so the test above can tell a missing scale.
    g = torch.Generator().manual_seed(22)
    args = _problem(g, "fp8_block128", 2, 2, 128, 128, 1)
    args["x"] = (args["x"].float() * 1e15).to(torch.bfloat16)
    assert not torch.isfinite(args["x"].float().to(torch.float16)).all()
    tiles = TileConfig(16, 32, 64, 4, 1, f16_products=True)
    got = experts(**args, tiles=tiles)
    assert torch.isfinite(got.float()).all()
    _close(got, reference(**args))


def test_f16_products_leave_bf16_and_int4_weights_on_their_paths():
    # f16 products are for e4m3 codes; the other formats ignore the flag and stay exact
    g = torch.Generator().manual_seed(23)
    for fmt in ("bf16", "int4_g128"):
        args = _problem(g, fmt, 5, 4, 128, 128, 2, shared_inter=128)
        tiles = TileConfig(16, 32, 32, 4, 1, f16_products=True)
        _close(experts(**args, tiles=tiles), reference(**args))


@pytest.mark.parametrize(
    "fmt,splits,f16",
    [("bf16", 2, False), ("fp8_block128", 2, False), ("fp8_block128", 3, True),
     ("int4_g128", 9, False)],
)  # fmt: skip
def test_gate_up_split_over_k_matches_the_reference(fmt, splits, f16):
    # hidden 256 in K steps of 32: 8 steps, so 3 splits run 3, 3 and 2 steps and 9 splits are
    # cut to 8 (a split of no steps would add nothing and still count)
    g = torch.Generator().manual_seed(24 + splits)
    args = _problem(g, fmt, 9, 4, 256, 128, 2, shared_inter=128)
    args["ids"][2, 0] = -1
    tiles = TileConfig(16, 32, 32, 4, 1, f16_products=f16, gate_up_splits=splits)
    _close(experts(**args, tiles=tiles), reference(**args))


def test_decode_tiles_by_how_much_of_a_wave_their_grid_fills():
    # The H200's 132 SMs at the shapes the tiles were timed at: the bench model's experts (64 of
    # width 512) take wide unsplit tiles at 8 and 16 tokens (under a wave), wide tiles split in
    # 4 at 64 (just over one wave), narrow tiles split in 3-4 at 1 token (a sixth of a wave);
    # DeepSeek-V3's 256 experts of width 2048 fill many waves: wide and unsplit.
    from hwrun.kernels.triton.moe import default_tiles

    def tiles(tokens, experts_, inter):
        got = default_tiles(tokens * 8, experts_, True, tokens=tokens, inter=inter, num_sms=132)
        return got.block_n, got.gate_up_splits

    assert tiles(64, 64, 512) == (128, 4)
    assert tiles(16, 64, 512) == (128, 1)
    assert tiles(8, 64, 512) == (128, 1)
    assert tiles(1, 64, 512)[0] == 64 and tiles(1, 64, 512)[1] >= 3
    assert all(tiles(t, 256, 2048) == (128, 1) for t in (4, 8, 64))
    assert default_tiles(64 * 8, 64, True).gate_up_splits == 1  # the device unknown
    assert (
        default_tiles(2048 * 8, 64, True, tokens=2048, inter=512, num_sms=132).gate_up_splits == 1
    )


def test_partial_scale_tiles_and_fp32_input():
    # I = 80: gate rows [0, 80) and up rows [80, 160) cut the 128-row scale tiles unevenly;
    # D = 160 ends in a partial K tile.
    g = torch.Generator().manual_seed(13)
    args = _problem(g, "fp8_block128", 5, 4, 160, 80, 2, dtype=torch.float32)
    _close(experts(**args), reference(**args))


@pytest.mark.parametrize(
    "fmt,f16,splits,shared_inter",
    [("fp8_block128", True, 1, 80), ("fp8_block128_ue8m0", False, 3, 80),
     ("fp8_block128", True, 2, 48)],
)  # fmt: skip
def test_codes_through_tensor_descriptors_match_the_reference(fmt, f16, splits, shared_inter):
    # I = 80 in 32-row tiles: the last gate tile's rows past I are up rows, the last up tile's
    # rows past 2I lie past the expert (zeros); D = 160 ends inside a 64-wide K step (zeros
    # past it). Shared experts of the routed width ride as group E, through their own
    # descriptor; wider ones (48 != 80) take launches of their own.
    g = torch.Generator().manual_seed(31 + splits)
    args = _problem(g, fmt, 9, 4, 160, 80, 2, shared_inter=shared_inter)
    args["ids"][3, 1] = -1
    tiles = TileConfig(16, 32, 64, 4, 1, f16_products=f16, gate_up_splits=splits, tma=True)
    _close(experts(**args, tiles=tiles), reference(**args))


@pytest.mark.parametrize(
    "fmt,f16,splits,stacked",
    [("fp8_block128", True, 1, True), ("fp8_block128_ue8m0", False, 3, True),
     ("fp8_block128", True, 2, False)],
)  # fmt: skip
def test_codes_through_host_descriptors_match_the_reference(fmt, f16, splits, stacked):
    # The shapes of the test above, through one host-built descriptor per weight over every
    # group's codes: the last up tile's rows past 2I now read the next group's gate rows (not
    # zeros), whose output columns are never stored. A shared group stored apart from the
    # routed experts makes the launch take pointer loads.
    from hwrun.kernels.triton.moe import _stacked_codes, stack_shared_group

    g = torch.Generator().manual_seed(41 + splits)
    args = _problem(g, fmt, 9, 4, 160, 80, 2, shared_inter=80)
    args["ids"][3, 1] = -1
    sw13, sw2 = args["shared_experts"]
    if stacked:
        args["w13"], sw13 = stack_shared_group(args["w13"], sw13)
        args["w2"], sw2 = stack_shared_group(args["w2"], sw2)
        args["shared_experts"] = (sw13, sw2)
    assert (_stacked_codes(args["w13"], sw13, 32, 64) is not None) == stacked
    assert (_stacked_codes(args["w2"], sw2, 32, 32) is not None) == stacked
    tiles = TileConfig(16, 32, 64, 4, 1, f16_products=f16, gate_up_splits=splits, tma=True)
    tiles = replace(tiles, host_descriptors=True)
    _close(experts(**args, tiles=tiles), reference(**args))


def test_stack_shared_group_keeps_the_values_and_refuses_other_shapes():
    from hwrun.kernels.triton.moe import stack_shared_group

    g = torch.Generator().manual_seed(43)
    args = _problem(g, "fp8_block128", 2, 4, 128, 64, 2, shared_inter=64)
    routed, shared = stack_shared_group(args["w13"], args["shared_experts"][0])
    assert torch.equal(routed.data, args["w13"].data)
    assert torch.equal(routed.scales, args["w13"].scales)
    assert torch.equal(shared.data, args["shared_experts"][0].data)
    assert shared.data.data_ptr() == routed.data.data_ptr() + routed.data.numel()
    wider = _problem(g, "fp8_block128", 2, 4, 128, 64, 2, shared_inter=128)
    with pytest.raises(ValueError, match="one \\[R, C\\] group"):
        stack_shared_group(wider["w13"], wider["shared_experts"][0])


def test_tensor_descriptors_only_for_e4m3_codes_they_can_address():
    from hwrun.kernels.triton.moe import _codes_take_descriptors

    g = torch.Generator().manual_seed(35)
    args = _problem(g, "fp8_block128", 2, 4, 128, 64, 2, shared_inter=64)
    assert _codes_take_descriptors(args["w13"], args["w2"], args["shared_experts"])
    bf16 = _problem(g, "bf16", 2, 4, 128, 64, 2)
    assert not _codes_take_descriptors(bf16["w13"], args["w2"], None)
    # w2's rows of 36 codes are not a multiple of 16 bytes: the pointer loads serve the launch
    # (and the result still matches)
    odd = _problem(g, "fp8_block128", 3, 4, 128, 36, 2)
    assert not _codes_take_descriptors(odd["w13"], odd["w2"], None)
    tiles = TileConfig(16, 32, 64, 4, 1, tma=True)
    _close(experts(**odd, tiles=tiles), reference(**odd))


A8W8_TILES = TileConfig(16, 128, 128, 4, 1)


@pytest.mark.parametrize(
    "fmt,shared_inter,splits,tma,host",
    [("fp8_block128", 128, 1, False, False), ("fp8_block128_ue8m0", 128, 3, True, True),
     ("fp8_block128", 256, 2, True, False), ("fp8_block128_ue8m0", 256, 1, False, False)],
)  # fmt: skip
def test_a8w8_matches_the_reference(fmt, shared_inter, splits, tma, host):
    # e4m3 activations (powers-of-two scales with ue8m0 weights): x quantized in one launch, the
    # intermediate by the gate/up tile that holds its 128 columns, both products e4m3 x e4m3.
    # Shared experts of the routed width ride as group E (through the host descriptors when
    # stacked); wider ones take launches of their own. D = 384: three K steps, split in 2-3.
    from hwrun.kernels.triton.moe import stack_shared_group

    g = torch.Generator().manual_seed(51 + splits)
    args = _problem(g, fmt, 9, 4, 384, 128, 2, shared_inter=shared_inter)
    args["ids"][3, 1] = -1
    args["ids"][5, :] = -1  # only the shared experts
    args["x"][6] = 0  # an all-zero row: its groups take the floor scale
    if host:
        sw13, sw2 = args["shared_experts"]
        args["w13"], sw13 = stack_shared_group(args["w13"], sw13)
        args["w2"], sw2 = stack_shared_group(args["w2"], sw2)
        args["shared_experts"] = (sw13, sw2)
    tiles = replace(A8W8_TILES, gate_up_splits=splits, tma=tma, host_descriptors=host)
    got = experts(**args, activation_mode="a8w8", tiles=tiles)
    want = reference(**args, activation_mode="a8w8")
    _close(got, want)
    # the activations' e4m3 rounding is there: the bf16 reference is measurably farther away
    bf16 = reference(**args)
    assert (got.float() - want.float()).norm() * 4 < (got.float() - bf16.float()).norm()


def _never_called(*args, **kwargs):
    raise AssertionError("x quantized again though its codes were handed over")


@pytest.mark.parametrize("shared_inter", [128, 256], ids=["shared_as_group", "shared_apart"])
def test_a8w8_reads_handed_over_codes(monkeypatch, shared_inter):
    """``quantized`` (x's codes and scales, as the engine's norm writes them) is what the
    kernels read, for the routed and the shared experts: codes equal to the kernel's own give
    the same bits, and other scales give another input's output (so they are read, not
    re-made). Token-
    major scales (the linears' layout) are made row-major first."""
    from hwrun.kernels.triton.activation_quant import quantize_activations

    g = torch.Generator().manual_seed(57)
    args = _problem(g, "fp8_block128", 5, 4, 256, 128, 2, shared_inter=shared_inter)
    args["ids"][2, :] = -1  # only the shared experts
    want = experts(**args, activation_mode="a8w8", tiles=A8W8_TILES)
    codes, scales = quantize_activations(args["x"], False)
    token_major = quantize_activations(args["x"], False, token_major_scales=True)[1]
    with monkeypatch.context() as patch:  # given codes, x is never quantized again
        patch.setattr(moe, "quantize_activations", _never_called)
        for given in (scales, token_major):
            got = experts(
                **args, activation_mode="a8w8", tiles=A8W8_TILES, quantized=(codes, given)
            )
            assert torch.equal(got, want)
    # halved scales are x / 2's (the same codes; no group near the 1e-4 amax floor): the
    # kernels compute x / 2's experts from them, not x's
    halved = experts(
        **args, activation_mode="a8w8", tiles=A8W8_TILES, quantized=(codes, scales / 2)
    )
    half_x = {**args, "x": args["x"] / 2}
    assert torch.equal(halved, experts(**half_x, activation_mode="a8w8", tiles=A8W8_TILES))
    assert not torch.equal(halved, want)
    with pytest.raises(ValueError, match=r"quantized .*is an a8w8 input"):
        experts(**args, tiles=A8W8_TILES, quantized=(codes, scales))


def test_a8w8_default_tiles_keep_the_intermediate_groups_whole():
    from hwrun.kernels.triton.moe import default_tiles

    for tokens in (1, 8, 64, 2048):
        got = default_tiles(
            tokens * 8, 64, True, tokens=tokens, inter=512, num_sms=132, a8w8=True,
            descriptors=True,
        )  # fmt: skip
        assert (got.block_n, got.block_k, got.f16_products) == (128, 128, False)
    one = default_tiles(8, 64, True, tokens=1, inter=512, num_sms=132, a8w8=True)
    assert one.gate_up_splits >= 2  # a sixth of a wave: split K instead of narrower tiles
    args = _problem(torch.Generator().manual_seed(52), "fp8_block128", 3, 4, 256, 128, 2)
    got = experts(**args, activation_mode="a8w8")  # the interpreter's tiles, made a8w8's
    _close(got, reference(**args, activation_mode="a8w8"))


def test_a8w8_refuses_tiles_that_cut_its_groups():
    args = _problem(torch.Generator().manual_seed(53), "fp8_block128", 3, 4, 256, 128, 2)
    with pytest.raises(ValueError, match="a8w8 tiles must be 128 wide and deep"):
        experts(**args, activation_mode="a8w8", tiles=TileConfig(16, 64, 128, 4, 1))


@pytest.mark.parametrize("tokens", [0, 1])
def test_zero_and_one_token(tokens):
    g = torch.Generator().manual_seed(14)
    args = _problem(g, "bf16", tokens, 8, 64, 32, 2, shared_inter=32)
    got = experts(**args)
    assert got.shape == (tokens, 64)
    _close(got, reference(**args))


def test_refuses_what_it_cannot_compute():
    g = torch.Generator().manual_seed(15)
    args = _problem(g, "bf16", 2, 4, 64, 32, 2)
    with pytest.raises(ValueError, match="activation_mode 'a8w4'"):
        experts(**args, activation_mode="a8w4")
    args["w13"] = quantize_weight(torch.randn(4, 64, 64, generator=g), "mxfp4", "w13")
    with pytest.raises(ValueError, match="w13 is mxfp4"):
        experts(**args)


@pytest.mark.parametrize("with_shared", [False, True])
def test_align_groups_every_served_slot_once(with_shared):
    g = torch.Generator().manual_seed(16)
    tokens, k, num_experts, block_m = 70, 4, 6, 8  # 280 slots: more than one 256-slot chunk
    ids = torch.randint(-1, num_experts, (tokens, k), generator=g, dtype=torch.int32)
    ids[3] = 9  # out of range: joins no run
    layout = align_by_expert(ids, num_experts, block_m, with_shared)
    group = ids.reshape(-1).long()
    if with_shared:  # slot N + t is token t's shared slot, group E
        group = torch.cat([group, torch.full((tokens,), num_experts)])
    served = ((group >= 0) & (group < num_experts + with_shared)).nonzero().flatten()
    slots = layout.sorted_slots.long()
    assert sorted(slots[slots >= 0].tolist()) == served.tolist()
    assert layout.num_blocks * block_m == slots.numel()
    blocks = slots.reshape(layout.num_blocks, block_m)
    for block, expert in zip(blocks, layout.block_expert.tolist(), strict=True):
        rows = block[block >= 0]
        if expert < 0:
            assert rows.numel() == 0  # past the last run
        else:
            assert rows.numel() and (group[rows] == expert).all()
            assert torch.equal(rows, rows.sort().values)  # flat order kept inside a run


@pytest.mark.parametrize(("hidden", "shared_inter"), [(256, 128), (128, 256)])
def test_w4a16_int4_group128_matches_the_reference(hidden, shared_inter):
    # Two int4 groups along a row (D = 256 for w13, Is = 256 for the shared w2), K steps of 32
    # walking each group in four; shared experts as group E (Is = I = 128) and in a launch of
    # their own (Is = 256).
    g = torch.Generator().manual_seed(17)
    args = _problem(g, "int4_g128", 5, 4, hidden, 128, 2, shared_inter=shared_inter)
    args["ids"][1, 0] = -1
    _close(experts(**args), reference(**args))


def test_w4a16_negative_control_nibble_order_matters():
    # The same bytes read with the nibbles swapped (column 2j from the high nibble) are another
    # weight: the kernel must not match the reference on it, so the test above can fail.
    g = torch.Generator().manual_seed(18)
    args = _problem(g, "int4_g128", 3, 2, 128, 128, 1)
    good = reference(**args)
    w13 = args["w13"]
    swapped = (w13.data >> 4) | (w13.data << 4)
    args["w13"] = type(w13)(w13.format, w13.shape, swapped, w13.scales, name="w13")
    assert not torch.allclose(experts(**args).float(), good.float(), rtol=2**-6, atol=1e-3)
