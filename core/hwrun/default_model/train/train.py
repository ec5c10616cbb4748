"""Trains the default model in DeepSeek-V3.2's three DSA phases, inside a wall-clock budget.

1. dense: the whole model (indexer aside) on the LM loss with dense causal attention;
2. warm-up: the main model frozen, the indexer trained on the KL divergence from the dense
   attention distribution (summed over heads, L1-normalised) to the softmax of its scores;
3. sparse: attention restricted to each layer's indexer top-k; the main model on the LM loss,
   the indexer on the KL over the selected keys (its inputs detached from the LM graph).

Phases get fixed fractions of `--budget-s`; the main model's learning rate follows one cosine
over the time of phases 1 and 3. MoE balance follows DeepSeek-V3's auxiliary-loss-free rule:
after each step, every router's `e_score_correction_bias` moves by `--bias-update` toward the
mean load. Held-out loss is measured dense and sparse at the end of every phase.

Outputs in --out: weights-0/1.safetensors (transformers' names; bf16, the correction biases
fp32; split because the device returns files of at most 16 MiB), log.json (options, step log,
evaluations, a greedy sample, a check against transformers' own forward).

    python -m hwrun.default_model.train.train --data build/data --out build/run --budget-s 360
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV32ForCausalLM

from hwrun.default_model.train import dsa_forward
from hwrun.default_model.train.architecture import SEQ_LEN, model_config

PHASES = (("dense", 0.62), ("warmup", 0.08), ("sparse", 0.30))


@dataclass(frozen=True)
class TrainOptions:
    budget_s: float = 360.0
    seq_len: int = SEQ_LEN
    batch: int = 32
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    indexer_lr: float = 1e-3
    bias_update: float = 1e-3
    grad_clip: float = 1.0
    eval_every_s: float = 20.0
    eval_windows: int = 64
    heldout_limit: int = 0  # windows for the phase-end evaluations; 0: all of them
    log_every: int = 25
    seed: int = 0
    device: str = "cuda"


def phase_attention(phase: str) -> str:
    return "sparse" if phase == "sparse" else "dense"


def random_batch(tokens: np.ndarray, opts: TrainOptions, gen: np.random.Generator) -> torch.Tensor:
    starts = gen.integers(0, tokens.size - opts.seq_len - 1, size=opts.batch)
    rows = np.stack([tokens[s : s + opts.seq_len + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(rows)


def heldout_windows(tokens: np.ndarray, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of seq_len + 1 tokens (inputs and next-token targets)."""
    count = (tokens.size - 1) // seq_len
    rows = [tokens[i * seq_len : i * seq_len + seq_len + 1] for i in range(count)]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def autocast(device: str):
    return torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda")


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, mode: str, opts: TrainOptions) -> dict:
    """Mean held-out LM loss (nats/token) and indexer KL (mean over layers) in `mode`."""
    losses, kls, weights = [], [], []
    for chunk in windows.split(opts.batch):
        chunk = chunk.to(opts.device)
        with autocast(opts.device):
            out = dsa_forward.forward(model, chunk[:, :-1], mode, train_indexer=True)
        losses.append(lm_loss(out.logits, chunk[:, 1:]).item())
        kls.append(torch.stack(out.indexer_kl).mean().item())
        weights.append(chunk.shape[0])
    w = np.asarray(weights, dtype=np.float64)
    return {
        "loss": float(np.dot(losses, w) / w.sum()),
        "indexer_kl": float(np.dot(kls, w) / w.sum()),
        "tokens": int(w.sum() * opts.seq_len),
    }


def is_indexer(name: str) -> bool:
    return ".indexer." in name


def optimizers(model, opts: TrainOptions):
    decay, no_decay, indexer = [], [], []
    for name, p in model.named_parameters():
        if is_indexer(name):
            indexer.append(p)
        elif p.ndim >= 2 and "gate.weight" not in name:
            decay.append(p)
        else:
            no_decay.append(p)
    fused = opts.device == "cuda"
    main = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": opts.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=opts.lr,
        betas=(0.9, 0.95),
        fused=fused,
    )
    idx = torch.optim.AdamW(
        indexer, lr=opts.indexer_lr, betas=(0.9, 0.95), weight_decay=0.0, fused=fused
    )
    return main, idx


def set_trainable(model, phase: str) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(phase == "sparse" or (phase == "dense") != is_indexer(name))


def main_lr(opts: TrainOptions, step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / opts.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return opts.lr * warm * (opts.min_lr_ratio + (1.0 - opts.min_lr_ratio) * cosine)


@torch.no_grad()
def update_correction_bias(model, loads: list[torch.Tensor], rate: float) -> None:
    gates = [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    for gate, load in zip(gates, loads, strict=True):
        load = load.float()
        gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)


def train(model, train_tokens: np.ndarray, heldout: torch.Tensor, opts: TrainOptions) -> dict:
    gen = np.random.default_rng(opts.seed)
    main_opt, idx_opt = optimizers(model, opts)
    main_params = [p for n, p in model.named_parameters() if not is_indexer(n)]
    idx_params = [p for n, p in model.named_parameters() if is_indexer(n)]
    main_time_total = opts.budget_s * sum(f for p, f in PHASES if p != "warmup")
    log = {"steps": [], "evals": [], "phases": []}
    step, main_step, idx_step, main_time = 0, 0, 0, 0.0
    start = time.monotonic()
    for phase, fraction in PHASES:
        set_trainable(model, phase)
        mode = phase_attention(phase)
        phase_start = time.monotonic()
        phase_end = phase_start + fraction * opts.budget_s
        next_eval = phase_start + opts.eval_every_s
        phase_steps = 0
        while time.monotonic() < phase_end:
            now = time.monotonic()
            batch = random_batch(train_tokens, opts, gen).to(opts.device, non_blocking=True)
            train_main, train_idx = phase != "warmup", phase != "dense"
            with autocast(opts.device):
                out = dsa_forward.forward(model, batch[:, :-1], mode, train_indexer=train_idx)
            loss = lm_loss(out.logits, batch[:, 1:])
            kl = torch.stack(out.indexer_kl).sum() if train_idx else None
            total = (loss if train_main else 0.0) + (kl if train_idx else 0.0)
            total.backward()
            if train_main:
                progress = (main_time + now - phase_start) / main_time_total
                lr = main_lr(opts, main_step, progress)
                for group in main_opt.param_groups:
                    group["lr"] = lr
                torch.nn.utils.clip_grad_norm_(main_params, opts.grad_clip)
                main_opt.step()
                main_opt.zero_grad(set_to_none=True)
                update_correction_bias(model, out.expert_load, opts.bias_update)
                main_step += 1
            if train_idx:
                idx_lr = opts.indexer_lr * min(1.0, (idx_step + 1) / 20)
                for group in idx_opt.param_groups:
                    group["lr"] = idx_lr
                torch.nn.utils.clip_grad_norm_(idx_params, opts.grad_clip)
                idx_opt.step()
                idx_opt.zero_grad(set_to_none=True)
                idx_step += 1
            step += 1
            phase_steps += 1
            if step % opts.log_every == 0 or phase_steps == 1:
                row = {
                    "step": step,
                    "phase": phase,
                    "elapsed_s": round(time.monotonic() - start, 2),
                    "loss": round(loss.item(), 4),
                    "indexer_kl": round(kl.item() / len(out.indexer_kl), 4)
                    if kl is not None
                    else None,
                    "lr": main_lr(
                        opts, main_step, (main_time + now - phase_start) / main_time_total
                    ),
                    "tokens_per_s": round(
                        step * opts.batch * opts.seq_len / (time.monotonic() - start)
                    ),
                }
                log["steps"].append(row)
                print(json.dumps(row), flush=True)
            if time.monotonic() >= next_eval:
                ev = evaluate(model, heldout[: opts.eval_windows], mode, opts)
                log["evals"].append({"step": step, "phase": phase, "mode": mode, **ev})
                next_eval = time.monotonic() + opts.eval_every_s
        if phase != "warmup":
            main_time += time.monotonic() - phase_start
        end = {
            "phase": phase,
            "steps": phase_steps,
            "seconds": round(time.monotonic() - phase_start, 1),
        }
        for m in dsa_forward.ATTENTION_MODES:
            end[f"heldout_{m}"] = evaluate(model, heldout, m, opts)
        log["phases"].append(end)
        print(json.dumps(end), flush=True)
    log["total_steps"] = step
    log["tokens_seen"] = step * opts.batch * opts.seq_len
    return log


@torch.no_grad()
def check_against_transformers(model, windows: torch.Tensor, device: str) -> dict:
    """Max |logit difference| between this forward and transformers' own, fp32, both modes."""
    model.float()
    ids = windows[:, :-1].to(device)
    result = {}
    indexers = [layer.self_attn.indexer for layer in model.model.layers]
    topk = indexers[0].index_topk
    for mode in dsa_forward.ATTENTION_MODES:
        for ix in indexers:
            ix.index_topk = topk if mode == "sparse" else ids.shape[1]
        ours = dsa_forward.forward(model, ids, mode).logits
        theirs = model(input_ids=ids).logits
        result[mode] = float((ours - theirs).abs().max())
    for ix in indexers:
        ix.index_topk = topk
    return result


@torch.no_grad()
def greedy_sample(model, tokenizer_path: Path, prompt: str, new_tokens: int, device: str) -> dict:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    ids = tok.encode(prompt).ids  # the post-processor prepends <|bos|>
    samples = {}
    for mode in dsa_forward.ATTENTION_MODES:
        seq = list(ids)
        for _ in range(new_tokens):
            x = torch.tensor([seq], device=device)
            with autocast(device):
                nxt = int(dsa_forward.forward(model, x, mode).logits[0, -1].argmax())
            if nxt == tok.token_to_id("<|eos|>"):
                break
            seq.append(nxt)
        samples[mode] = tok.decode(seq[len(ids) :])
    return samples


def save_weights(model, out: Path) -> list[str]:
    """bf16 weights (fp32 correction biases) under transformers' names, in two files."""
    state = {}
    for name, t in model.state_dict().items():
        keep_fp32 = name.endswith("e_score_correction_bias")
        state[name] = (
            t.detach().to(torch.float32 if keep_fp32 else torch.bfloat16).cpu().contiguous()
        )
    names = sorted(state)
    half = len(names) // 2
    files = []
    for i, part in enumerate((names[:half], names[half:])):
        path = out / f"weights-{i}.safetensors"
        save_file({n: state[n] for n in part}, str(path))
        files.append(path.name)
    return files


def write_log(out: Path, log: dict) -> None:
    (out / "log.json").write_text(json.dumps(log, indent=1, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="train_tokenizer's output folder")
    parser.add_argument("--out", type=Path, required=True)
    defaults = TrainOptions()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    opts = TrainOptions(**{k: getattr(args, k) for k in asdict(defaults)})
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(opts.seed)
    data_meta = json.loads((args.data / "data.json").read_text())
    train_tokens = np.fromfile(args.data / "train.bin", dtype=np.uint16)
    heldout = heldout_windows(np.fromfile(args.data / "heldout.bin", dtype=np.uint16), opts.seq_len)
    if opts.heldout_limit:
        heldout = heldout[: opts.heldout_limit]
    config = model_config(data_meta["vocab_size"])
    config._attn_implementation = "eager"
    model = DeepseekV32ForCausalLM(config).to(opts.device).float()
    model.train()
    params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"params": params, "heldout_windows": heldout.shape[0]}), flush=True)

    torch.backends.cuda.matmul.allow_tf32 = True  # the fp32 index-score products; off for the check
    wall = time.monotonic()
    log = train(model, train_tokens, heldout, opts)
    log["train_wall_s"] = round(time.monotonic() - wall, 1)
    log["weights"] = save_weights(model, args.out)  # first, so a later failure loses nothing
    log.update(
        options=asdict(opts),
        params=params,
        config=config.to_dict(),
        data=data_meta,
        versions={"torch": torch.__version__, "transformers": transformers.__version__},
        device=torch.cuda.get_device_name() if opts.device == "cuda" else opts.device,
    )
    write_log(args.out, log)
    model.eval()
    log["sample"] = greedy_sample(
        model, args.data / "tokenizer.json", "def fibonacci(n):", 64, opts.device
    )
    print(json.dumps(log["sample"]), flush=True)
    write_log(args.out, log)
    torch.backends.cuda.matmul.allow_tf32 = False
    log["check_against_transformers_fp32_max_abs_logit_diff"] = check_against_transformers(
        model, heldout[:2], opts.device
    )
    write_log(args.out, log)
    print(
        json.dumps(
            {k: log[k] for k in ("phases", "check_against_transformers_fp32_max_abs_logit_diff")}
        )
    )


if __name__ == "__main__":
    main()
