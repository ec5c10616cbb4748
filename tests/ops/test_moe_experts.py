"""moe.experts against transformers' DeepseekV32 MoE block, for every weight format and mode."""

import pytest
import torch
from transformers import DeepseekV32Config
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32MoE

from hwrun.ops.moe_experts import experts
from hwrun.ops.moe_route import route
from hwrun.ops.quantized_weight import quantize_weight

HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 128, 128, 8, 3, 24
# Relative L2 error of the block's output with quantized routed experts against bf16 ones:
# about 1.5x what these seeds measure, so a format that lost its scales (error ~1) or silently
# fell back to bf16 (error ~0) fails. Both GEMMs are quantized, so it is ~1.4x one weight's error.
FORMAT_ERROR = {
    "fp8_block128": 0.06,
    "fp8_block128_ue8m0": 0.06,
    "mxfp4": 0.25,
    "nvfp4": 0.2,
    "int4_g128": 0.25,
}
QUANTIZED_FORMATS = list(FORMAT_ERROR)


def hf_block(seed=0):
    """A bf16 DeepseekV32MoE with random weights (grouped routing, correction bias, 1 shared)."""
    config = DeepseekV32Config(
        hidden_size=HIDDEN,
        moe_intermediate_size=INTER,
        n_routed_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        hidden_act="silu",
    )
    config._experts_implementation = "eager"
    block = DeepseekV32MoE(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) / param.shape[-1] ** 0.5)
        bias = block.gate.e_score_correction_bias
        bias.copy_(torch.randn(bias.shape, generator=generator) * 0.1)
    return block.to(torch.bfloat16).eval()


def hf_weights(block):
    """(w13, w2, shared w13, shared w2) of the block as fp32 tensors."""
    shared = block.shared_experts
    return (
        block.experts.gate_up_proj.detach().float(),
        block.experts.down_proj.detach().float(),
        torch.cat([shared.gate_proj.weight, shared.up_proj.weight]).detach().float(),
        shared.down_proj.weight.detach().float(),
    )


def set_hf_weights(block, w13, w2):
    with torch.no_grad():
        block.experts.gate_up_proj.copy_(w13.to(torch.bfloat16))
        block.experts.down_proj.copy_(w2.to(torch.bfloat16))


def hidden_states(seed=1):
    return torch.randn(TOKENS, HIDDEN, generator=torch.Generator().manual_seed(seed)).bfloat16()


def ours(block, x, w13, w2, mode="bf16", shared=None):
    """moe.route on the block's router logits (checked against its own routing), then
    moe.experts."""
    gate = block.gate
    with torch.no_grad():
        logits, hf_weights_, hf_ids = gate(x)
    weights, ids = route(
        logits,
        TOP_K,
        "sigmoid",
        gate.num_group,
        gate.topk_group,
        gate.e_score_correction_bias.float(),
        routed_scaling_factor=gate.routed_scaling_factor,
    )
    order, hf_order = ids.long().argsort(-1), hf_ids.argsort(-1)
    assert torch.equal(ids.long().gather(1, order), hf_ids.gather(1, hf_order))
    torch.testing.assert_close(weights.gather(1, order), hf_weights_.gather(1, hf_order))
    return experts(x, w13, w2, ids, weights, activation_mode=mode, shared_experts=shared)


def bf16_shared(block):
    _, _, shared_w13, shared_w2 = hf_weights(block)
    return quantize_weight(shared_w13, "bf16"), quantize_weight(shared_w2, "bf16")


def assert_bf16_close(actual, expected):
    """Within bf16 rounding: transformers rounds every expert's output to bf16 and accumulates
    the top-k sum in bf16, the reference accumulates in fp32 and rounds once. A few bf16 ulps of
    the output's scale covers that; a wrong expert or weight moves the output by O(scale)."""
    scale = expected.float().abs().max()
    torch.testing.assert_close(actual.float(), expected.float(), rtol=2**-6, atol=2**-6 * scale)


def rel_l2(actual, expected):
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


def test_bf16_weights_match_transformers():
    block, x = hf_block(), hidden_states()
    w13, w2, _, _ = hf_weights(block)
    with torch.no_grad():
        expected = block(x[None])[0]
    out = ours(
        block,
        x,
        quantize_weight(w13, "bf16"),
        quantize_weight(w2, "bf16"),
        shared=bf16_shared(block),
    )
    assert out.dtype == torch.bfloat16 and out.shape == (TOKENS, HIDDEN)
    assert_bf16_close(out, expected)


@pytest.mark.parametrize("format", QUANTIZED_FORMATS)
def test_quantized_weights_match_dequantize_then_bf16(format):
    block, x = hf_block(), hidden_states()
    w13, w2, _, _ = hf_weights(block)
    with torch.no_grad():
        unquantized = block(x[None])[0]
    q13, q2 = quantize_weight(w13, format, "w13"), quantize_weight(w2, format, "w2")
    set_hf_weights(block, q13.dequantize(), q2.dequantize())
    with torch.no_grad():
        expected = block(x[None])[0]
    out = ours(block, x, q13, q2, shared=bf16_shared(block))
    assert_bf16_close(out, expected)
    # And the format's own error against the unquantized block stays in its class.
    assert 0.001 < rel_l2(out, unquantized) < FORMAT_ERROR[format]


@pytest.mark.parametrize(("mode", "bound"), [("a8w4", 0.07), ("a4w4", 0.3)])
def test_quantized_activations_stay_within_their_format_error(mode, bound):
    block, x = hf_block(), hidden_states()
    w13, w2, _, _ = hf_weights(block)
    q13, q2 = quantize_weight(w13, "mxfp4"), quantize_weight(w2, "mxfp4")
    weights_only = ours(block, x, q13, q2)
    error = rel_l2(ours(block, x, q13, q2, mode=mode), weights_only)
    assert 0.001 < error < bound


def small_weights(format="bf16", experts_=4, hidden=128, inter=128, seed=2):
    generator = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts_, 2 * inter, hidden, generator=generator) / hidden**0.5
    w2 = torch.randn(experts_, hidden, inter, generator=generator) / inter**0.5
    return quantize_weight(w13, format, "w13"), quantize_weight(w2, format, "w2")


def test_zero_tokens_give_an_empty_output():
    w13, w2 = small_weights("mxfp4")
    for mode in ("bf16", "a8w4", "a4w4"):
        out = experts(
            torch.empty(0, 128, dtype=torch.bfloat16),
            w13,
            w2,
            torch.empty(0, 2, dtype=torch.int32),
            torch.empty(0, 2),
            mode,
        )
        assert out.shape == (0, 128) and out.dtype == torch.bfloat16


def test_an_id_of_minus_one_contributes_nothing():
    w13, w2 = small_weights()
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(6, 128, generator=generator).bfloat16()
    ids = torch.tensor([[0, 1], [2, 3], [1, 1], [3, 0], [2, 2], [0, 3]], dtype=torch.int32)
    weights = torch.rand(6, 2, generator=generator)
    dropped = ids.clone()
    dropped[:, 1] = -1
    zeroed = weights.clone()
    zeroed[:, 1] = 0
    assert torch.equal(experts(x, w13, w2, dropped, weights), experts(x, w13, w2, ids, zeroed))


def test_each_token_is_its_weighted_experts_sum():
    """A per-token loop written from the definition, independent of the grouped reference."""
    w13, w2 = small_weights("nvfp4", seed=4)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(5, 128, generator=generator).bfloat16()
    ids = torch.randint(0, 4, (5, 2), generator=generator)
    weights = torch.rand(5, 2, generator=generator)
    dense13, dense2 = w13.dequantize(), w2.dequantize()
    expected = torch.zeros(5, 128)
    for t in range(5):
        for j in range(2):
            gate, up = (dense13[ids[t, j]] @ x[t].float()).chunk(2)
            hidden = (torch.nn.functional.silu(gate) * up).bfloat16().float()
            expected[t] += weights[t, j] * (dense2[ids[t, j]] @ hidden)
    out = experts(x, w13, w2, ids, weights)
    # fp32 sums in another order may round to the neighbouring bf16 value: one ulp.
    torch.testing.assert_close(out.float(), expected.bfloat16().float(), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"x": torch.zeros(3, 64, dtype=torch.bfloat16)},
            "w13 (w13) must be [E, 2I, D] with D = 64",
        ),
        ({"w2": small_weights(inter=64)[1]}, "w2 (w2) must be [E, D, I] = [4, 128, 128]"),
        ({"ids": torch.full((3, 2), 4)}, "ids must be in -1..E-1 = -1..3"),
        ({"ids": torch.zeros(3, 2)}, "ids must be an integer tensor [T, k] with T = 3"),
        ({"weights": torch.zeros(3, 3)}, "weights must be a float tensor [T, k] = [3, 2]"),
        ({"activation_mode": "a16w4"}, "activation_mode must be one of"),
        ({"w2": torch.zeros(4, 128, 128)}, "w2 must be a QuantizedWeight, got Tensor"),
        ({"activation_mode": "a8w4"}, "runs on mxfp4 weights, but w13 is bf16"),
        (
            {"shared_experts": small_weights(experts_=1)},
            "shared_experts must be (w13 [2Is, D], w2 [D, Is]) with D = 128",
        ),
    ],
)
def test_bad_input_names_the_tensor_and_expected_shape(change, message):
    w13, w2 = small_weights()
    args = {
        "x": torch.zeros(3, 128, dtype=torch.bfloat16),
        "w13": w13,
        "w2": w2,
        "ids": torch.zeros(3, 2, dtype=torch.int32),
        "weights": torch.ones(3, 2),
    }
    with pytest.raises(ValueError, match=r"^moe\.experts: ") as err:
        experts(**{**args, **change})
    assert message in str(err.value)


def test_quantized_activation_modes_need_whole_groups():
    w13, w2 = small_weights("mxfp4", hidden=64, inter=64)
    x, ids, weights = (
        torch.zeros(2, 64).bfloat16(),
        torch.zeros(2, 1, dtype=torch.int32),
        torch.ones(2, 1),
    )
    with pytest.raises(ValueError, match="D = 64 and I = 64 must be multiples of 128"):
        experts(x, w13, w2, ids, weights, "a8w4")
    assert experts(x, w13, w2, ids, weights, "a4w4").shape == (2, 64)


@pytest.mark.parametrize(("format", "mode"), [("bf16", "bf16"), ("mxfp4", "a8w4")])
def test_a_token_gets_the_same_bits_alone_and_in_a_batch(format, mode):
    w13, w2 = small_weights(format, seed=6)
    shared = small_weights("bf16", experts_=1, seed=7)
    shared = (shared[0].expert(0), shared[1].expert(0))
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(9, 128, generator=generator).bfloat16()
    ids = torch.randint(0, 4, (9, 2), generator=generator)
    weights = torch.rand(9, 2, generator=generator)
    batch = experts(x, w13, w2, ids, weights, mode, shared)
    for row in (0, 4, 8):
        alone = experts(
            x[row : row + 1], w13, w2, ids[row : row + 1], weights[row : row + 1], mode, shared
        )
        assert torch.equal(alone, batch[row : row + 1])


@pytest.mark.parametrize("format", ["fp8_block128", "fp8_block128_ue8m0"])
def test_a8w8_quantizes_every_gemm_input_as_deepseek_does(format):
    # The routed and the shared experts' inputs x and silu(gate) * up, each as e4m3 per token
    # and 128 values (powers of two with ue8m0 weights), through hwrun.formats directly.
    import torch.nn.functional as F

    from hwrun.formats.fp8 import dequantize_fp8_groups, quantize_fp8_groups

    ue8m0 = format == "fp8_block128_ue8m0"
    w13, w2 = small_weights(format, experts_=3, hidden=256, inter=128, seed=8)
    s13, s2 = small_weights(format, experts_=1, hidden=256, inter=128, seed=9)
    shared = (s13.expert(0), s2.expert(0))
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(5, 256, generator=generator).bfloat16()
    ids = torch.randint(0, 3, (5, 2), generator=generator, dtype=torch.int32)
    ids[1, 0] = -1
    weights = torch.rand(5, 2, generator=generator)

    def fp8(a):
        return dequantize_fp8_groups(*quantize_fp8_groups(a.float(), 128, ue8m0=ue8m0))

    def mlp(row, up_gate, down):
        gate, up = (up_gate.dequantize() @ fp8(row[None])[0]).chunk(2)
        return down.dequantize() @ fp8((F.silu(gate) * up)[None])[0]

    want = torch.zeros(5, 256)
    for t in range(5):
        for j in range(2):
            if ids[t, j] >= 0:
                e = int(ids[t, j])
                want[t] += weights[t, j] * mlp(x[t], w13.expert(e), w2.expert(e))
        want[t] += mlp(x[t], *shared)
    got = experts(x, w13, w2, ids, weights, "a8w8", shared)
    # The reference adds a token's experts in id order, this sum in slot order: fp32 rounding
    # apart, which may move the bf16 output by one unit (2^-7 relative at most).
    torch.testing.assert_close(got.float(), want.bfloat16().float(), rtol=2**-7, atol=1e-5)
    # and the activations' rounding is seen: bf16 activations give another result
    assert not torch.equal(got, experts(x, w13, w2, ids, weights, "bf16", shared))


def test_a8w8_refuses_weights_that_are_not_block_fp8():
    x, weights = torch.zeros(2, 128).bfloat16(), torch.ones(2, 1)
    ids = torch.zeros(2, 1, dtype=torch.int32)
    w13, w2 = small_weights("mxfp4")
    with pytest.raises(ValueError, match="'a8w8' runs on fp8_block128/fp8_block128_ue8m0"):
        experts(x, w13, w2, ids, weights, "a8w8")
    w13, w2 = small_weights("fp8_block128")
    bf16_shared_pair = small_weights("bf16", experts_=1)
    shared = (bf16_shared_pair[0].expert(0), bf16_shared_pair[1].expert(0))
    with pytest.raises(ValueError, match="quantize it to block-FP8 or use 'bf16'"):
        experts(x, w13, w2, ids, weights, "a8w8", shared)
    narrow = small_weights("fp8_block128", experts_=1, inter=64)
    with pytest.raises(ValueError, match="their width 64 must be a multiple of 128"):
        experts(x, w13, w2, ids, weights, "a8w8", (narrow[0].expert(0), narrow[1].expert(0)))
    # bf16 activations still take bf16 shared experts beside block-FP8 routed ones
    assert experts(x, w13, w2, ids, weights, "bf16", shared).shape == (2, 128)


def test_a8w8_quantized_input_is_checked_and_defines_nothing():
    """``quantized``: x's codes and scales, a8w8 only. The reference checks their shapes and
    computes from x (they are the caller's promise), so handing them over changes nothing."""
    from hwrun.formats.fp8 import quantize_fp8_groups

    g = torch.Generator().manual_seed(61)
    x = torch.randn(3, 128, generator=g).bfloat16()
    ids = torch.tensor([[0, 1], [1, -1], [0, 0]], dtype=torch.int32)
    weights = torch.rand(3, 2, generator=g)
    w13, w2 = small_weights("fp8_block128")
    codes, scales = quantize_fp8_groups(x.float(), group=128)
    codes = codes.view(torch.uint8)
    want = experts(x, w13, w2, ids, weights, "a8w8")
    assert torch.equal(experts(x, w13, w2, ids, weights, "a8w8", quantized=(codes, scales)), want)
    with pytest.raises(
        ValueError, match=r"quantized .* is an a8w8 input; activation_mode is 'bf16'"
    ):
        experts(x, w13, w2, ids, weights, "bf16", quantized=(codes, scales))
    with pytest.raises(ValueError, match=r"quantized scales must be torch.float32 \[3, 1\]"):
        experts(x, w13, w2, ids, weights, "a8w8", quantized=(codes, scales[:2]))
    with pytest.raises(ValueError, match=r"quantized must be \(codes, scales\)"):
        experts(x, w13, w2, ids, weights, "a8w8", quantized=codes)
