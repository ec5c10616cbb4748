"""Turns `train`'s output into the shipped checkpoint, and measures it with transformers alone.

Writes into --out: config.json, generation_config.json, model.safetensors (bf16; the routers'
`e_score_correction_bias` fp32, as DeepSeek ships it), tokenizer.json, tokenizer_config.json,
and eval.json: held-out loss of the written checkpoint through transformers'
`DeepseekV32ForCausalLM` itself (eager attention, fp32 compute on the bf16 weights), dense
(`index_topk` raised to the context) and sparse (the shipped `index_topk`), plus greedy samples.

    python -m hwrun.default_model.train.export --run build/run --data build/data \
        --out core/hwrun/default_model
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, DeepseekV32ForCausalLM, GenerationConfig

from hwrun.default_model.train.architecture import model_config
from hwrun.default_model.train.train import heldout_windows

SAMPLE_PROMPTS = (
    "def fibonacci(n):",
    "import os\n\n\ndef ",
    "class Stack:\n    def push(self, item):",
)


def write_checkpoint(run: Path, data: Path, out: Path) -> None:
    vocab = json.loads((data / "data.json").read_text())["vocab_size"]
    config = model_config(vocab)
    model = DeepseekV32ForCausalLM(config)
    state = {}
    for path in sorted(run.glob("weights-*.safetensors")):
        state.update(load_file(str(path)))
    model.load_state_dict(state, strict=True)  # raises on any missing or unexpected name
    out.mkdir(parents=True, exist_ok=True)
    shipped = {
        name: t.to(torch.float32 if name.endswith("e_score_correction_bias") else torch.bfloat16)
        for name, t in model.state_dict().items()
    }
    save_file(shipped, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["DeepseekV32ForCausalLM"]
    config.dtype = torch.bfloat16
    config.save_pretrained(out)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    ).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(data / name, out / name)


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, index_topk: int, batch: int = 8) -> float:
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = index_topk
    total, count = 0.0, 0
    for chunk in windows.split(batch):
        logits = model(input_ids=chunk[:, :-1]).logits
        total += F.cross_entropy(
            logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"
        ).item()
        count += chunk[:, 1:].numel()
    return total / count


@torch.no_grad()
def greedy(model, tokenizer, prompt: str, new_tokens: int) -> str:
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return prompt + tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def evaluate_checkpoint(out: Path, data: Path, windows: int) -> dict:
    model = DeepseekV32ForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    config = model.config
    seq = config.max_position_embeddings
    held = heldout_windows(np.fromfile(data / "heldout.bin", dtype=np.uint16), seq)[:windows]
    result = {
        "heldout_windows": int(held.shape[0]),
        "context": seq,
        "loss_dense": heldout_loss(model, held, seq),
        "loss_sparse": heldout_loss(model, held, config.index_topk),
    }
    for layer in model.model.layers:
        layer.self_attn.indexer.index_topk = config.index_topk
    result["samples"] = {p: greedy(model, tokenizer, p, 80) for p in SAMPLE_PROMPTS}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="train's output folder")
    parser.add_argument("--data", type=Path, required=True, help="train_tokenizer's output folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--eval-windows", type=int, default=64)
    args = parser.parse_args()
    write_checkpoint(args.run, args.data, args.out)
    result = evaluate_checkpoint(args.out, args.data, args.eval_windows)
    (args.run / "eval.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
