"""A fake ``aiter`` package: AITER's public signatures and documented layouts computed with torch
on CPU, so the AMD adapters' conversions are checked here (a wrong one fails).

What each fake reproduces (from AITER's source, ROCm/aiter):

- fp8 operands are read as the architecture reads them: on gfx942 the matrix units take every
  fp8 byte as FNUZ, whatever the torch dtype says. ``fp8_mqa_logits`` at the new module path
  converts non-FNUZ inputs itself (x * 0.5 to FNUZ, scales doubled: AITER since July 2026); at
  the old path (``aiter.ops.triton.fp8_mqa_logits``, until January 2026) it does not.
- ragged logits: ``relu(q.k * kv_scale)`` weighted over heads, rows of a buffer padded to 256
  columns, -inf outside ``[cu_starts, cu_ends)``; head count and dim powers of two (asserted).
- paged logits: ``[blocks, block, 1, 132]`` cache, a block's keys then its fp32 scales, row
  ``b * next_n + j`` seeing ``context_lens[b] - next_n + j + 1`` positions; positions past it
  are left as they were.
- top-k: prefill writes ``i + rowStart`` (the column in the logits row), decode rows start at
  0 with ``seqLens[r // next_n] - next_n + r % next_n + 1`` entries, -1 past a short row, the
  row order by descending value; ``stride1`` is ignored (unit column stride assumed).
- ``indexer_k_quant_and_cache``: ``[blocks, block, stride]`` cache, int64 slots, scale
  ``max(amax, 1e-4) / fp8_max`` (ue8m0: ``2^ceil(log2)``), elements ``k * (1 / scale)`` in the
  cache's fp8 type (FNUZ, max 240, on gfx942), keys row-major or in 16x16 tiles (preshuffle).
- ``mla_decode_fwd``: see :meth:`FakeAiter.mla_decode_fwd`.
- ``fused_moe`` (SiLU, per-1x32, fp4 weights): weights and scales read in the layouts
  ``shuffle_weight(layout=(16, 16))`` and ``e8m0_shuffle`` produce (copied from AITER), tokens
  and the intermediate quantized to MXFP4 with AITER's activation rule (the amax bits
  ``+ 0x200000`` masked to a power of two, ``floor(log2) - 2``), expert ids 0..E-1 only.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

import torch

from hwrun.formats.e2m1 import decode_e2m1, encode_e2m1
from hwrun.formats.e4m3fnuz import decode_e4m3fnuz
from hwrun.formats.mxfp4 import dequantize_mxfp4

FNUZ = torch.float8_e4m3fnuz
SILU, PER_1X32 = "Silu", "per_1x32"


def shuffle_weight(x: torch.Tensor, layout=(16, 16)) -> torch.Tensor:
    """AITER's ``shuffle_weight`` for 1-byte elements: 16-row x 32-byte tiles of 16-byte runs."""
    rows_in, k_in = layout
    bk, k = k_in * 2, 16 // x.element_size()
    tiles = x.view(-1, x.shape[-2] // rows_in, rows_in, x.shape[-1] // bk, bk // k, k)
    out = tiles.permute(0, 1, 3, 4, 2, 5).contiguous().view(*x.shape)
    out.is_shuffled = True
    return out


def unshuffle_weight(x: torch.Tensor) -> torch.Tensor:
    tiles = x.view(-1, x.shape[-2] // 16, x.shape[-1] // 32, 2, 16, 16)
    return tiles.permute(0, 1, 4, 2, 3, 5).contiguous().view(*x.shape)


def e8m0_shuffle(scale: torch.Tensor) -> torch.Tensor:
    """AITER's ``shuffle_scale`` (not interleaved): padded to 256 x 8, 32 x 8 tiles permuted."""
    m, n = scale.shape
    padded = torch.empty(-(-m // 256) * 256, -(-n // 8) * 8, dtype=scale.dtype)
    padded[:m, :n] = scale
    sm, sn = padded.shape
    return (
        padded.view(sm // 32, 2, 16, sn // 8, 2, 4)
        .permute(0, 3, 5, 2, 4, 1)
        .contiguous()
        .view(sm, sn)
    )


def e8m0_unshuffle(scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    sm, sn = scale.shape
    tiles = scale.view(sm // 32, sn // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
    return tiles.contiguous().view(sm, sn)[:rows, :cols]


def aiter_mxfp4_roundtrip(x: torch.Tensor) -> torch.Tensor:  # [T, N] -> [T, N] fp32
    """Tokens through AITER's dynamic MXFP4 quantization and back (its scale rule)."""
    blocks = x.float().reshape(x.shape[0], -1, 32)
    bits = blocks.abs().amax(-1).view(torch.int32)
    rounded = ((bits + 0x200000) & -0x800000).view(torch.float32)  # & 0xFF800000
    exponent = (torch.floor(torch.log2(rounded)) - 2).clamp(-127, 127)
    codes = encode_e2m1(blocks * torch.exp2(-exponent)[..., None])
    return (decode_e2m1(codes) * torch.exp2(exponent)[..., None]).reshape(x.shape)


class FakeAiter:
    """One fake AITER release on one architecture; :meth:`install` puts its modules in
    ``sys.modules`` (through a MonkeyPatch, so they leave with the test)."""

    def __init__(self, arch: str = "gfx950", moved_logits: bool = True):
        self.arch = arch
        self.moved_logits = moved_logits  # the MQA-logits modules under ops.triton.attention
        self.fp8 = FNUZ if arch == "gfx942" else torch.float8_e4m3fn
        self.calls: list[str] = []

    # -- fp8 as the hardware reads it

    def read_fp8(self, t: torch.Tensor) -> torch.Tensor:
        """The values the matrix units see for fp8 bytes ``t`` (any 1-byte dtype)."""
        codes = t.contiguous().view(torch.uint8)
        if self.arch == "gfx942":
            return decode_e4m3fnuz(codes)
        return codes.view(torch.float8_e4m3fn).float()

    def to_fp8(self, x: torch.Tensor) -> torch.Tensor:  # saturating cast to the arch's fp8
        top = torch.finfo(self.fp8).max
        return x.float().clamp(-top, top).to(self.fp8)

    # -- indexer

    def fp8_mqa_logits(self, Q, KV, kv_scales, weights, cu_starts, cu_ends, clean_logits=True):
        self.calls.append("fp8_mqa_logits")
        m, heads, dim = Q.shape
        assert heads & (heads - 1) == 0, "num q. heads should be power of 2."
        assert dim & (dim - 1) == 0, "head size should be power of 2."
        if self.moved_logits and self.arch == "gfx942":  # the July 2026 FN -> FNUZ fix
            mul = 1.0
            if Q.dtype != FNUZ:
                Q, mul = (Q.float() * 0.5).to(FNUZ), mul * 2
            if KV.dtype != FNUZ:
                KV, mul = (KV.float() * 0.5).to(FNUZ), mul * 2
            kv_scales = kv_scales.float() * mul
        n = KV.shape[0]
        scores = torch.einsum("mhd,nd->mhn", self.read_fp8(Q), self.read_fp8(KV))
        scores = torch.relu(scores * kv_scales.float()[None, None, :])
        logits = (scores * weights.float()[:, :, None]).sum(1)
        aligned = -(-n // 256) * 256
        out = torch.full((m, aligned), float("-inf"))[:, :n]
        pos = torch.arange(n)
        inside = (pos >= cu_starts[:, None].long()) & (pos < cu_ends[:, None].long())
        out[inside] = logits[inside]
        return out

    def deepgemm_fp8_paged_mqa_logits(
        self, q_fp8, kv_cache, weights, out_logits, context_lens, kv_indices, max_model_len,
        Preshuffle=False, KVBlockSize=1, ChunkK=256, **_tuning,
    ):  # fmt: skip
        self.calls.append("deepgemm_fp8_paged_mqa_logits")
        batch, next_n, _, dim = q_fp8.shape
        _, block, _, index_dim = kv_cache.shape
        assert ChunkK % KVBlockSize == 0 or KVBlockSize % ChunkK == 0
        assert block == KVBlockSize
        assert not Preshuffle, "the fake reads the plain layout only"
        flat = kv_cache.view(-1, block * index_dim)
        keys = self.read_fp8(flat[:, : block * dim].contiguous()).reshape(-1, block, dim)
        scales = flat[:, block * dim :].contiguous().view(torch.float32).reshape(-1, block)
        q = self.read_fp8(q_fp8)
        for b in range(batch):
            for j in range(next_n):
                length = int(context_lens[b]) - next_n + j + 1
                pos = torch.arange(max(length, 0))
                blocks = kv_indices[b, pos // block].long()
                k = keys[blocks, pos % block]  # [L, D]
                s = torch.relu((q[b, j] @ k.T) * scales[blocks, pos % block][None, :])
                out_logits[b * next_n + j, : pos.numel()] = (
                    s * weights[b * next_n + j, :, None]
                ).sum(0)

    def top_k_per_row_prefill(
        self, logits, rowStarts, rowEnds, indices, values, numRows, stride0, stride1, k=2048,
        stable=False,
    ):  # fmt: skip
        self.calls.append("top_k_per_row_prefill")
        self._topk(logits, rowStarts.long(), rowEnds.long(), indices, numRows, stride0, k)

    def top_k_per_row_decode(
        self, logits, next_n, seqLens, indices, numRows, stride0, stride1, k=2048, stable=False,
    ):  # fmt: skip
        self.calls.append("top_k_per_row_decode")
        r = torch.arange(numRows)
        ends = seqLens.long()[r // next_n] - next_n + r % next_n + 1
        self._topk(
            logits, torch.zeros(numRows, dtype=torch.long), ends, indices, numRows, stride0, k
        )

    @staticmethod
    def _topk(logits, starts, ends, indices, rows, stride0, k):
        flat = logits.reshape(-1) if logits.is_contiguous() else logits.flatten()
        for r in range(rows):
            start, length = int(starts[r]), int(ends[r] - starts[r])
            row = flat[r * stride0 + start : r * stride0 + start + length]  # unit stride
            out = torch.full((k,), -1, dtype=torch.int32)
            if length <= k:
                out[:length] = torch.arange(length, dtype=torch.int32) + start
            else:
                out[:] = torch.topk(row, k).indices.to(torch.int32) + start
            indices[r] = out

    def indexer_k_quant_and_cache(
        self, k, kv_cache, slot_mapping, quant_block_size, scale_fmt, preshuffle=False
    ):
        self.calls.append("indexer_k_quant_and_cache")
        assert kv_cache.dim() == 3, "kv_cache is [num_blocks, block_size, cache_stride]"
        assert slot_mapping.dtype == torch.int64, "slot_mapping is read as int64"
        tokens = min(k.shape[0], slot_mapping.shape[0])
        head_dim = k.shape[1]
        block, stride = kv_cache.shape[1], kv_cache.shape[2]
        flat = kv_cache.view(-1)
        fp8_max = torch.finfo(self.fp8).max
        for t in range(tokens):
            slot = int(slot_mapping[t])
            if slot < 0:
                continue
            base = (slot // block) * block * stride
            offset = slot % block
            for col in range(0, head_dim, quant_block_size):
                part = k[t, col : col + quant_block_size].float()
                scale = torch.clamp(part.abs().amax(), min=1e-4) / fp8_max
                if scale_fmt == "ue8m0":
                    scale = torch.exp2(torch.ceil(torch.log2(scale)))
                codes = self.to_fp8(part * (1.0 / scale)).view(torch.uint8)
                cols = torch.arange(col, col + quant_block_size)
                if preshuffle:
                    dst = (
                        base + (offset // 16) * 16 * head_dim + (cols // 16) * 256
                        + (offset % 16) * 16 + cols % 16
                    )  # fmt: skip
                else:
                    dst = base + offset * head_dim + cols
                flat[dst] = codes
                at = base + block * head_dim + (offset * head_dim + col) * 4 // quant_block_size
                flat[at : at + 4] = scale.reshape(1).view(torch.uint8)

    # -- sparse MLA

    def mla_decode_fwd(
        self, q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens,
        max_seqlen_q, page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0,
        return_lse=False, **_rest,
    ):  # fmt: skip
        """Softmax over each request's pages in fp32, natural-log LSE; a request without pages
        gets 0 / 0 (NaN) and -inf, the kernel's arithmetic."""
        self.calls.append("mla_decode_fwd")
        total, heads, dim = q.shape
        assert heads % 16 == 0, f"MLA decode kernels take heads in multiples of 16, got {heads}"
        assert page_size == 1 and nhead_kv == 1 and tuple(kv_buffer.shape[1:]) == (1, 1, dim)
        assert bool((kv_last_page_lens == 1).all())
        value_dim = o.shape[-1]
        lse = torch.empty(total, heads)
        for b in range(qo_indptr.shape[0] - 1):
            rows = slice(int(qo_indptr[b]), int(qo_indptr[b + 1]))
            pages = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
            kv = kv_buffer[pages, 0, 0].float()  # [n, 576]
            scores = (q[rows].float() @ kv.T) * sm_scale  # [m, H, n]
            top = (
                scores.amax(-1, keepdim=True)
                if pages.numel()
                else torch.full((*scores.shape[:-1], 1), float("-inf"))
            )
            weights = torch.exp(scores - top)
            total_weight = weights.sum(-1, keepdim=True)
            o[rows] = ((weights @ kv[:, :value_dim]) / total_weight).to(o.dtype)
            lse[rows] = (top + torch.log(total_weight)).squeeze(-1)
        return o.view(total, heads, value_dim), (lse if return_lse else None)

    # -- MoE

    def fused_moe(
        self, hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None, activation=SILU,
        quant_type=None, doweight_stage1=False, w1_scale=None, w2_scale=None, **_rest,
    ):  # fmt: skip
        self.calls.append("fused_moe")
        assert activation == SILU and quant_type == PER_1X32
        assert topk_ids.dtype == torch.int32 and bool((topk_ids >= 0).all())
        experts_, rows1, half_d = w1.shape
        rows2, half_i = w2.shape[1:]
        w13 = dequantize_mxfp4(
            unshuffle_weight(w1.view(torch.uint8)),
            e8m0_unshuffle(w1_scale, experts_ * rows1, half_d // 16).reshape(experts_, rows1, -1),
        )
        w2_ = dequantize_mxfp4(
            unshuffle_weight(w2.view(torch.uint8)),
            e8m0_unshuffle(w2_scale, experts_ * rows2, half_i // 16).reshape(experts_, rows2, -1),
        )
        a = aiter_mxfp4_roundtrip(hidden_states)
        out = torch.zeros(hidden_states.shape, dtype=torch.float32)
        for t in range(a.shape[0]):
            for j in range(topk_ids.shape[1]):
                e = int(topk_ids[t, j])
                gate, up = (w13[e] @ a[t]).chunk(2)
                h = aiter_mxfp4_roundtrip((torch.nn.functional.silu(gate) * up)[None])[0]
                out[t] += topk_weight[t, j] * (w2_[e] @ h)
        return out.to(hidden_states.dtype)

    # -- installing the modules

    def install(self, monkeypatch) -> None:
        def module(name: str, **attrs) -> types.ModuleType:
            mod = types.ModuleType(name)
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
            mod.__dict__.update(attrs)
            monkeypatch.setitem(sys.modules, name, mod)
            return mod

        top = module(
            "aiter",
            top_k_per_row_prefill=self.top_k_per_row_prefill,
            top_k_per_row_decode=self.top_k_per_row_decode,
            indexer_k_quant_and_cache=self.indexer_k_quant_and_cache,
            dtypes=types.SimpleNamespace(fp8=self.fp8, fp4x2=torch.uint8, bf16=torch.bfloat16),
            ActivationType=types.SimpleNamespace(Silu=SILU),
            QuantType=types.SimpleNamespace(per_1x32=PER_1X32),
        )
        top.__path__ = []  # a package
        for name in ("aiter.ops", "aiter.ops.triton", "aiter.ops.triton.attention"):
            module(name).__path__ = []
        module("aiter.mla", mla_decode_fwd=self.mla_decode_fwd)
        module("aiter.fused_moe", fused_moe=self.fused_moe)
        module("aiter.ops.shuffle", shuffle_weight=shuffle_weight)
        module("aiter.utility").__path__ = []
        module("aiter.utility.fp4_utils", e8m0_shuffle=e8m0_shuffle)
        where = "aiter.ops.triton.attention" if self.moved_logits else "aiter.ops.triton"
        module(f"{where}.fp8_mqa_logits", fp8_mqa_logits=self.fp8_mqa_logits)
        module(
            f"{where}.pa_mqa_logits",
            deepgemm_fp8_paged_mqa_logits=self.deepgemm_fp8_paged_mqa_logits,
        )
