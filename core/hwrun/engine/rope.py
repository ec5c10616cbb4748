"""Rotary position embedding of DeepSeek-V3.2: plain RoPE or YaRN, over the 64-dim rope slice.

Two layouts share one frequency table (as in DeepSeek's and transformers' code):

- MLA (queries and the latent's rope part) rotates *interleaved* pairs ``(x0, x1), (x2, x3)...``
  and returns them de-interleaved (``[evens rotated | odds rotated]``), as transformers'
  ``apply_rotary_pos_emb_interleave`` does; queries and keys get the same permutation, so their
  dot products are those of the interleaved rotation.
- The DSA indexer rotates the two *halves* of its first 64 dims (``rotate_half``).
"""

from __future__ import annotations

import math

import torch

from hwrun.engine.model_config import ROPE_DIM, RopeConfig, yarn_mscale


def inverse_frequencies(rope: RopeConfig, dim: int = ROPE_DIM) -> tuple[torch.Tensor, float]:
    """``inv_freq [dim/2]`` fp32 and the factor cos and sin are multiplied by (YaRN's mscale)."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    if rope.kind == "default":
        return 1.0 / (rope.theta**exponents), 1.0
    pos_freqs = rope.theta**exponents
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    original = rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # YaRN's guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (high frequencies), 0: interpolate
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    if rope.mscale and rope.mscale_all_dim:
        scaling = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(
            rope.factor, rope.mscale_all_dim
        )
    else:
        scaling = yarn_mscale(rope.factor)
    return inv_freq, float(scaling)


class RotaryEmbedding:
    """cos / sin of given positions, and the two rotations of the model."""

    def __init__(self, rope: RopeConfig, device: torch.device | str):
        inv_freq, self.scaling = inverse_frequencies(rope)
        self.inv_freq = inv_freq.to(device)

    def cos_sin(
        self,
        positions: torch.Tensor,  # [T] int
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # cos, sin [T, 64] (freqs repeated twice)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)


def rotate_interleaved(
    x: torch.Tensor,  # [T, ..., 64]
    cos: torch.Tensor,  # [T, 64]
    sin: torch.Tensor,  # [T, 64]
) -> torch.Tensor:  # [T, ..., 64]: [evens rotated | odds rotated]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1] // 2,)
    c, s = cos[:, : cos.shape[-1] // 2].reshape(shape), sin[:, : sin.shape[-1] // 2].reshape(shape)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rotate_halves(
    x: torch.Tensor,  # [T, ..., 64]
    cos: torch.Tensor,  # [T, 64]
    sin: torch.Tensor,  # [T, 64]
) -> torch.Tensor:  # [T, ..., 64]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    c, s = cos.reshape(shape), sin.reshape(shape)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s
