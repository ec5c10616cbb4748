"""A weight tensor that carries its storage format: the type MoE experts (and their loader) pass.

Formats (the codecs are ``hwrun.formats``; docs/moe.md lists the layouts):

| format | ``data`` | ``scales`` | ``tensor_scale`` |
|---|---|---|---|
| ``bf16`` | bf16 ``[.., R, C]`` | none | none |
| ``fp8_block128`` | e4m3 uint8 ``[.., R, C]`` | fp32 ``[.., ceil(R/128), ceil(C/128)]`` | none |
| ``fp8_block128_ue8m0`` | as above | e8m0 codes uint8, same shape | none |
| ``mxfp4`` | packed e2m1 uint8 ``[.., R, C/2]`` | e8m0 uint8 ``[.., R, C/32]`` | none |
| ``nvfp4`` | packed e2m1 uint8 ``[.., R, C/2]`` | e4m3 uint8 ``[.., R, C/16]`` | fp32 ``[..]`` |
| ``int4_g128`` | packed int4 uint8 ``[.., R, C/2]`` | fp32 ``[.., R, C/128]`` | none |

``..`` is an optional leading expert dimension E. C is the reduction dimension of the GEMM the
weight feeds (D for ``w13``, I for ``w2``), so every per-row group runs along it. NVFP4 keeps one
tensor scale per expert, as NVFP4 checkpoints do (one global scale per expert weight).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from hwrun.formats.e8m0 import decode_e8m0, encode_e8m0
from hwrun.formats.fp8 import dequantize_fp8_block128, quantize_fp8_block128
from hwrun.formats.int4 import dequantize_int4_g128, quantize_int4_g128
from hwrun.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from hwrun.formats.nvfp4 import dequantize_nvfp4, quantize_nvfp4

# Format -> the multiple the last (reduction) dimension C must be.
WEIGHT_FORMATS: dict[str, int] = {
    "bf16": 1,
    "fp8_block128": 1,
    "fp8_block128_ue8m0": 1,
    "mxfp4": 32,
    "nvfp4": 16,
    "int4_g128": 128,
}
FP8_BLOCK = 128


def check_format(format: str, name: str) -> None:
    if format not in WEIGHT_FORMATS:
        raise ValueError(
            f"{name}: unknown weight format {format!r}; known formats: {', '.join(WEIGHT_FORMATS)}"
        )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _expected_parts(format: str, shape: tuple[int, ...]) -> dict[str, tuple[tuple, torch.dtype]]:
    """The shape and dtype of each stored tensor of a weight of logical ``shape``."""
    *lead, rows, cols = shape
    lead = tuple(lead)
    if format == "bf16":
        return {"data": ((*lead, rows, cols), torch.bfloat16)}
    if format.startswith("fp8_block128"):
        scale_dtype = torch.uint8 if format.endswith("ue8m0") else torch.float32
        tiles = (*lead, _ceil_div(rows, FP8_BLOCK), _ceil_div(cols, FP8_BLOCK))
        return {"data": ((*lead, rows, cols), torch.uint8), "scales": (tiles, scale_dtype)}
    packed = ((*lead, rows, cols // 2), torch.uint8)
    if format == "mxfp4":
        return {"data": packed, "scales": ((*lead, rows, cols // 32), torch.uint8)}
    if format == "nvfp4":
        return {
            "data": packed,
            "scales": ((*lead, rows, cols // 16), torch.uint8),
            "tensor_scale": (lead, torch.float32),
        }
    return {"data": packed, "scales": ((*lead, rows, cols // 128), torch.float32)}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    """A ``[R, C]`` or ``[E, R, C]`` weight in one of :data:`WEIGHT_FORMATS`.

    ``name`` is what errors call it (a checkpoint tensor name, or ``w13``). Construction checks
    every stored tensor against ``shape`` and raises ValueError naming the expected shape.
    """

    format: str
    shape: tuple[int, ...]  # logical [R, C] or [E, R, C]
    data: torch.Tensor
    scales: torch.Tensor | None = None
    tensor_scale: torch.Tensor | None = None
    name: str = "weight"

    def __post_init__(self) -> None:
        check_format(self.format, self.name)
        shape = tuple(int(s) for s in self.shape)
        object.__setattr__(self, "shape", shape)
        multiple = WEIGHT_FORMATS[self.format]
        if len(shape) not in (2, 3) or min(shape) < 1 or shape[-1] % multiple:
            raise ValueError(
                f"{self.name}: a {self.format} weight must be [R, C] or [E, R, C] with C a "
                f"multiple of {multiple}, got shape {list(shape)}"
            )
        expected = _expected_parts(self.format, shape)
        for part in ("data", "scales", "tensor_scale"):
            tensor = getattr(self, part)
            if part not in expected:
                if tensor is not None:
                    raise ValueError(f"{self.name}: a {self.format} weight has no {part}")
                continue
            want_shape, want_dtype = expected[part]
            if tensor is None or tuple(tensor.shape) != want_shape or tensor.dtype != want_dtype:
                got = "none" if tensor is None else f"{tensor.dtype} {list(tensor.shape)}"
                raise ValueError(
                    f"{self.name}: {self.format} {part} of a {list(shape)} weight must be "
                    f"{want_dtype} {list(want_shape)}, got {got}"
                )

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored tensors (what a device would keep resident)."""
        parts = (self.data, self.scales, self.tensor_scale)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def expert(self, index: int) -> QuantizedWeight:
        """The ``[R, C]`` weight of expert ``index`` of an ``[E, R, C]`` weight (views, no copy)."""
        if len(self.shape) != 3:
            raise ValueError(f"{self.name}: expert() needs an [E, R, C] weight, got {self.shape}")
        return QuantizedWeight(
            self.format,
            self.shape[1:],
            self.data[index],
            None if self.scales is None else self.scales[index],
            None if self.tensor_scale is None else self.tensor_scale[index],
            name=f"{self.name}[{index}]",
        )

    def dequantize(self) -> torch.Tensor:  # [*shape] float32
        """The weight's values in fp32, decoded exactly by ``hwrun.formats``."""
        if len(self.shape) == 3 and self.format not in ("bf16", "mxfp4"):
            out = torch.empty(self.shape, dtype=torch.float32, device=self.device)
            for e in range(self.shape[0]):
                out[e] = self.expert(e).dequantize()
            return out
        if self.format == "bf16":
            return self.data.float()
        if self.format == "fp8_block128":
            return dequantize_fp8_block128(self.data, self.scales)
        if self.format == "fp8_block128_ue8m0":
            return dequantize_fp8_block128(self.data, decode_e8m0(self.scales))
        if self.format == "mxfp4":
            return dequantize_mxfp4(self.data, self.scales)
        if self.format == "nvfp4":
            return dequantize_nvfp4(self.data, self.scales, self.tensor_scale)
        return dequantize_int4_g128(self.data, self.scales)


def quantize_weight(
    w: torch.Tensor,  # [R, C] or [E, R, C] float
    format: str,
    name: str = "weight",
) -> QuantizedWeight:
    """Encode ``w`` in ``format``; expert by expert for the formats whose codecs are 2-D or
    whose scale is per tensor (fp8_block128, nvfp4, int4_g128)."""
    check_format(format, name)
    if not w.is_floating_point() or w.dim() not in (2, 3):
        raise ValueError(
            f"{name}: expected a float weight [R, C] or [E, R, C], got {w.dtype} {list(w.shape)}"
        )
    shape = tuple(w.shape)
    multiple = WEIGHT_FORMATS[format]
    if shape[-1] % multiple or min(shape) < 1:
        raise ValueError(
            f"{name}: {format} needs the last dimension C to be a positive multiple of "
            f"{multiple}, got shape {list(shape)}"
        )
    if format == "bf16":
        return QuantizedWeight(format, shape, w.to(torch.bfloat16), name=name)
    if format == "mxfp4":
        return QuantizedWeight(format, shape, *quantize_mxfp4(w), name=name)
    if w.dim() == 3:
        expected = _expected_parts(format, shape)
        parts = {k: torch.empty(s, dtype=d, device=w.device) for k, (s, d) in expected.items()}
        for e in range(shape[0]):
            one = quantize_weight(w[e], format, name)
            parts["data"][e] = one.data
            parts["scales"][e] = one.scales
            if "tensor_scale" in parts:
                parts["tensor_scale"][e] = one.tensor_scale
        return QuantizedWeight(format, shape, name=name, **parts)
    if format.startswith("fp8_block128"):
        codes, scales = quantize_fp8_block128(w, ue8m0=format.endswith("ue8m0"))
        if format.endswith("ue8m0"):
            scales = encode_e8m0(scales)
        return QuantizedWeight(format, shape, codes, scales, name=name)
    if format == "nvfp4":
        packed, scales, tensor_scale = quantize_nvfp4(w)
        return QuantizedWeight(format, shape, packed, scales, tensor_scale.float(), name=name)
    return QuantizedWeight(format, shape, *quantize_int4_g128(w), name=name)


def stack_shared_group(
    routed: QuantizedWeight, shared: QuantizedWeight
) -> tuple[QuantizedWeight, QuantizedWeight]:
    """The routed experts [E, R, C] and a shared group [R, C] of the same format copied into
    one [E + 1, R, C] tensor, returned as views of it (the routed groups, then group E), so
    that a kernel can read both through one tensor descriptor (the Triton MoE's
    ``TileConfig.host_descriptors``). The values are the inputs'."""
    if (
        routed.data.dim() != 3
        or shared.shape != routed.shape[1:]
        or shared.format != routed.format
        or routed.tensor_scale is not None
        or shared.tensor_scale is not None
    ):
        raise ValueError(
            f"stack_shared_group: the shared group must be one [R, C] group of the routed "
            f"experts' format and shape (no tensor scale), got {shared.format} "
            f"{list(shared.shape)} beside {routed.format} {list(routed.shape)}"
        )
    data = torch.cat([routed.data, shared.data[None]])
    scales = None if routed.scales is None else torch.cat([routed.scales, shared.scales[None]])
    experts = routed.shape[0]
    return (
        replace(routed, data=data[:experts], scales=None if scales is None else scales[:experts]),
        replace(shared, data=data[experts], scales=None if scales is None else scales[experts]),
    )
