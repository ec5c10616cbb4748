import re

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hwrun.formats.index_keys import INDEX_KEY_FORMATS, get_index_key_format

from .conftest import E2M1, E4M3, spread


def keys(gen, t=12):
    k = torch.randn(t, 128, generator=gen)
    k[0] = 0.0  # all-zero token: amax floor 1e-4
    k[1] = 2.5  # all-equal token
    k[2] *= 1e5  # huge
    k[3] *= 1e-7  # below the amax floor
    k[4, :32] = 6.0  # amax exactly on the largest e2m1 code
    return k


def test_registry():
    sizes = {
        n: (f.bytes_per_token, f.element_bytes, f.scale_bytes) for n, f in INDEX_KEY_FORMATS.items()
    }
    assert sizes == {"bf16": (256, 256, 0), "fp8": (132, 128, 4), "mxfp4": (68, 64, 4)}
    with pytest.raises(ValueError, match="known: bf16, fp8, mxfp4"):
        get_index_key_format("int8")


def vllm_fp8_keys(k):
    """vLLM's indexer_k_quant_and_cache with scale_fmt ue8m0, in numpy float64 + ml_dtypes."""
    x = k.numpy()
    scale = np.maximum(np.abs(x).max(-1, keepdims=True), 1e-4).astype(np.float32) / np.float32(448)
    scale = np.exp2(np.ceil(np.log2(scale.astype(np.float64)))).astype(np.float32)
    codes = np.clip(x / scale, -448, 448).astype(E4M3).view(np.uint8)
    return torch.from_numpy(codes), torch.from_numpy(scale.astype("<f4").view(np.uint8))


def deepgemm_mxfp4_keys(k):
    """DeepGEMM's SM100 indexer rule 2^ceil(log2(max(amax, 1e-4) / 6)), numpy + ml_dtypes."""
    x = k.numpy().reshape(-1, 4, 32).astype(np.float64)
    e = np.ceil(np.log2(np.maximum(np.abs(x).max(-1), 1e-4) / 6))
    codes = (x / np.exp2(e)[..., None]).astype(np.float32).astype(E2M1).view(np.uint8)
    codes = codes.reshape(-1, 128)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return torch.from_numpy(packed), torch.from_numpy((e + 127).astype(np.uint8))


def test_fp8_matches_vllm_writer(gen):
    k = keys(gen)
    elements, scales = get_index_key_format("fp8").encode(k)
    want_elements, want_scales = vllm_fp8_keys(k)
    assert torch.equal(elements, want_elements) and torch.equal(scales, want_scales)


def test_mxfp4_matches_deepgemm_rule(gen):
    k = keys(gen)
    elements, scales = get_index_key_format("mxfp4").encode(k)
    want_elements, want_scales = deepgemm_mxfp4_keys(k)
    assert torch.equal(scales, want_scales)
    assert torch.equal(elements, want_elements)


def test_mxfp4_never_saturates_unlike_floor():
    k = torch.zeros(1, 128)
    k[0, 0] = 7.5  # FLOOR would pick 2^0 and clip to 6; the indexer rule picks 2^1
    f = get_index_key_format("mxfp4")
    assert f.decode(*f.encode(k))[0, 0].item() == 8.0


def test_bf16_is_exact_bf16(gen):
    k = spread(gen, 5, 128)
    elements, scales = get_index_key_format("bf16").encode(k)
    want = k.numpy().astype(ml_dtypes.bfloat16).view(np.uint16).astype("<u2").view(np.uint8)
    assert torch.equal(elements, torch.from_numpy(want.copy())) and scales.shape == (5, 0)


@pytest.mark.parametrize("name", list(INDEX_KEY_FORMATS))
def test_decode_error_bound(gen, name):
    k = torch.randn(32, 128, generator=gen)
    f = get_index_key_format(name)
    err = (f.decode(*f.encode(k)) - k).abs()
    if name == "bf16":
        bound = k.abs() * 2.0**-8
    elif name == "fp8":
        amax = k.abs().amax(-1, keepdim=True)
        bound = k.abs() * 2.0**-4 + amax / 448 * 2 * 2.0**-10
    else:
        # scale <= amax / 3 (rounded up); half a step at the top binade is one scale unit.
        bound = (k.abs().reshape(32, 4, 32).amax(-1) / 3).repeat_interleave(32, -1)
    assert bool((err <= bound).all())


@pytest.mark.parametrize("name", list(INDEX_KEY_FORMATS))
def test_split_pages_is_block_major_and_a_view(gen, name):
    f = get_index_key_format(name)
    block_size, num_blocks = 4, 3
    storage = torch.zeros(num_blocks, block_size * f.bytes_per_token + 16, dtype=torch.uint8)
    cache = storage[:, : block_size * f.bytes_per_token]  # block stride larger than the page
    elements, scales = f.split_pages(cache, block_size)
    k = keys(gen, num_blocks * block_size)
    e, s = f.encode(k)
    elements.copy_(e.reshape(num_blocks, block_size, -1))
    scales.copy_(s.reshape(num_blocks, block_size, -1))
    eb, sb = f.element_bytes, f.scale_bytes
    for slot in range(num_blocks * block_size):
        b, i = divmod(slot, block_size)
        assert torch.equal(storage[b, i * eb : (i + 1) * eb], e[slot])
        start = block_size * eb + i * sb
        assert torch.equal(storage[b, start : start + sb], s[slot])
    assert torch.equal(f.decode(elements, scales).reshape(-1, 128), f.decode(e, s))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(-15, 20))
def test_mxfp4_canonical_tokens_roundtrip(seed, exponent):
    # A block whose first element is at magnitude code 7 (6 * scale) is canonical; scales above
    # the 1e-4 floor's own exponent (2^-15) round-trip.
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (1, 64), generator=g, dtype=torch.uint8)
    packed[:, ::16] |= 0x7
    scales = (torch.randint(-14, 21, (1, 4), generator=g) + 127).to(torch.uint8)
    scales[0, 0] = 127 + exponent
    f = get_index_key_format("mxfp4")
    again = f.encode(f.decode(packed, scales))
    assert torch.equal(again[0], packed) and torch.equal(again[1], scales)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_fp8_canonical_tokens_roundtrip(seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (1, 128), generator=g, dtype=torch.uint8)
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)
    codes[0, 0] = 0x7E  # 448: amax / 448 is the scale itself
    scale = torch.exp2(torch.randint(-10, 10, (1, 1), generator=g).float())
    f = get_index_key_format("fp8")
    again = f.encode(f.decode(codes, scale.view(torch.uint8)))
    assert torch.equal(again[0], codes) and torch.equal(again[1], scale.view(torch.uint8))


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: get_index_key_format("fp8").encode(torch.ones(3, 64)), "[T, 128]"),
        (
            lambda: get_index_key_format("fp8").encode(torch.ones(3, 128, dtype=torch.int32)),
            "[T, 128]",
        ),
        (
            lambda: get_index_key_format("mxfp4").decode(
                torch.zeros(3, 64, dtype=torch.uint8), torch.zeros(3, 2, dtype=torch.uint8)
            ),
            "scales [T, 4]",
        ),
        (
            lambda: get_index_key_format("mxfp4").split_pages(
                torch.zeros(2, 64 * 68 + 1, dtype=torch.uint8), 64
            ),
            "[num_blocks, 4352]",
        ),
        (lambda: get_index_key_format("fp8").split_pages(torch.zeros(2, 132 * 4), 4), "uint8"),
    ],
)
def test_bad_input_names_the_expected_shape(call, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        call()


def test_e4m3_reference_dtype_is_the_ocp_one():
    # Guard for the oracles above: ml_dtypes' e4m3 is the "fn" variant (max 448, no inf).
    assert float(ml_dtypes.finfo(E4M3).max) == 448.0
