"""The baseline peer of the engine's decode benchmark: transformers' ``generate`` on the same model.

Loads a DeepseekV32 checkpoint with transformers (bf16: build it with
``bench/build_bench_model.py --bf16``, the same weights as the block-FP8 one decoded), and times
``generate`` for ``batch`` random prompts of ``context`` tokens: once for 1 new token (prefill)
and once for ``1 + steps``; the time per output token is the difference over ``steps``.
transformers' DSA attention builds a dense ``[B, 1, S, T]`` mask, so long contexts do not fit;
run it at the contexts it can, and compare with ``bench/engine_decode.py`` at the same ones.

    python bench/transformers_decode.py --model /tmp/bench-bf16 --batch 1 8 --context 1024 4096
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def time_generate(model, batch: int, context: int, new_tokens: int, vocab: int) -> float:
    ids = torch.randint(2, vocab, (batch, context), device=model.device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    from transformers import DeepseekV32ForCausalLM

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, nargs="+", default=[1024])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    model = DeepseekV32ForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    rows = []
    for context in args.context:
        for batch in args.batch:
            time_generate(model, batch, 16, 2, vocab)  # warm-up
            prefill = time_generate(model, batch, context, 1, vocab)
            total = time_generate(model, batch, context, 1 + args.steps, vocab)
            tpot = (total - prefill) / args.steps
            rows.append({"batch": batch, "context": context, "tpot_ms": tpot * 1e3})
            print(
                f"transformers generate: batch {batch:3d} context {context:6d}: TPOT "
                f"{tpot * 1e3:.2f} ms ({batch / tpot:.0f} tok/s), prefill {prefill:.2f} s"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
