"""Serving benchmark of the engine: offered-load and concurrency sweeps, TTFT / TPOT percentiles.

Requests go to an in-process :class:`~hwrun.engine.async_engine.AsyncEngine`, the engine
``hwrun serve`` runs, without HTTP (the server's own cost is bench/serve_load.py's). Each
request has ``--input-len`` random prompt token ids (distinct per request: the prefix cache does
not help) and generates exactly ``--output-len`` tokens (``ignore_eos``). Arrivals are Poisson
at each ``--rate`` (requests per second; ``inf``: all at once), with at most ``--concurrency``
requests in flight (later ones wait for a slot, as a client pool would). A warm-up round
(``--warmup`` requests of the same prompt length, all at once, not reported) runs first, so the
first measured requests do not pay for compilation.

Per (rate, concurrency) it reports output tokens per second over the run, TTFT (arrival to first
token) and TPOT (time after the first token per further token) at p50 / p90 / p99, and, on CUDA,
the decode roofline at the run's mean number of requests in flight (bench/engine_decode.py's
step bytes at the measured copy bandwidth): the TPOT a step reading only what it must would take.

    python bench/engine_serve.py --model /tmp/bench-model --input-len 1024 --output-len 256 \\
        --requests 64 --rate 4 16 inf --concurrency 64 [--kv-cache-dtype fp8_ds_mla ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_decode import add_format_args, copy_bandwidth, format_options, step_bytes

from hwrun.engine.async_engine import AsyncEngine
from hwrun.engine.config import EngineConfig
from hwrun.engine.sampling_params import SamplingParams


class StepClock:
    """Where the engine thread's time goes, per kind of step (decode-only steps, and steps with
    prefill chunks): the runner's host work (inputs, launches or a graph replay; a prefill's
    host synchronisations put device time here too), waiting for the device (a synchronize
    added after the runner, which the sampler's copy to the host would otherwise do a moment
    later), the engine's sampling and outputs (``LLMEngine._sample``: with async scheduling its
    read of the tokens is where the engine waits for the device), and the whole
    ``LLMEngine.step`` (scheduling on top)."""

    KINDS = ("decode", "prefill")

    def __init__(self, llm_engine):
        self.reset()
        step, execute, sample = llm_engine.step, llm_engine.runner.execute, llm_engine._sample
        # With async scheduling a synchronize would wait for the step launched ahead too and
        # undo the overlap being measured: the device wait is then not split out (0).
        cuda = llm_engine.runner.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda and not llm_engine.async_scheduling else None
        kind = ["decode"]

        def timed_execute(chunks, **device_inputs):
            kind[0] = "decode" if all(c.is_decode for c in chunks) else "prefill"
            started = time.perf_counter()
            results = execute(chunks, **device_inputs)
            launched = time.perf_counter()
            if sync is not None:
                sync()
            tally = self.tallies[kind[0]]
            tally["runner_host_s"] += launched - started
            tally["device_wait_s"] += time.perf_counter() - launched
            return results

        def timed_sample(launched):
            started = time.perf_counter()
            outputs = sample(launched)
            sampled = "decode" if all(c.is_decode for c in launched.chunks) else "prefill"
            self.tallies[sampled]["sample_s"] += time.perf_counter() - started
            return outputs

        def timed_step():
            started = time.perf_counter()
            outputs = step()
            tally = self.tallies[kind[0]]
            tally["step_s"] += time.perf_counter() - started
            tally["steps"] += 1
            return outputs

        llm_engine.runner.execute = timed_execute
        llm_engine._sample = timed_sample
        llm_engine.step = timed_step

    def reset(self) -> None:
        zero = {"steps": 0, "step_s": 0.0, "runner_host_s": 0.0, "device_wait_s": 0.0}
        zero["sample_s"] = 0.0
        self.tallies = {kind: dict(zero) for kind in self.KINDS}

    def row(self) -> dict:
        """``{kind}_steps`` and, per step of that kind, ``{kind}_{step,runner_host,
        device_wait,sample}_ms``."""
        row = {}
        for kind, tally in self.tallies.items():
            steps = tally["steps"]
            row[f"{kind}_steps"] = steps
            for name in ("step", "runner_host", "device_wait", "sample"):
                row[f"{kind}_{name}_ms"] = 1e3 * tally[f"{name}_s"] / steps if steps else 0.0
        return row

    def summary(self, row: dict) -> str:
        return "; ".join(
            f"{row[f'{kind}_steps']} {kind} steps of {row[f'{kind}_step_ms']:.2f} ms (runner "
            f"host {row[f'{kind}_runner_host_ms']:.2f}, device wait "
            f"{row[f'{kind}_device_wait_ms']:.2f}, sample {row[f'{kind}_sample_ms']:.2f})"
            for kind in self.KINDS
            if row[f"{kind}_steps"]
        )


async def one_request(engine, prompt, output_len, request_id, slots, in_flight):
    async with slots:
        in_flight[0] += 1
        start = time.perf_counter()
        first = None
        tokens = 0
        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        try:
            async for output in engine.generate(prompt, params, request_id):
                tokens = len(output.outputs[0].token_ids)
                if first is None and tokens:
                    first = time.perf_counter()
        finally:
            in_flight[0] -= 1
        end = time.perf_counter()
    if tokens != output_len:
        raise RuntimeError(f"{request_id}: {tokens} tokens, asked for {output_len}")
    tpot = (end - first) / (output_len - 1) if output_len > 1 else 0.0
    return first - start, tpot


async def run_load(engine, args, rate: float, concurrency: int, seed: int) -> dict:
    rng = random.Random(seed)
    vocab = engine.vocab_size
    slots = asyncio.Semaphore(concurrency)
    in_flight, samples = [0], []

    async def sample_in_flight():
        while True:
            samples.append(in_flight[0])
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample_in_flight())
    tasks = []
    start = time.perf_counter()
    for i in range(args.requests):
        prompt = [rng.randrange(2, vocab) for _ in range(args.input_len)]
        request_id = f"r{seed}-{i}"
        tasks.append(
            asyncio.create_task(
                one_request(engine, prompt, args.output_len, request_id, slots, in_flight)
            )
        )
        if math.isfinite(rate):
            await asyncio.sleep(rng.expovariate(rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    sampler.cancel()
    ttft = [r[0] * 1e3 for r in results]
    tpot = [r[1] * 1e3 for r in results]
    busy = [s for s in samples if s] or [concurrency]
    row = {
        "rate": rate if math.isfinite(rate) else "inf",
        "concurrency": concurrency,
        "requests": args.requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "duration_s": duration,
        "output_tokens_per_s": args.requests * args.output_len / duration,
        "mean_in_flight": statistics.fmean(busy),
    }
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot)):
        for q in (50, 90, 99):
            # a measured value (the nearest rank), not one interpolated between two
            row[f"{name}_p{q}"] = float(np.percentile(values, q, method="inverted_cdf"))
    return row


async def main_async(args) -> list[dict]:
    config = EngineConfig(
        model=args.model,
        **format_options(args),
        max_model_len=args.input_len + args.output_len + 8,
        max_num_seqs=max(args.concurrency),
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_kv_tokens=max(args.concurrency) * (args.input_len + args.output_len + 72),
        async_scheduling=args.async_scheduling,
    )
    engine = AsyncEngine(config)
    await engine.start()
    runner = engine._engine.runner  # the bench reads the pool and weights for the roofline
    cuda = runner.device.type == "cuda"
    bandwidth = copy_bandwidth(runner.device) if cuda else None
    print(f"ops: {', '.join(f'{c.op}={c.platform}:{c.impl}' for c in engine.op_table)}")
    clock = StepClock(engine._engine) if args.step_clock else None
    rows = []
    try:
        if args.warmup:
            # Not reported: the first prefill chunks compile (torch.compile, Triton, the vendor
            # JITs); the H200's first run without this put 16 s of TTFT on them.
            warm = argparse.Namespace(**{**vars(args), "requests": args.warmup, "output_len": 4})
            started = time.perf_counter()
            await run_load(engine, warm, math.inf, max(args.concurrency), seed=-1)
            print(f"warm-up: {args.warmup} requests in {time.perf_counter() - started:.1f} s")
        for concurrency in args.concurrency:
            for index, rate in enumerate(args.rate):
                if clock:
                    clock.reset()
                row = await run_load(engine, args, rate, concurrency, seed=index)
                if clock:
                    row.update(clock.row())
                    print(f"  {clock.summary(row)}")
                if bandwidth:
                    batch = max(1, round(row["mean_in_flight"]))
                    context = args.input_len + args.output_len // 2
                    row["decode_roofline_ms"] = 1e3 * step_bytes(runner, batch, context) / bandwidth
                rows.append(row)
                roof = row.get("decode_roofline_ms")
                print(
                    f"rate {row['rate']} concurrency {concurrency}: "
                    f"{row['output_tokens_per_s']:.0f} output tok/s, in flight "
                    f"{row['mean_in_flight']:.1f}; TTFT p50/p90/p99 {row['ttft_ms_p50']:.0f}/"
                    f"{row['ttft_ms_p90']:.0f}/{row['ttft_ms_p99']:.0f} ms; TPOT "
                    f"{row['tpot_ms_p50']:.2f}/{row['tpot_ms_p90']:.2f}/"
                    f"{row['tpot_ms_p99']:.2f} ms"
                    + (f" (decode roofline {roof:.2f} ms)" if roof else "")
                )
    finally:
        await engine.shutdown()
        engine._engine.close()
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    parser.add_argument("--platform", default="auto")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rate", type=float, nargs="+", default=[math.inf])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64])
    add_format_args(parser, index_query_dtype="bf16")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="requests (4 output tokens each, all at once) run before the measured ones and not "
        "reported (default: the largest --concurrency; 0: none). Use at least 2: steps that mix "
        "one request's decode with another's prefill chunk have row counts a lone request never "
        "makes, and their first compiles would otherwise land in the measurement",
    )
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="launch each decode step before the previous one's tokens reach the host",
    )
    parser.add_argument(
        "--step-clock",
        action="store_true",
        help="split the time of decode-only and of prefill steps (runner host work, device "
        "wait, the whole step; adds a synchronize after the runner)",
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = max(args.concurrency)
    if args.output_len < 1 or args.input_len < 1 or args.requests < 1:
        parser.error("--input-len, --output-len and --requests must be >= 1")
    rows = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    main()
