"""QuantizedWeight: each format's bytes are the hwrun.formats codec's, per expert, and every
inconsistent part is refused with the expected shape."""

import pytest
import torch

from hwrun.formats.e8m0 import decode_e8m0
from hwrun.formats.fp8 import dequantize_fp8_block128, quantize_fp8_block128
from hwrun.formats.int4 import quantize_int4_g128
from hwrun.formats.mxfp4 import quantize_mxfp4
from hwrun.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4
from hwrun.ops.quantized_weight import WEIGHT_FORMATS, QuantizedWeight, quantize_weight

EXPERTS, ROWS, COLS = 3, 160, 256  # 160 rows: fp8 block-128 edge tiles are partial


def weight(seed=0):
    return torch.randn(EXPERTS, ROWS, COLS, generator=torch.Generator().manual_seed(seed))


def test_fp8_block128_is_the_codec_per_expert():
    w = weight()
    q = quantize_weight(w, "fp8_block128")
    for e in range(EXPERTS):
        codes, scales = quantize_fp8_block128(w[e])
        assert torch.equal(q.data[e], codes) and torch.equal(q.scales[e], scales)
        assert torch.equal(q.expert(e).dequantize(), dequantize_fp8_block128(codes, scales))
    assert q.scales.shape == (EXPERTS, 2, 2)


def test_fp8_ue8m0_scales_are_stored_as_one_byte_powers_of_two():
    w = weight(1)
    q = quantize_weight(w, "fp8_block128_ue8m0")
    assert q.scales.dtype == torch.uint8
    codes, scales = quantize_fp8_block128(w[1], ue8m0=True)
    assert torch.equal(decode_e8m0(q.scales[1]), scales) and torch.equal(q.data[1], codes)
    fp32_scaled = quantize_weight(w, "fp8_block128")
    assert q.nbytes < fp32_scaled.nbytes
    # Power-of-two scales lose at most a factor 2 of range, so the error stays fp8-sized.
    err = (q.dequantize() - w).norm() / w.norm()
    assert err < 0.05


def test_mxfp4_and_int4_groups_run_along_the_last_dimension():
    w = weight(2)
    mx = quantize_weight(w, "mxfp4")
    assert (mx.data.shape, mx.scales.shape) == ((EXPERTS, ROWS, COLS // 2), (EXPERTS, ROWS, 8))
    assert torch.equal(mx.data[2], quantize_mxfp4(w[2])[0])
    int4 = quantize_weight(w, "int4_g128")
    packed, scales = quantize_int4_g128(w[0])
    assert torch.equal(int4.data[0], packed) and torch.equal(int4.scales[0], scales)
    assert mx.nbytes == EXPERTS * ROWS * (COLS // 2 + COLS // 32)


def test_nvfp4_keeps_one_tensor_scale_per_expert():
    w = weight(3)
    w[1] *= 100  # a per-model tensor scale would crush expert 0's and 2's values
    q = quantize_weight(w, "nvfp4")
    assert q.tensor_scale.shape == (EXPERTS,)
    for e in range(EXPERTS):
        packed, scales, tensor_scale = quantize_nvfp4(w[e])
        assert torch.equal(q.data[e], packed) and q.tensor_scale[e] == tensor_scale
        assert torch.equal(q.expert(e).dequantize(), dequantize_nvfp4(packed, scales, tensor_scale))
    err = (q.dequantize()[0] - w[0]).norm() / w[0].norm()
    assert err < 0.15


@pytest.mark.parametrize("format", list(WEIGHT_FORMATS))
def test_round_trip_error_is_the_formats(format):
    w = weight(4)
    q = quantize_weight(w, format, "w13")
    assert q.format == format and q.shape == w.shape and q.name == "w13"
    two_d = quantize_weight(w[0], format)
    assert torch.equal(two_d.dequantize(), q.expert(0).dequantize())
    bound = {"bf16": 0.005, "fp8_block128": 0.05, "fp8_block128_ue8m0": 0.05}.get(format, 0.2)
    assert (q.dequantize() - w).norm() / w.norm() < bound


def test_unknown_format_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="w13: unknown weight format 'mxfp6'; known formats: bf16"):
        quantize_weight(weight(), "mxfp6", "w13")


@pytest.mark.parametrize(
    ("format", "cols", "message"),
    [("mxfp4", 48, "multiple of 32"), ("nvfp4", 40, "multiple of 16"), ("int4_g128", 64, "128")],
)
def test_widths_a_format_cannot_group_are_refused(format, cols, message):
    with pytest.raises(ValueError, match=message):
        quantize_weight(torch.zeros(2, cols), format, "w2")


def test_inconsistent_parts_are_refused_naming_the_expected_shape():
    q = quantize_weight(weight(), "mxfp4", "layers.3.w13")
    with pytest.raises(ValueError) as err:
        QuantizedWeight("mxfp4", (EXPERTS, ROWS, COLS), q.data, q.scales[:, :, :4], name="w13")
    assert "w13: mxfp4 scales of a [3, 160, 256] weight must be torch.uint8 [3, 160, 8]" in str(
        err.value
    )
    with pytest.raises(ValueError, match=r"nvfp4 tensor_scale .* must be torch.float32 \[3\]"):
        QuantizedWeight("nvfp4", (EXPERTS, ROWS, COLS), q.data, q.scales.repeat(1, 1, 2))
    with pytest.raises(ValueError, match="a bf16 weight has no scales"):
        QuantizedWeight("bf16", (2, 2), torch.zeros(2, 2).bfloat16(), torch.ones(1))
    with pytest.raises(ValueError, match=r"must be \[R, C\] or \[E, R, C\]"):
        QuantizedWeight("bf16", (4,), torch.zeros(4).bfloat16())
