"""The training forward of the default model, over transformers' own DeepseekV32 modules.

transformers' `DeepseekV32ForCausalLM.forward` runs the DSA indexer under `torch.no_grad()` and
only returns its top-k indices, which it folds into the attention mask: right for inference, but
DeepSeek-V3.2 trains the indexer against the main attention. This module walks the same modules
(so the trained weights keep transformers' names) and computes each layer exactly as
transformers does, in one of two attention modes:

- `dense`: causal attention over every earlier token (what `index_topk >= seq_len` gives);
- `sparse`: each query attends only to the `index_topk` keys its layer's indexer scores highest
  (transformers' selection: top-k of the index scores with the causal mask added).

With `train_indexer`, each layer also returns the indexer's loss, DeepSeek-V3.2's KL divergence
from the main attention distribution (summed over heads, L1-normalised) to the softmax of the
index scores, over the causal keys in `dense` mode and over the selected keys in `sparse` mode.
The indexer sees its inputs detached, so that loss trains the indexer alone and the LM loss
never reaches it.

Numerics follow transformers' eager path: index scores and router in fp32, attention softmax in
fp32. The routed experts run as two matrix products over all experts with the router's weights
scattered into a dense [tokens, experts] matrix (zero for experts not chosen), which equals
transformers' per-expert loop and has no data-dependent shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf

ATTENTION_MODES = ("dense", "sparse")


@dataclass
class ForwardOutput:
    logits: Tensor  # [B, S, V]
    indexer_kl: list[Tensor] = field(default_factory=list)  # one scalar per layer
    expert_load: list[Tensor] = field(default_factory=list)  # [E] token counts per MoE layer


def index_scores(
    indexer: nn.Module, x: Tensor, q_resid: Tensor, cos: Tensor, sin: Tensor
) -> Tensor:
    """transformers' `DeepseekV32Indexer.forward` up to (not including) the mask and top-k.

    x: [B, S, hidden]; q_resid: [B, S, q_lora_rank]. Returns fp32 scores [B, S, T=S]:
    sum_h w[b,s,h] * n_heads^-0.5 * relu(softmax_scale * q[b,s,h] . k[b,t]).
    """
    batch, seq, _ = x.shape
    rope = indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(batch, seq, indexer.n_heads, indexer.head_dim)
    q_rot, q_pass = torch.split(q, [rope, indexer.head_dim - rope], dim=-1)
    k = indexer.k_norm(indexer.wk(x)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [rope, indexer.head_dim - rope], dim=-1)
    q_rot, k_rot = hf.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    scores = (
        torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale
    )
    scores = F.relu(scores)  # [B, S, H, T]
    with torch.autocast(x.device.type, enabled=False):
        weights = (
            indexer.weights_proj(x.float()) * indexer.n_heads**-0.5
        )  # fp32, as transformers keeps it
    return torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)


def select_topk(scores: Tensor, causal: Tensor, topk: int) -> Tensor:
    """Boolean [B, S, T]: the keys each query attends to in sparse mode (causal ∩ top-k)."""
    masked = scores.detach().masked_fill(~causal, float("-inf"))
    idx = masked.topk(min(topk, scores.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(masked, dtype=torch.bool).scatter_(-1, idx, True)
    return chosen & causal


def indexer_kl(probs: Tensor, scores: Tensor, keep: Tensor) -> Tensor:
    """Mean over queries of KL(p || softmax(scores)) on the keys in `keep`.

    probs: main attention [B, H, S, T] (detached here); scores: index scores [B, S, T].
    """
    with torch.no_grad():
        target = probs.float().sum(1).masked_fill(~keep, 0.0)
        target = target / target.sum(-1, keepdim=True).clamp_min(1e-12)
    log_q = scores.masked_fill(~keep, float("-inf")).log_softmax(-1).masked_fill(~keep, 0.0)
    terms = target * (target.clamp_min(1e-12).log() - log_q)
    return terms.sum(-1).mean()


def attention(
    attn: nn.Module,
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    causal: Tensor,
    mode: str,
    train_indexer: bool,
) -> tuple[Tensor, Tensor | None]:
    """One MLA layer as `DeepseekV32Attention.forward` (eager), in `mode`; returns (out, kl)."""
    batch, seq, _ = x.shape
    q_resid = attn.q_a_layernorm(attn.q_a_proj(x))
    q = attn.q_b_proj(q_resid).view(batch, seq, -1, attn.qk_head_dim).transpose(1, 2)
    q_pass, q_rot = torch.split(q, [attn.qk_nope_head_dim, attn.qk_rope_head_dim], dim=-1)
    kv_pass, k_rot = torch.split(
        attn.kv_a_proj_with_mqa(x), [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1
    )
    k_pass = attn.kv_a_layernorm(kv_pass).view(batch, 1, seq, attn.kv_lora_rank)
    k_rot = k_rot.view(batch, 1, seq, attn.qk_rope_head_dim)
    q_rot, k_rot = hf.apply_rotary_pos_emb_interleave(q_rot, k_rot, cos, sin)
    query = torch.cat((q_pass, q_rot), dim=-1)
    key, value = attn.expand_kv(k_pass, k_rot)

    scores = None
    if mode == "sparse" or train_indexer:
        with torch.set_grad_enabled(train_indexer and torch.is_grad_enabled()):
            scores = index_scores(attn.indexer, x.detach(), q_resid.detach(), cos, sin)
    keep = causal.expand(batch, seq, seq)
    if mode == "sparse":
        keep = select_topk(scores, causal, attn.indexer.index_topk)

    logits = torch.matmul(query, key.transpose(2, 3)) * attn.scaling
    logits = logits.float().masked_fill(~keep.unsqueeze(1), float("-inf"))
    probs = logits.softmax(-1)
    out = torch.matmul(probs.to(value.dtype), value).transpose(1, 2).reshape(batch, seq, -1)
    kl = indexer_kl(probs.detach(), scores, keep) if train_indexer else None
    return attn.o_proj(out), kl


def routed_experts(moe: nn.Module, x: Tensor) -> tuple[Tensor, Tensor]:
    """`DeepseekV32MoE.forward` with all experts computed densely; returns (out, load [E])."""
    shape = x.shape
    h = x.reshape(-1, shape[-1])
    with torch.autocast(x.device.type, enabled=False):
        _, weights, chosen = moe.gate(h.float())  # transformers' router: fp32, grouped top-k
    experts = moe.experts
    num, inter = experts.num_experts, experts.intermediate_dim
    dense_w = torch.zeros(h.shape[0], num, device=h.device, dtype=weights.dtype)
    dense_w = dense_w.scatter(1, chosen, weights)  # [N, E]
    gate_up = experts.gate_up_proj  # [E, 2I, D]
    gu = (h @ gate_up.reshape(num * 2 * inter, -1).t()).view(-1, num, 2 * inter)
    gate, up = gu.chunk(2, dim=-1)
    act = experts.act_fn(gate) * up * dense_w.unsqueeze(-1).to(gu.dtype)  # [N, E, I]
    down = experts.down_proj.transpose(1, 2).reshape(num * inter, -1)  # [E*I, D]
    out = (act.reshape(h.shape[0], -1) @ down).view(shape)
    load = torch.bincount(chosen.flatten(), minlength=num)
    return out + moe.shared_experts(x), load


def forward(
    model: nn.Module, input_ids: Tensor, mode: str = "dense", train_indexer: bool = False
) -> ForwardOutput:
    """`DeepseekV32ForCausalLM` over `input_ids` [B, S] (no padding, positions 0..S-1)."""
    if mode not in ATTENTION_MODES:
        raise ValueError(f"attention mode {mode!r} is not one of {ATTENTION_MODES}")
    inner = model.model
    seq = input_ids.shape[1]
    h = inner.embed_tokens(input_ids)
    positions = torch.arange(seq, device=input_ids.device)[None]
    cos, sin = inner.rotary_emb(h, positions)
    causal = torch.ones(seq, seq, dtype=torch.bool, device=h.device).tril()[None]
    result = ForwardOutput(logits=h)
    for layer in inner.layers:
        out, kl = attention(
            layer.self_attn, layer.input_layernorm(h), cos, sin, causal, mode, train_indexer
        )
        h = h + out
        if kl is not None:
            result.indexer_kl.append(kl)
        x = layer.post_attention_layernorm(h)
        if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts"):
            out, load = routed_experts(layer.mlp, x)
            result.expert_load.append(load)
        else:
            out = layer.mlp(x)
        h = h + out
    result.logits = model.lm_head(inner.norm(h))
    return result
