"""The model's plain-torch pieces between op calls, as functions torch.compile can fuse.

Between its op calls a decode layer ran ~130 small torch kernels on CUDA (norms, RoPE halves,
concatenations, casts): on the H200 ~4 ms of a 15 ms batch-64 step, and each node of a replayed
CUDA graph adds a launch gap. With ``compiled=True`` each function below goes through
``torch.compile`` (inductor fuses it into one or a few Triton kernels; dynamic in the row count
after the second count it sees, so a few compiles serve every batch bucket and prefill). The
functions are plain torch: on CPU, in batch-invariant mode and with ``HWRUN_TORCH_COMPILE=0``
they run eagerly, as written.

Compiled, an intermediate that eager torch rounds to bf16 may stay fp32 inside a fused kernel
(inductor's default), so bits differ from the eager functions by bf16 roundings; the engine's
GPU tests bound that against the CPU reference run.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from hwrun.engine.model_config import LATENT_RANK, ROPE_DIM
from hwrun.engine.rope import rotate_halves, rotate_interleaved
from hwrun.ops.indexer import INDEX_HEAD_DIM

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def add_rms_norm(
    h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after adding ``delta``, and its norm (the next block's input)."""
    h = h + delta
    return h, rms_norm(h, weight, eps)


def mla_query_rope(
    q_mla: torch.Tensor,  # [T, H, 576]: columns [0, 512) hold the absorbed NoPE part
    q_rope: torch.Tensor,  # [T, H, 64]
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> None:
    """The MLA query's RoPE part, rotated, written into its last 64 columns."""
    q_mla[..., LATENT_RANK:] = rotate_interleaved(q_rope, cos, sin)


def latent_and_key_rope(
    compressed: torch.Tensor,  # [T, 576] = kv_a_proj(x)
    norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # latent [T, 512], rotated k_rope [T, 64]
    latent = rms_norm(compressed[:, :LATENT_RANK], norm_weight, eps)
    return latent, rotate_interleaved(compressed[:, LATENT_RANK:], cos, sin)


def index_query(
    q: torch.Tensor,  # [T, Hi, 128]
    weights: torch.Tensor,  # [T, Hi] float32 head weights
    cos: torch.Tensor,
    sin: torch.Tensor,
    fp8: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # the query (rotated; e4m3 codes when fp8), weights
    q = torch.cat([rotate_halves(q[..., :ROPE_DIM], cos, sin), q[..., ROPE_DIM:]], dim=-1)
    if not fp8:
        return q, weights
    # e4m3 codes with one scale per (token, head), folded into the head weights as
    # ops.indexer.fold_q_scale defines (without its positivity check, a host read that graph
    # capture forbids: the scale is clamped above zero here).
    scale = q.float().abs().amax(-1).clamp_min(1e-30) / FP8_MAX
    codes = (q.float() / scale[..., None]).to(torch.float8_e4m3fn)
    return codes, weights * scale


def index_key(
    k: torch.Tensor,  # [T, 128] = wk(x)
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> torch.Tensor:  # [T, 128]
    k = F.layer_norm(k, (INDEX_HEAD_DIM,), norm_weight, norm_bias, eps)
    return torch.cat([rotate_halves(k[:, :ROPE_DIM], cos, sin), k[:, ROPE_DIM:]], dim=-1)


class ModelFunctions:
    """The functions above, compiled or as written."""

    def __init__(self, compiled: bool):
        self.compiled = compiled

        # Not dynamic=True: that makes every size symbolic, the 4096-wide norm's too, and
        # inductor's generic reductions took 26 us per norm at 64 rows on the H200. By default
        # the first call (the largest decode bucket) compiles static and the next row count
        # recompiles with only the row count symbolic.
        def wrap(fn):
            return torch.compile(fn) if compiled else fn

        # The one function called at two widths (the hidden size and q-LoRA's) compiles once per
        # width, as its own code object: one compiled function seeing both makes the width
        # symbolic too (automatic dynamic), and its generic looped reduction took 8.5 us per
        # norm at 64 rows on the H200 (49 a step), where a static width runs in ~2 us.
        self.rms_norm = _per_width(rms_norm) if compiled else rms_norm
        self.add_rms_norm = wrap(add_rms_norm)
        self.mla_query_rope = wrap(mla_query_rope)
        self.latent_and_key_rope = wrap(latent_and_key_rope)
        self.index_query = wrap(index_query)
        self.index_key = wrap(index_key)


def _per_width(fn):
    """``fn(x, ...)`` through a separate ``torch.compile`` per ``x.shape[-1]``. Dynamo keeps
    its caches and its automatic-dynamic record per code object (and name), so each width gets
    a renamed copy of ``fn``'s code."""
    compiled: dict[int, object] = {}

    def call(x: torch.Tensor, *args):
        width = x.shape[-1]
        if width not in compiled:
            code = fn.__code__.replace(co_name=f"{fn.__name__}_width_{width}")
            copy = types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__)
            compiled[width] = torch.compile(copy)
        return compiled[width](x, *args)

    return call
