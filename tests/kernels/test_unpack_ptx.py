"""The mxfp4 keys' PTX unpacks (index_key_tiles: e2m1 nibbles to e4m3 codes by byte permutes),
run instruction by instruction by a small PTX emulator over every byte value in every position,
against e4m3 codes from torch's own float8 conversion of the e2m1 values. The CPU interpreter
never runs inline assembly, so this is where the asm's logic is checked off the GPU; the GPU
tests (test_gpu_kernels.py) run it compiled.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from hwrun.kernels.triton import index_key_tiles as tiles

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e4m3_of_e2m1(codes: np.ndarray, shift: np.ndarray | int = 0) -> np.ndarray:
    """uint8 e4m3 codes of e2m1 ``codes`` (4 bits) times 2^-shift, by torch's conversion."""
    magnitude = np.array(E2M1)[codes & 7] * np.exp2(-np.asarray(shift, dtype=np.float64))
    values = np.where(codes & 8, -magnitude, magnitude)
    e4m3 = torch.from_numpy(values.astype(np.float32)).to(torch.float8_e4m3fn)
    return e4m3.view(torch.uint8).numpy()


def _prmt(a, b, c):
    """PTX prmt.b32 (generic mode): byte i of the result is byte (c >> 4i) & 7 of {b, a}, or,
    with bit 3 of that nibble set, that byte's sign bit replicated."""
    source = np.stack([(x >> (8 * i)) & 0xFF for x in (a, b) for i in range(4)], -1)
    out = np.zeros_like(a)
    for i in range(4):
        nibble = (c >> (4 * i)) & 0xF
        byte = np.take_along_axis(source, (nibble & 7)[..., None].astype(np.int64), -1)[..., 0]
        byte = np.where(nibble & 8, np.where(byte & 0x80, 0xFF, 0), byte)
        out |= byte.astype(np.uint64) << np.uint64(8 * i)
    return out


_OPS = {
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "shl": lambda a, b: (a << b) & 0xFFFFFFFF,
    "shr": lambda a, b: a >> b,
    "mul.hi": lambda a, b: (a * b) >> np.uint64(32),  # u32: both operands below 2^32
    "sub": lambda a, b: (a - b) & 0xFFFFFFFF,
}


def _run_ptx(asm: str, inputs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Run ``asm`` (tl.inline_asm_elementwise's body: $n operands, .reg declarations, the ops
    the unpacks use) over uint64 arrays holding 32-bit values; returns every $n it wrote."""
    regs: dict[str, np.ndarray] = {f"${n}": v.astype(np.uint64) for n, v in inputs.items()}

    def value(token: str) -> np.ndarray:
        if token in regs:
            return regs[token]
        return np.uint64(int(token, 0))

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        name = ".".join(op.split(".")[:2]) if op.startswith("mul.hi") else op.split(".")[0]
        dst, *srcs = (t.strip() for t in rest.split(","))
        args = [value(t) for t in srcs]
        if name == "mov":
            regs[dst] = args[0] + np.zeros_like(next(iter(inputs.values())), dtype=np.uint64)
        elif name == "prmt":
            regs[dst] = _prmt(*(np.broadcast_to(x, regs["$2"].shape) for x in args))
        else:
            regs[dst] = _OPS[name](*args)
    return {int(k[1:]): v for k, v in regs.items() if re.fullmatch(r"\$\d+", k)}


def _words() -> np.ndarray:
    """Every byte value in every byte position of a word (the other bytes random), and random
    words: uint64 holding 32-bit values."""
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 1 << 32, 4096, dtype=np.uint64)]
    for position in range(4):
        base = rng.integers(0, 1 << 32, 256, dtype=np.uint64) & ~np.uint64(0xFF << (8 * position))
        words.append(base | (np.arange(256, dtype=np.uint64) << np.uint64(8 * position)))
    return np.concatenate(words)


def _bytes(words: np.ndarray) -> np.ndarray:  # [N, 4] uint8, byte 0 first
    return np.stack([(words >> np.uint64(8 * i)) & np.uint64(0xFF) for i in range(4)], -1)


def _elements(words: np.ndarray) -> np.ndarray:  # [N, 8] e2m1 codes in element order
    packed = _bytes(words).astype(np.int64)
    return np.stack([packed & 15, packed >> 4], -1).reshape(len(words), 8)


def test_nibble_unpack_gives_low_then_high_nibbles_of_each_byte():
    words = _words()
    out = _run_ptx(tiles._UNPACK_ASM.value, {2: words})
    elements = _e4m3_of_e2m1(_elements(words)).reshape(len(words), 4, 2)
    assert np.array_equal(_bytes(out[0]), elements[:, :, 0])
    assert np.array_equal(_bytes(out[1]), elements[:, :, 1])


@pytest.mark.parametrize("shift", range(tiles.MAX_FOLD.value + 1))
def test_lowered_unpack_scales_each_code_by_the_groups_power_of_two(shift):
    words = _words()
    lowered = np.full_like(words, 0x01010101 * shift * 8)
    out = _run_ptx(tiles._UNPACK_LOWERED_ASM.value, {2: words, 3: lowered})
    elements = _e4m3_of_e2m1(_elements(words), shift).reshape(len(words), 4, 2)
    assert np.array_equal(_bytes(out[0]), elements[:, :, 0])
    assert np.array_equal(_bytes(out[1]), elements[:, :, 1])


@pytest.mark.parametrize("shift", range(tiles.MAX_FOLD.value + 1))
def test_natural_order_unpack_of_the_gluon_kernel(shift):
    """hwrun_nvidia.gluon_paged_logits' unpack: 4 packed bytes to the e4m3 codes of their 8
    elements in element order (elements 0-3, then 4-7), with the tables lowered as the kernel
    lowers them for a group ``shift`` below the key's largest."""
    gluon_logits = pytest.importorskip("hwrun_nvidia.gluon_paged_logits")
    words = _words()
    # _lowered_tables: one multiply-add each (0x08080800: the zero code's byte kept)
    low = np.full_like(words, (gluon_logits.TABLE_LOW.value - shift * 0x08080800) & 0xFFFFFFFF)
    high = np.full_like(words, (gluon_logits.TABLE_HIGH.value - shift * 0x08080808) & 0xFFFFFFFF)
    out = _run_ptx(gluon_logits.UNPACK_NATURAL_ASM.value, {2: words, 3: low, 4: high})
    elements = _e4m3_of_e2m1(_elements(words), shift)
    assert np.array_equal(_bytes(out[0]), elements[:, :4])
    assert np.array_equal(_bytes(out[1]), elements[:, 4:])
