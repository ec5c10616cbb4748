import math
import re

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

from hwrun.formats.latent import LATENT_FORMATS, get_latent_format

from .conftest import E4M3, ml_codes, spread

ROW_BYTES = {"bf16": 1152, "fp8_e4m3": 576, "fp8_ds_mla": 656, "nvfp4_ds_mla": 352}


def sample(gen, t=8):
    nope, rope = torch.randn(t, 512, generator=gen), torch.randn(t, 64, generator=gen)
    nope[0] = 0.0  # an all-zero token
    nope[1, :128] = 1.5  # an all-equal tile
    nope[2] *= 1e4  # huge values
    nope[3] *= 1e-6  # tiny values
    return nope, rope


def test_registry_names_and_row_bytes():
    assert {n: f.row_bytes for n, f in LATENT_FORMATS.items()} == ROW_BYTES
    with pytest.raises(ValueError, match="known: bf16, fp8_e4m3, fp8_ds_mla, nvfp4_ds_mla"):
        get_latent_format("fp4")


def test_bf16_rows_are_little_endian_bf16(gen):
    nope, rope = sample(gen)
    rows = get_latent_format("bf16").encode(nope, rope)
    both = torch.cat((nope, rope), -1).numpy().astype(ml_dtypes.bfloat16)
    assert torch.equal(
        rows, torch.from_numpy(both.view(np.uint16).astype("<u2").view(np.uint8).copy())
    )


def test_fp8_e4m3_rows_with_a_tensor_scale(gen):
    nope, rope = sample(gen)
    f = get_latent_format("fp8_e4m3")
    rows = f.encode(nope, rope, scale=0.5)
    want = ml_codes((torch.cat((nope, rope), -1) / 0.5).clamp(-448, 448), E4M3)
    assert torch.equal(rows, want)
    want_values = torch.from_numpy(want.numpy().view(E4M3).astype(np.float32)) * 0.5
    assert torch.equal(f.decode(rows, scale=0.5), want_values)


def vllm_ds_mla_row(nope, rope):
    """vLLM's concat_and_cache_ds_mla written independently with numpy and ml_dtypes."""
    n = nope.numpy().reshape(-1, 4, 128)
    scale = np.maximum(np.abs(n).max(-1) / np.float32(448), np.finfo(np.float32).tiny)
    q = np.clip(n / scale[..., None], -448, 448).astype(E4M3).view(np.uint8).reshape(-1, 512)
    s = scale.astype("<f4").view(np.uint8).reshape(-1, 16)
    r = rope.numpy().astype(ml_dtypes.bfloat16).view(np.uint8).reshape(-1, 128)
    return torch.from_numpy(np.concatenate([q, s, r], -1))


def flashmla_ds_mla_decode(rows):
    """FlashMLA's V32 dequant: bf16(e4m3) * bf16(scale) in bf16 arithmetic."""
    fp8 = rows[:, :512].contiguous().view(torch.float8_e4m3fn).to(torch.bfloat16)
    scales = rows[:, 512:528].contiguous().view(torch.float32).to(torch.bfloat16)
    nope = (fp8.reshape(-1, 4, 128) * scales.unsqueeze(-1)).reshape(-1, 512)
    rope = rows[:, 528:].contiguous().view(torch.bfloat16)
    return torch.cat((nope, rope), -1).float()


def test_fp8_ds_mla_matches_vllm_writer_and_flashmla_reader(gen):
    nope, rope = sample(gen)
    f = get_latent_format("fp8_ds_mla")
    rows = f.encode(nope, rope)
    assert torch.equal(rows, vllm_ds_mla_row(nope, rope))
    assert torch.equal(f.decode(rows), flashmla_ds_mla_decode(rows))


def test_fp8_ds_mla_bf16_input_matches_too(gen):
    nope, rope = sample(gen)
    nope, rope = nope.bfloat16(), rope.bfloat16()
    rows = get_latent_format("fp8_ds_mla").encode(nope, rope)
    assert torch.equal(rows, vllm_ds_mla_row(nope.float(), rope.float()))


def test_nvfp4_ds_mla_matches_torchao_and_ml_dtypes(gen):
    nope, rope = sample(gen)
    nope = nope[4:]  # torchao floors block scales at 2^-6 (hwrun: 2^-9): skip tiny blocks
    rope = rope[4:] * 100
    rows = get_latent_format("nvfp4_ds_mla").encode(nope, rope)
    ao_scales, ao_packed = nvfp4_quantize(nope.contiguous(), 16, None)
    assert torch.equal(rows[:, :256], ao_packed.view(torch.uint8))
    assert torch.equal(rows[:, 256:320], ml_codes(rope.clamp(-448, 448), E4M3))
    assert torch.equal(rows[:, 320:], ao_scales.view(torch.uint8).reshape(-1, 32))


def test_nvfp4_ds_mla_zero_and_tiny_blocks_keep_the_smallest_scale():
    nope = torch.zeros(1, 512)
    nope[0, 16] = 1e-5
    rows = get_latent_format("nvfp4_ds_mla").encode(nope, torch.zeros(1, 64))
    assert rows[0, 320:].tolist() == [1] * 32  # e4m3 0x01 = 2^-9, never 0
    assert rows[0, :256].tolist() == [0] * 256


@pytest.mark.parametrize("name", list(ROW_BYTES))
def test_decode_error_bounds(gen, name):
    nope, rope = torch.randn(16, 512, generator=gen), torch.randn(16, 64, generator=gen)
    f = get_latent_format(name)
    back = f.decode(f.encode(nope, rope))
    x = torch.cat((nope, rope), -1)
    err = (back - x).abs()
    if name == "bf16":
        bound = x.abs() * 2.0**-8
    elif name == "fp8_e4m3":
        bound = x.abs() * 2.0**-4 + 2.0**-10
    elif name == "fp8_ds_mla":
        # e4m3 half step, bf16 rounding of scale and product (2 * 2^-8), tile-relative floor.
        tile_amax = nope.abs().reshape(16, 4, 128).amax(-1).repeat_interleave(128, -1)
        nope_bound = nope.abs() * (2.0**-4 + 2.0**-6) + tile_amax / 448 * 2.0**-9
        bound = torch.cat((nope_bound, rope.abs() * 2.0**-8), -1)
    else:
        blk = nope.abs().reshape(16, 32, 16).amax(-1).repeat_interleave(16, -1)
        # scale rounding (2^-4 relative) then one e2m1 step near the top binade: <= amax/4 + ...
        nope_bound = blk * (1 / 6 * 1.0625) + 2.0**-9
        bound = torch.cat((nope_bound, rope.abs() * 2.0**-4 + 2.0**-10), -1)
    assert bool((err <= bound).all()), (err - bound).max()


def random_bytes(seed: int, n: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (1, n), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )


def without_e4m3_nan(codes: torch.Tensor) -> torch.Tensor:
    return torch.where((codes & 0x7F) == 0x7F, codes - 1, codes)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_canonical_rows_roundtrip(seed):
    def roundtrip(name, row):
        f = get_latent_format(name)
        assert torch.equal(f.encode(*f.decode(row).split([512, 64], -1)), row)

    roundtrip("fp8_e4m3", without_e4m3_nan(random_bytes(seed, 576)))
    bf16 = random_bytes(seed, 1152).view(torch.int16)
    nan = (bf16 & 0x7F80) == 0x7F80
    roundtrip("bf16", torch.where(nan, bf16 & ~0x0100, bf16).view(torch.uint8))
    # nvfp4_ds_mla: each block's first element at magnitude code 7 (6 * scale) is canonical;
    # scales are positive, non-zero e4m3 codes.
    packed = random_bytes(seed, 256)
    packed[:, ::8] |= 0x7
    scales = without_e4m3_nan(random_bytes(seed + 1, 32)) & 0x7F
    scales = torch.where(scales == 0, torch.ones_like(scales), scales)
    rope = without_e4m3_nan(random_bytes(seed + 2, 64))
    roundtrip("nvfp4_ds_mla", torch.cat((packed, rope, scales), -1))


def test_decode_reads_strided_paged_views(gen):
    nope, rope = sample(gen, 6)
    f = get_latent_format("fp8_ds_mla")
    packed = torch.zeros(3, 2 * 656 + 40, dtype=torch.uint8)  # block stride > block_size * row
    cache = packed[:, : 2 * 656].unflatten(1, (2, 656))
    for slot in range(6):
        cache[slot // 2, slot % 2] = f.encode(nope[slot : slot + 1], rope[slot : slot + 1])[0]
    assert torch.equal(f.decode(cache).reshape(6, 576), f.decode(f.encode(nope, rope)))


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (
            lambda: get_latent_format("bf16").encode(torch.ones(2, 500), torch.ones(2, 64)),
            "nope [T, 512] and rope [T, 64]",
        ),
        (
            lambda: get_latent_format("bf16").encode(torch.ones(2, 512), torch.ones(3, 64)),
            "nope [T, 512] and rope [T, 64]",
        ),
        (
            lambda: get_latent_format("fp8_ds_mla").decode(torch.zeros(2, 576, dtype=torch.uint8)),
            "[T, 656]",
        ),
        (lambda: get_latent_format("fp8_ds_mla").decode(torch.zeros(2, 656)), "uint8"),
        (
            lambda: get_latent_format("nvfp4_ds_mla").encode(
                torch.ones(2, 512, dtype=torch.int8), torch.ones(2, 64)
            ),
            "[T, 512]",
        ),
        (
            lambda: get_latent_format("fp8_ds_mla").decode(
                torch.zeros(1, 656, dtype=torch.uint8), scale=2.0
            ),
            "fp8_e4m3",
        ),
    ],
)
def test_bad_input_names_the_expected_shape(call, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        call()


def test_nan_nope_poisons_only_its_tile():
    nope = torch.ones(1, 512)
    nope[0, 3] = math.nan
    f = get_latent_format("fp8_ds_mla")
    back = f.decode(f.encode(nope, torch.ones(1, 64)))
    assert bool(back[0, :128].isnan().all()) and not bool(back[0, 128:].isnan().any())


def test_spread_values_roundtrip_within_bf16(gen):
    x = spread(gen, 4, 576)
    f = get_latent_format("bf16")
    assert torch.equal(f.decode(f.encode(x[:, :512], x[:, 512:])), x.bfloat16().float())
