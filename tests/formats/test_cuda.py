"""The same bytes on a CUDA GPU as on the CPU, for every format (skipped without a GPU).

Run on a GPU machine with ``PYTHONPATH=core python3 -m pytest tests/formats/test_cuda.py``.
"""

import math

import pytest
import torch

from hwrun.formats.catalogue import NUMERIC_FORMATS
from hwrun.formats.index_keys import INDEX_KEY_FORMATS
from hwrun.formats.latent import LATENT_FORMATS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def inputs(rows: int, cols: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 7 + cols)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(
        torch.randint(-12, 13, (rows, cols), generator=g).float()
    )
    x[0] = 0.0
    x[1, : cols // 2] = 2.5
    x[2, :8] = torch.tensor([math.inf, -math.inf, 1e30, -1e-30, 0.25, 0.75, 5.0, -0.0])
    x[3, 3] = math.nan
    return x


def same(cpu: torch.Tensor, gpu: torch.Tensor) -> None:
    gpu = gpu.cpu()
    assert cpu.dtype == gpu.dtype and cpu.shape == gpu.shape
    if cpu.is_floating_point():
        assert torch.equal(torch.isnan(cpu), torch.isnan(gpu))
        keep = ~torch.isnan(cpu)
        assert torch.equal(cpu[keep], gpu[keep])
    else:
        assert torch.equal(cpu, gpu)


@pytest.mark.parametrize("name", list(NUMERIC_FORMATS))
def test_numeric_formats(name):
    f = NUMERIC_FORMATS[name]
    x = inputs(256, 512)
    if name == "int4_g128":
        x = torch.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)  # int4 refuses non-finite
    cpu, gpu = f.encode(x), f.encode(x.cuda())
    for c, g in zip(cpu, gpu, strict=True):
        same(c, g)
    same(f.decode(*cpu), f.decode(*gpu))


@pytest.mark.parametrize("name", list(LATENT_FORMATS))
def test_latent_rows(name):
    f = LATENT_FORMATS[name]
    x = inputs(64, 576)
    cpu = f.encode(x[:, :512], x[:, 512:])
    gpu = f.encode(x[:, :512].cuda(), x[:, 512:].cuda())
    same(cpu, gpu)
    same(f.decode(cpu), f.decode(gpu))


@pytest.mark.parametrize("name", list(INDEX_KEY_FORMATS))
def test_index_keys(name):
    f = INDEX_KEY_FORMATS[name]
    x = inputs(64, 128)
    cpu, gpu = f.encode(x), f.encode(x.cuda())
    for c, g in zip(cpu, gpu, strict=True):
        same(c, g)
    same(f.decode(*cpu), f.decode(*gpu))
