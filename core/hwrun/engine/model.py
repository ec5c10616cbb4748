"""DeepSeek-V3.2 (``DeepseekV32ForCausalLM``) as a graph of hwrun op contracts.

Per layer, for the step's flat token batch (every op below goes through the :class:`OpTable`;
only dense linears, norms and RoPE are plain torch):

1. MLA projections: ``q = q_b(rms(q_a(x)))`` split into NoPE / RoPE parts, the NoPE part absorbed
   into the latent space (``q_nope @ W_UK``), so every head's query is 576 wide; the latent
   ``c = rms(kv_a(x)[:512])`` and its rotated ``k_rope``.
2. ``kv.write_latent`` / ``kv.write_index_keys`` store the new tokens' latent rows and index keys
   in the packed cache, in the configured formats.
3. The DSA indexer's scores: ``indexer.logits_ragged`` for prefill rows (keys gathered from the
   cache into one contiguous run), ``indexer.logits_paged`` for decode rows; ``indexer.topk``
   keeps ``index_topk`` positions per row; ``indexer.to_slots`` turns decode positions into
   cache slots.
4. ``sparse_mla.prefill`` over the gathered, decoded latent rows of each prefill sequence;
   ``sparse_mla.decode`` over the cache slots of each decode row; the 512-wide output is
   projected per head by ``W_UV`` and ``o_proj``.
5. Dense MLP (the first ``first_k_dense_replace`` layers) or MoE: ``moe.route`` (sigmoid scores,
   grouped top-k with correction bias, routed scaling) and ``moe.experts`` (routed + shared).

All per-step metadata arrives in :class:`StepMetadata`; nothing is global. In batch-invariant
mode every dense product and norm runs one row at a time, so a token's bits never depend on
what it is batched with (the op impls promise the same through their own batch invariance).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hwrun import knobs
from hwrun.engine.context_parallel import ContextShard
from hwrun.engine.fused import ModelFunctions
from hwrun.engine.model_config import LATENT_RANK, ROPE_DIM, ModelConfig
from hwrun.engine.op_table import ModelFormats, OpTable
from hwrun.engine.rope import RotaryEmbedding
from hwrun.engine.weights import (
    AttentionWeights,
    DenseMLPWeights,
    IndexerWeights,
    ModelWeights,
    MoEWeights,
)
from hwrun.formats.index_keys import get_index_key_format
from hwrun.formats.latent import get_latent_format
from hwrun.kv.layout import PackedLayout
from hwrun.kv.views import index_key_view, latent_view
from hwrun.ops.indexer import INDEX_HEAD_DIM

NORM_EPS = 1e-6  # q_a / kv_a RMSNorms and the indexer's key LayerNorm (fixed in the model code)


@dataclass(frozen=True)
class NormCodes:
    """How a norm writes its output's e4m3 codes and scales (HWRUN_NORM_QUANTIZE): scales tokens
    first (the linears' layout) or row-major (moe.experts'), powers of two with ue8m0 weights."""

    token_major: bool
    ue8m0: bool


@dataclass(frozen=True, eq=False)
class DecodeRows:
    """Tokens that extend a cached context by one (``indexer.logits_paged`` + sparse decode)."""

    rows: torch.Tensor  # [B] int64, rows of the step's token batch
    block_table: torch.Tensor  # [B, max_blocks] int32, -1 past each request's blocks
    context_lens: torch.Tensor  # [B] int32, cached tokens including this one
    max_context: int

    @functools.cached_property
    def window_starts(self) -> torch.Tensor:  # [B] int32 zeros: indexer.topk's window starts
        """Made once a step, not once a layer (a kernel launch each)."""
        return torch.zeros_like(self.context_lens)


@dataclass(frozen=True, eq=False)
class PrefillRows:
    """Prefill chunks: each sequence's context ``[0, end)`` gathered into one run of keys."""

    rows: torch.Tensor  # [Tp] int64, rows of the step's token batch
    context_slots: torch.Tensor  # [N] int64, cache slots of the gathered context, per chunk
    key_starts: torch.Tensor  # [Tp] int32, where each row's sequence starts in the gathered run
    key_ends: torch.Tensor  # [Tp] int32, one past the row's own position in the gathered run


@dataclass(frozen=True, eq=False)
class StepMetadata:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slots: torch.Tensor  # [T] int32, where each token's KV is written
    # Without prefill rows every row is a decode row, in order (a decode chunk is one token):
    # decode.rows is then 0 .. T-1.
    decode: DecodeRows | None
    prefill: PrefillRows | None
    logit_rows: torch.Tensor  # [R] int64, rows whose logits the step returns


class DeepseekV32:
    """The model's forward over a packed KV cache; holds weights, ops and cache views."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        ops: OpTable,
        formats: ModelFormats,
        layout: PackedLayout,
        cache: torch.Tensor,  # [num_blocks, row_bytes] uint8 from allocate_cache
        batch_invariant: bool = False,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        context: ContextShard | None = None,
    ):
        self.config, self.weights, self.ops, self.formats = config, weights, ops, formats
        # Under tensor parallelism ``config`` and ``weights`` are this rank's shard, and the
        # partial outputs of attention and of the MLP are summed across ranks here.
        self.all_reduce = all_reduce or (lambda x: x)
        # Under decode context parallelism ``cache`` holds this rank's tokens only; ``context``
        # joins the ranks' attention (see context_parallel.py). Default: every token is here.
        self.context = context or ContextShard()
        self.layout = layout
        self.row_by_row = batch_invariant
        self.latent_views = [latent_view(cache, layout, i) for i in range(config.num_layers)]
        self.index_views = [index_key_view(cache, layout, i) for i in range(config.num_layers)]
        self.latent_format = get_latent_format(formats.latent_format)
        self.index_format = get_index_key_format(formats.index_format)
        self.rotary = RotaryEmbedding(config.rope, cache.device)
        self.dtype = weights.embed.dtype
        self.fn = ModelFunctions(
            compiled=cache.device.type == "cuda" and not batch_invariant and knobs.torch_compile()
        )
        # A decode step runs the MLA query and the latent on this second stream while the
        # first runs the indexer (see _fork); None: one stream.
        self.side_stream = None
        if cache.is_cuda and not batch_invariant and knobs.decode_side_stream():
            self.side_stream = torch.cuda.Stream(cache.device)
        # HWRUN_NORM_QUANTIZE: the norms that feed dense.linear_a8w8 write their output's e4m3
        # codes and scales too (kernels/triton/norm_quant.py; tokens first, DeepGEMM's layout,
        # which the Triton linear reads as well), so the linears launch no quantizer; and under
        # a8w8 experts the norm ahead of an MoE writes them for moe.experts (row-major, as its
        # kernels read them). None: that norm writes no codes.
        norm_quantize = (
            cache.is_cuda
            and self.dtype == torch.bfloat16
            and not batch_invariant
            and knobs.norm_quantize()
        )
        self.linear_codes = None
        if norm_quantize and formats.linear_a8w8 and len(formats.linear_formats) == 1:
            ue8m0 = formats.linear_formats == ("fp8_block128_ue8m0",)
            self.linear_codes = NormCodes(token_major=True, ue8m0=ue8m0)
        self.moe_codes = None
        if norm_quantize and formats.expert_activation_mode == "a8w8":
            ue8m0 = formats.expert_format == "fp8_block128_ue8m0"
            self.moe_codes = NormCodes(token_major=False, ue8m0=ue8m0)
        # and o_proj's input, one 128-column group a head, by the per-head W_UV product
        self.head_codes = self.linear_codes if config.v_head_dim == 128 else None
        self.norm_quantize = self.linear_codes is not None or self.moe_codes is not None

    @torch.inference_mode()
    def forward(self, meta: StepMetadata) -> torch.Tensor:  # [R, V] float32
        h = self.weights.embed[meta.input_ids]
        cos, sin = self.rotary.cos_sin(meta.positions, self.dtype)
        layers, eps = self.weights.layers, self.config.rms_norm_eps
        # xq: x's e4m3 codes and scales where the norm wrote them (norm_quantize), else None
        x, xq = self._norm_for_linears(h, layers[0].input_norm, eps)
        for index, layer in enumerate(layers):
            attention = self._attention(index, layer.attention, x, cos, sin, meta, xq)
            attention = self.all_reduce(attention)
            # codes for a dense MLP's gate and up, or for an MoE's experts
            dense = isinstance(layer.mlp, DenseMLPWeights)
            h, x, xq = self._add_norm_for_linears(
                h, attention, layer.post_attention_norm, eps,
                self.linear_codes if dense else self.moe_codes,
            )  # fmt: skip
            mlp = self.all_reduce(self._mlp(layer.mlp, x, xq))
            if index + 1 < len(layers):  # the residual add fused with the next layer's norm
                h, x, xq = self._add_norm_for_linears(
                    h, mlp, layers[index + 1].input_norm, eps, self.linear_codes
                )
            else:
                h = h + mlp
        h = self._rms_norm(h[meta.logit_rows], self.weights.final_norm, eps)
        return self.weights.lm_head(h, self.row_by_row).float()

    # -- attention --------------------------------------------------------------------------

    def _attention(
        self,
        index: int,
        w: AttentionWeights,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: StepMetadata,
        xq: tuple[torch.Tensor, torch.Tensor] | None = None,  # x's codes and scales, if made
    ) -> torch.Tensor:  # [T, hidden]
        c, ix = self.config, w.indexer
        tokens = x.shape[0]
        q_a, index_k, compressed = self._projections(
            w.from_hidden, (w.q_a_proj, ix.wk, w.kv_a_proj), x, xq
        )
        q_resid, q_resid_q = self._norm_for_linears(q_a, w.q_a_norm, NORM_EPS)
        q, q_index = self._projections(w.from_q_lora, (w.q_b_proj, ix.wq_b), q_resid, q_resid_q)
        q = q.view(tokens, c.num_heads, c.qk_head_dim)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, ROPE_DIM], dim=-1)
        q_mla = q.new_empty(tokens, c.num_heads, LATENT_RANK + ROPE_DIM)

        side = self._fork(meta)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            # The NoPE part absorbed into the latent space straight into the query's first 512
            # columns, its RoPE part rotated into the last 64: a concatenation of both read and
            # wrote the whole query again (9 us a layer at 64 x 64 heads on the H200).
            self._per_head(q_nope, w.w_uk, transpose=False, out=q_mla[..., :LATENT_RANK])
            self.fn.mla_query_rope(q_mla, q_rope, cos, sin)
            latent, k_rope = self._rows(
                lambda rows, c, s: self.fn.latent_and_key_rope(rows, w.kv_a_norm, c, s, NORM_EPS),
                compressed,
                cos,
                sin,
            )
            self.ops["kv.write_latent"](
                self.latent_views[index], latent, k_rope, meta.slots, self.formats.latent_format
            )

        q_index, index_weights, index_keys = self._indexer_inputs(ix, x, q_index, index_k, cos, sin)
        self.ops["kv.write_index_keys"](
            self.index_views[index], index_keys, meta.slots, self.formats.index_format
        )

        if meta.prefill is None:  # a decode step: whole tensors, no row gathers
            out = self._decode_attention(index, q_mla, q_index, index_weights, meta.decode, side)
        elif meta.decode is None:
            # A prefill-only step: its rows are every row, in order. Whole tensors here too:
            # the row gathers and the scatter into `out` (an index_put of [T, H, 512]) took
            # ~25 ms of a 303 ms step of 8192 tokens on the H200.
            out = self._prefill_attention(index, q_mla, q_index, index_weights, meta.prefill).to(
                x.dtype
            )
        else:
            out = x.new_empty(tokens, c.num_heads, LATENT_RANK)
            if meta.prefill is not None:
                p = meta.prefill
                out[p.rows] = self._prefill_attention(
                    index, q_mla[p.rows], q_index[p.rows], index_weights[p.rows], p
                )
            if meta.decode is not None:
                d = meta.decode
                out[d.rows] = self._decode_attention(
                    index, q_mla[d.rows], q_index[d.rows], index_weights[d.rows], d
                )
        if self.head_codes is not None:  # the W_UV product writes o_proj's codes too
            from hwrun.kernels.triton.head_quant import head_products_quantize

            codes = self.head_codes
            values, vq = head_products_quantize(out, w.w_uv, codes.ue8m0, codes.token_major)
            return w.o_proj(values, self.row_by_row, vq)
        values = out.new_empty(tokens, c.num_heads, w.w_uv.shape[1])  # [T, H, v], o_proj's rows
        self._per_head(out, w.w_uv, transpose=True, out=values)
        return w.o_proj(values.view(tokens, -1), self.row_by_row)

    def _projections(self, fused, linears, x, xq=None) -> tuple[torch.Tensor, ...]:
        """``linears`` of ``x``: one joined product when ``fused`` is set, else each alone
        (``xq``: x's codes and scales, for the a8w8 linears)."""
        if fused is not None:
            return fused(x, self.row_by_row, xq)
        return tuple(linear(x, self.row_by_row, xq) for linear in linears)

    def _indexer_inputs(self, ix: IndexerWeights, x, q, k, cos, sin):
        """The indexer's query [T, Hi, 128], head weights [T, Hi] fp32 and key [T, 128], from
        its projections ``q`` = wq_b(q_resid) and ``k`` = wk(x)."""
        q = q.view(x.shape[0], self.config.index_n_heads, -1)
        k = self._rows(
            lambda rows, c, s: self.fn.index_key(
                rows, ix.k_norm_weight, ix.k_norm_bias, c, s, NORM_EPS
            ),
            k,
            cos,
            sin,
        )
        # The score's scales (head count and softmax) are part of the weights, as the contract
        # says: w * relu(q . k) == w * relu(q . k * s) / s for s > 0.
        scale = self.config.index_n_heads**-0.5 * INDEX_HEAD_DIM**-0.5
        weights = ix.weights_proj(x, self.row_by_row) * scale
        q, weights = self._rows(
            lambda rows, w_rows, c, s: self.fn.index_query(
                rows, w_rows, c, s, self.formats.index_query_fp8
            ),
            q,
            weights,
            cos,
            sin,
        )
        return q, weights, k

    def _prefill_attention(self, index, q_mla, q_index, index_weights, p: PrefillRows):
        block_size = self.layout.block_size
        blocks, offsets = p.context_slots // block_size, p.context_slots % block_size
        elements, scales = self.index_format.split_pages(self.index_views[index], block_size)
        # This rank's stored rows of the context; under DCP the ranks' rows, gathered.
        keys, key_scales, latent_rows = self.context.gather(
            [
                elements[blocks, offsets],
                scales[blocks, offsets],
                self.latent_views[index][blocks, offsets],
            ],
            p,
        )
        logits = self.ops["indexer.logits_ragged"](
            q_index,
            index_weights,
            keys,
            key_scales,
            self.formats.index_format,
            p.key_starts,
            p.key_ends,
        )
        positions = self.ops["indexer.topk"](
            logits, p.key_starts, p.key_ends, self.config.index_topk
        )
        # topk counts from each row's start; the workspace holds every chunk's context in turn.
        workspace_rows = torch.where(positions >= 0, positions + p.key_starts[:, None], -1)
        workspace = self.latent_format.decode(latent_rows)
        out, _ = self.ops["sparse_mla.prefill"](
            q_mla, workspace, workspace_rows.to(torch.int32), self.config.softmax_scale
        )
        return out

    def _fork(self, meta: StepMetadata) -> torch.cuda.Stream | None:
        """The side stream, started after everything queued so far, for a decode step on CUDA
        (the indexer's top-k runs one program per row and leaves SMs free; a CUDA graph
        captures both streams); None for steps with prefill rows. Tensors the side stream reads
        or allocates outlive the join in _decode_attention, so neither stream's allocator hands
        out their memory while the other may still use it."""
        if self.side_stream is None or meta.prefill is not None:
            return None
        self.side_stream.wait_stream(torch.cuda.current_stream())
        return self.side_stream

    def _decode_attention(
        self, index, q_mla, q_index, index_weights, d: DecodeRows, side=None
    ) -> torch.Tensor:
        batch = q_mla.shape[0]
        # Positions below are this rank's local ones (under DCP: its tokens only).
        local_lens, local_max = self.context.local_lengths(d.context_lens, d.max_context)
        logits = self.ops["indexer.logits_paged"](
            q_index.unsqueeze(1),
            index_weights,
            self.index_views[index],
            self.formats.index_format,
            d.block_table,
            local_lens.unsqueeze(1),
            local_max,
        )
        positions = self.context.select(
            self.ops, logits, d.context_lens, self.config.index_topk, starts=d.window_starts
        )
        slots = self.ops["indexer.to_slots"](positions, d.block_table, self.layout.block_size)
        if side is not None:  # the query and this layer's latents (_fork's side stream)
            torch.cuda.current_stream().wait_stream(side)
        out, lse = self.ops["sparse_mla.decode"](
            q_mla.view(batch, 1, *q_mla.shape[1:]),
            self.latent_views[index],
            self.formats.latent_format,
            slots.view(batch, 1, -1),
            self.config.softmax_scale,
        )
        out = self.context.combine(self.ops, out, lse)
        return out.view(batch, *out.shape[2:])

    # -- MLP ----------------------------------------------------------------------------------

    def _mlp(self, w: DenseMLPWeights | MoEWeights, x: torch.Tensor, xq=None) -> torch.Tensor:
        if isinstance(w, DenseMLPWeights):
            gate = w.gate_proj(x, self.row_by_row, xq)
            up = w.up_proj(x, self.row_by_row, xq)
            return w.down_proj(F.silu(gate) * up, self.row_by_row)
        c = self.config
        router_logits = w.router(x, self.row_by_row)
        route_weights, ids = self.ops["moe.route"](
            router_logits,
            c.num_experts_per_tok,
            scoring="sigmoid",
            n_group=c.n_group,
            topk_group=c.topk_group,
            e_score_correction_bias=w.correction_bias,
            renormalize=c.norm_topk_prob,
            routed_scaling_factor=c.routed_scaling_factor,
        )
        extra = {} if xq is None else {"quantized": xq}  # x's codes, when its norm made them
        return self.ops["moe.experts"](
            x,
            w.w13,
            w.w2,
            ids,
            route_weights,
            self.formats.expert_activation_mode,
            shared_experts=w.shared,
            **extra,
        )

    # -- plain torch helpers --------------------------------------------------------------------

    def _rows(self, fn, *xs: torch.Tensor):
        """``fn`` over the rows of ``xs`` (same leading size): all at once, or one row of each
        at a time (batch-invariant), the results (a tensor or a tuple of them) concatenated."""
        if not self.row_by_row or xs[0].shape[0] <= 1:
            return fn(*xs)
        parts = [fn(*(x[i : i + 1] for x in xs)) for i in range(xs[0].shape[0])]
        if isinstance(parts[0], tuple):
            return tuple(torch.cat(column) for column in zip(*parts, strict=True))
        return torch.cat(parts)

    def _norm_for_linears(self, x: torch.Tensor, weight: torch.Tensor, eps: float):
        """``(rms_norm(x), its codes and scales or None)``: with ``linear_codes`` one launch of
        norm_quant.py's kernel writes both (the codes for the dense.linear_a8w8 calls that read
        the norm's output)."""
        codes = self.linear_codes
        if codes is None:
            return self._rms_norm(x, weight, eps), None
        from hwrun.kernels.triton.norm_quant import rms_norm_quantize

        _, y, xq = rms_norm_quantize(x, weight, eps, codes.ue8m0, codes.token_major)
        return y, xq

    def _add_norm_for_linears(self, h, delta, weight, eps: float, codes: NormCodes | None):
        """``_add_rms_norm``, and the norm's codes and scales in ``codes``' layout (None: no
        a8w8 op reads this norm's output, no codes)."""
        if codes is None:
            return *self._add_rms_norm(h, delta, weight, eps), None
        from hwrun.kernels.triton.norm_quant import rms_norm_quantize

        h, y, xq = rms_norm_quantize(h, weight, eps, codes.ue8m0, codes.token_major, delta=delta)
        return h, y, xq

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return self._rows(lambda rows: self.fn.rms_norm(rows, weight, eps), x)

    def _add_rms_norm(self, h, delta, weight, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        if self.row_by_row:
            h = h + delta
            return h, self._rms_norm(h, weight, eps)
        return self.fn.add_rms_norm(h, delta, weight, eps)

    def _per_head(self, x: torch.Tensor, w: torch.Tensor, transpose: bool, out: torch.Tensor):
        """Per-head products into ``out [T, H, b]``: ``x [T, H, a] @ w[h] [a, b]`` (``w [H, a,
        b]``), or with ``transpose`` ``x [T, H, b] @ w[h].T`` (``w [H, a, b]``, ``out [T, H,
        a]``). One batched GEMM over the heads writes ``out`` through its strides (a column
        slice, or [T, H, .] seen heads first), so no transpose or concatenation copies it."""
        weight = w.transpose(1, 2) if transpose else w
        if not self.row_by_row or x.shape[0] <= 1:
            torch.bmm(x.transpose(0, 1), weight, out=out.transpose(0, 1))
            return
        for i in range(x.shape[0]):  # batch-invariant: each row a product of its own
            torch.bmm(x[i : i + 1].transpose(0, 1), weight, out=out[i : i + 1].transpose(0, 1))
