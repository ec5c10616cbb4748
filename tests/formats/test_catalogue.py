import pytest
import torch

from hwrun.formats.catalogue import NUMERIC_FORMATS, get_numeric_format


@pytest.mark.parametrize("name", list(NUMERIC_FORMATS))
def test_declared_sizes_match_the_bytes_the_codec_produces(name):
    f = get_numeric_format(name)
    x = torch.randn(256, 512, generator=torch.Generator().manual_seed(3))
    encoded = f.encode(x)
    stored_bits = sum(t.numel() * t.element_size() * 8 for t in encoded)
    assert stored_bits == x.numel() * f.bits_per_element + f.tensor_scale_bits
    back = f.decode(*encoded)
    assert back.shape == x.shape and back.dtype == torch.float32
    assert bool(((back - x).abs() <= x.abs().amax() / 2).all())


def test_bits_per_element():
    bits = {n: f.bits_per_element for n, f in NUMERIC_FORMATS.items()}
    assert bits["mxfp4"] == 4.25 and bits["nvfp4"] == 4.5 and bits["int4_g128"] == 4.25
    assert bits["fp8_g128"] == 8.25 and bits["fp8_block128"] == 8 + 32 / 16384
    with pytest.raises(ValueError, match="known: e4m3"):
        get_numeric_format("fp6")
