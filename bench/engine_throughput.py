"""Output tokens per second of the engine through ``LLM.generate``, at given batch sizes.

Each run generates ``--max-tokens`` tokens (ignore_eos) for ``batch`` copies of a short Python
prompt with distinct seeds, after one warm-up request; the time covers prefill and decode, as a
user of ``hwrun generate`` sees it. Defaults: the embedded default model, the best platform here.

    python bench/engine_throughput.py --batch 1 32 [--model DIR] [--platform P]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from hwrun import LLM, SamplingParams

PROMPT = "def fibonacci(n):\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--platform", default="auto")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)

    llm = LLM(model=args.model, platform=args.platform, max_num_seqs=max(args.batch))
    runner = llm.engine.runner
    threads = torch.get_num_threads()
    print(f"platform {runner.platform}, device {runner.device}, torch threads {threads}")
    print(f"host: {platform.processor() or platform.machine()}")
    llm.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0), use_tqdm=False)
    for batch in args.batch:
        params = [
            SamplingParams(max_tokens=args.max_tokens, temperature=0.8, seed=i, ignore_eos=True)
            for i in range(batch)
        ]
        start = time.perf_counter()
        outputs = llm.generate([PROMPT] * batch, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        print(
            f"batch {batch:3d}: {tokens} tokens in {seconds:.2f} s = {tokens / seconds:.1f} tok/s "
            f"({seconds / args.max_tokens * 1e3:.1f} ms per step)"
        )


if __name__ == "__main__":
    main()
