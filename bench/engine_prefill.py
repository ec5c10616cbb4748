"""Prefill time of the engine's model runner: one step of prefill chunks, where its time goes.

Per ``--context`` C the step computes ``--seqs`` chunks of ``--chunk / --seqs`` tokens each,
every sequence with C tokens already cached (valid cache bytes, as bench/engine_decode.py
fills them): the step a serving engine runs when it prefills a long prompt chunk by chunk
(``--seqs 1``) or several short prompts at once (``--seqs 8 --context 0``, 1K prompts).
It reports the median wall time of ``runner.execute`` over ``--steps`` steps (after one
warm-up step), prompt tokens per second, the GPU's busy time (the sum of its kernels, torch
profiler) against that wall time, and the heaviest kernels.

    python bench/engine_prefill.py --model /tmp/bench-model --chunk 8192 --seqs 8 --context 0
    python bench/engine_prefill.py --model /tmp/bench-model --chunk 8192 --context 32768 131072
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_decode import add_format_args, fill_cache, format_options, kernels_by_name

from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.config import EngineConfig
from hwrun.engine.model_runner import build_model_runner
from hwrun.report.bench import bench_file


def prefill_chunks(context: int, chunk: int, seqs: int, block_size: int) -> list[ScheduledChunk]:
    """``seqs`` chunks of ``chunk // seqs`` tokens after ``context`` cached tokens each, on
    disjoint blocks."""
    length = chunk // seqs
    blocks = -(-(context + length) // block_size)
    chunks = []
    for seq in range(seqs):
        tokens = [7 + (seq + i) % 1000 for i in range(length)]
        table = list(range(seq * blocks, (seq + 1) * blocks))
        chunks.append(ScheduledChunk(seq, tokens, context, table, needs_logits=True))
    return chunks


def time_prefill(runner, chunks, steps: int) -> float:
    runner.execute(chunks)  # compiles, warms the vendor JITs
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner.execute(chunks)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def kernel_table(runner, chunks, top: int) -> tuple[float, list[dict]]:
    """GPU kernels of one prefill step by name (us, launches), heaviest first; their sum."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.execute(chunks)
        torch.cuda.synchronize()
    kernels = kernels_by_name(prof)
    rows = [{"kernel": n[:120], "us": us, "launches": c} for n, (us, c) in kernels.items()]
    rows.sort(key=lambda r: -r["us"])
    return sum(r["us"] for r in rows), rows[:top]


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--platform", default="nvidia")
    parser.add_argument("--chunk", type=int, default=8192, help="prompt tokens in the step")
    parser.add_argument("--seqs", type=int, default=1, help="sequences sharing them")
    parser.add_argument("--context", type=int, nargs="+", default=[0, 32768])
    add_format_args(parser)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25, help="kernels listed")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if args.chunk % args.seqs:
        parser.error(f"--chunk {args.chunk} does not split into {args.seqs} equal chunks")
    rows = []
    length = args.chunk // args.seqs
    runner = build_model_runner(
        EngineConfig(
            model=args.model,
            **format_options(args),
            max_model_len=max(args.context) + length + 64,
            max_num_seqs=args.seqs,
            max_num_batched_tokens=args.chunk,
            num_kv_tokens=args.seqs * (max(args.context) + length + 128),
            cuda_graphs=False,
        )
    )
    fill_cache(runner)
    for context in args.context:
        chunks = prefill_chunks(context, args.chunk, args.seqs, runner.block_size)
        seconds = time_prefill(runner, chunks, args.steps)
        busy_us, kernels = kernel_table(runner, chunks, args.top)
        row = {
            "context": context,
            "seqs": args.seqs,
            "chunk": args.chunk,
            "step_ms": seconds * 1e3,
            "prompt_tokens_per_s": args.chunk / seconds,
            "gpu_busy_ms": busy_us / 1e3,
            "kernels": kernels,
        }
        rows.append(row)
        print(
            f"context {context}, {args.seqs} x {length} tokens: {row['step_ms']:.1f} ms a step, "
            f"{row['prompt_tokens_per_s']:.0f} prompt tok/s; GPU busy {row['gpu_busy_ms']:.1f} ms"
        )
        for k in kernels:
            print(f"    {k['us'] / 1e3:8.2f} ms x{k['launches']:5d}  {k['kernel']}")
    if args.json:
        card = torch.cuda.get_device_name(0)
        Path(args.json).write_text(bench_file("engine_prefill", card, rows))
    return rows


if __name__ == "__main__":
    main()
