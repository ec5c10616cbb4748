"""Reference Kimi Delta Attention (`kda.step`, `kda.chunk`): gated delta rule, per-channel decay.

Conventions follow fla's ``naive_recurrent_kda`` (the oracle) and ``chunk_kda`` with its
defaults, so adapters stay thin:

- ``q``, ``k`` are used as given: no L2 norm inside (fla's ``use_qk_l2norm_in_kernel=False``).
  A layer that normalizes them (Kimi Linear does) applies the norm before calling.
- ``g`` is the log-space decay per value head and key channel, already computed
  (``use_gate_in_kernel=False``); ``beta`` is already in (0, 1) (no sigmoid inside).
- ``scale`` multiplies q; None means ``K ** -0.5``.
- grouped values: ``HV`` is a multiple of ``H``; value head ``v`` reads q/k head ``v // (HV // H)``.
- state ``[B, HV, K, V]`` fp32; the output ``o`` has v's dtype.

Per token ``t`` and value head: ``S <- exp(g_t)[:, None] * S``;
``S <- S + beta_t * k_t (v_t - S^T k_t)^T``; ``o_t = (scale * q_t)^T S``.
:func:`chunk` computes the same in blocks of ``chunk_size`` tokens (the WY / UT form).
"""

from __future__ import annotations

import torch

from hwrun.ops.contract import OpContract
from hwrun.registry import OpSpec

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _prepare(q, k, v, g, beta, state, scale):
    """Validate, cast to fp32 and expand q/k to the value heads."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, H, K]; got {list(q.shape)}, {list(k.shape)}")
    batch, tokens, heads, key_dim = q.shape
    if v.dim() != 4 or v.shape[:2] != (batch, tokens):
        raise ValueError(f"v must be [B={batch}, T={tokens}, HV, V], got {list(v.shape)}")
    value_heads, value_dim = v.shape[2], v.shape[3]
    if heads == 0 or value_heads % heads != 0:
        raise ValueError(f"HV={value_heads} value heads must be a multiple of H={heads}")
    if g.shape != (batch, tokens, value_heads, key_dim):
        raise ValueError(
            f"g must be [B, T, HV, K] = {[batch, tokens, value_heads, key_dim]}, "
            f"got {list(g.shape)}"
        )
    if beta.shape != (batch, tokens, value_heads):
        raise ValueError(
            f"beta must be [B, T, HV] = {[batch, tokens, value_heads]}, got {list(beta.shape)}"
        )
    state_shape = (batch, value_heads, key_dim, value_dim)
    if state is None:
        state = torch.zeros(state_shape, dtype=torch.float32, device=q.device)
    elif state.shape != state_shape or state.dtype != torch.float32:
        raise ValueError(
            f"state must be float32 {list(state_shape)}, got {state.dtype} {list(state.shape)}"
        )
    if scale is None:
        scale = key_dim**-0.5
    group = value_heads // heads

    def fresh(x: torch.Tensor) -> torch.Tensor:  # fp32, contiguous: sums see one layout
        return x.float().clone(memory_format=torch.contiguous_format)

    qf = fresh(q).repeat_interleave(group, dim=2) * scale  # [B, T, HV, K]
    kf = fresh(k).repeat_interleave(group, dim=2)
    return qf, kf, fresh(v), fresh(g), fresh(beta), fresh(state)


def step(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, HV, V]
    g: torch.Tensor,  # [B, T, HV, K] log-space decay per channel
    beta: torch.Tensor,  # [B, T, HV]
    state: torch.Tensor | None,  # [B, HV, K, V] float32 (None: zeros)
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # o [B, T, HV, V] v.dtype, new state [B, HV, K, V] fp32
    """KDA token by token (decode, and the definition). The input state is not modified."""
    qf, kf, vf, gf, bf, s = _prepare(q, k, v, g, beta, state, scale)
    out = torch.empty(vf.shape, dtype=torch.float32, device=vf.device)
    for t in range(qf.shape[1]):
        s = s * torch.exp(gf[:, t])[..., None]
        k_t = kf[:, t]  # [B, HV, K]
        predicted = (k_t[..., None] * s).sum(-2)  # S^T k: [B, HV, V]
        delta = bf[:, t][..., None] * (vf[:, t] - predicted)
        s = s + k_t[..., None] * delta[..., None, :]
        out[:, t] = (qf[:, t][..., None] * s).sum(-2)
    return out.to(v.dtype), s


def _chunk_block(qc, kc, vc, gc, bc, s):
    """One chunk of C tokens. All inputs [B, HV, C, ...] fp32; s [B, HV, K, V]."""
    cum = gc.cumsum(dim=2)  # G_t: decay from the chunk start through token t, [B, HV, C, K]
    length = qc.shape[2]
    # decay[t, i] = exp(G_t - G_i): what k_i's contribution has decayed by when token t reads.
    decay = torch.exp(cum[:, :, :, None, :] - cum[:, :, None, :, :])  # [B, HV, C, C, K]
    lower = torch.tril(torch.ones(length, length, dtype=torch.bool, device=qc.device), -1)
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=qc.device))
    decay_k = torch.where(lower[..., None], decay, 0.0) * kc[:, :, None, :, :]
    a_kk = (kc[:, :, :, None, :] * decay_k).sum(-1)  # [B, HV, C, C], strictly lower
    # delta_t = beta_t (v_t - (exp(G_t) k_t)^T S0 - sum_{i<t} a_kk[t, i] delta_i): forward
    # substitution of the unit lower-triangular system, one token at a time.
    start_read = ((torch.exp(cum) * kc)[..., None] * s[:, :, None]).sum(-2)  # [B, HV, C, V]
    rhs = vc - start_read
    deltas = []
    for t in range(length):
        acc = rhs[:, :, t]
        if t:
            prev = torch.stack(deltas, dim=2)  # [B, HV, t, V]
            acc = acc - (a_kk[:, :, t, :t, None] * prev).sum(-2)
        deltas.append(bc[:, :, t, None] * acc)
    delta = torch.stack(deltas, dim=2)  # [B, HV, C, V]
    decay_qk = torch.where(causal[..., None], decay, 0.0) * kc[:, :, None, :, :]
    a_qk = (qc[:, :, :, None, :] * decay_qk).sum(-1)  # [B, HV, C, C], lower incl. diagonal
    from_start = ((torch.exp(cum) * qc)[..., None] * s[:, :, None]).sum(-2)
    out = from_start + (a_qk[..., None] * delta[:, :, None]).sum(-2)
    last = cum[:, :, -1]  # [B, HV, K]
    carried = (torch.exp(last[:, :, None, :] - cum) * kc)[..., None] * delta[:, :, :, None, :]
    new_s = torch.exp(last)[..., None] * s + carried.sum(2)
    return out, new_s


def chunk(
    q: torch.Tensor,  # [B, T, H, K]
    k: torch.Tensor,  # [B, T, H, K]
    v: torch.Tensor,  # [B, T, HV, V]
    g: torch.Tensor,  # [B, T, HV, K] log-space decay per channel
    beta: torch.Tensor,  # [B, T, HV]
    state: torch.Tensor | None,  # [B, HV, K, V] float32 (None: zeros)
    scale: float | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:  # o [B, T, HV, V] v.dtype, final state fp32
    """KDA over ``T`` tokens in chunks (prefill). Equals :func:`step` up to fp32 rounding.

    ``T`` need not be a multiple of ``chunk_size``: the last chunk is shorter.
    """
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    qf, kf, vf, gf, bf, s = _prepare(q, k, v, g, beta, state, scale)
    # Work head-major: [B, HV, T, ...].
    qf, kf, vf, gf = (x.transpose(1, 2) for x in (qf, kf, vf, gf))
    bf = bf.transpose(1, 2)
    outs = []
    for start in range(0, qf.shape[2], chunk_size):
        piece = slice(start, start + chunk_size)
        out, s = _chunk_block(
            qf[:, :, piece], kf[:, :, piece], vf[:, :, piece], gf[:, :, piece], bf[:, :, piece], s
        )
        outs.append(out)
    if outs:
        out = torch.cat(outs, dim=2).transpose(1, 2)
    else:
        out = torch.empty(vf.transpose(1, 2).shape, dtype=torch.float32, device=vf.device)
    return out.to(v.dtype), s


def _validate(spec: OpSpec) -> list[str]:
    if spec.dtype is not None and spec.dtype not in ("float32", "bfloat16", "float16"):
        return [f"q/k/v must be float32, bfloat16 or float16, got {spec.dtype}"]
    return []


_SPEC = {"dtype": "bfloat16", "num_heads": 32, "head_dim": 128}
CONTRACTS: list[OpContract] = [
    OpContract(
        name="kda.step",
        summary="Kimi Delta Attention token by token (fla naive_recurrent_kda), fp32 state",
        reference=step,
        default_spec=OpSpec(op="kda.step", **_SPEC),
        reference_validate=_validate,
    ),
    OpContract(
        name="kda.chunk",
        summary="Kimi Delta Attention in chunks of 64 tokens; equals kda.step",
        reference=chunk,
        default_spec=OpSpec(op="kda.chunk", **_SPEC),
        reference_validate=_validate,
    ),
]
