"""The engine's host time per step against an emulated device, with and without async scheduling.

A runner that computes nothing stands in for the GPU: each step it is handed becomes ready
``--device-ms`` after the previous one (the device's queue), its logits carry that time, every
torch op on them passes it on, and reading values on the host (``tolist``, ``item``) waits for
it, as a CUDA synchronisation would. Requests go through :class:`AsyncEngine` as the server's
do (bench/engine_serve.py's load), so the step time beyond ``--device-ms`` is the host work the
device waits for: scheduling, sampling, outputs, the event loop. With ``--async-scheduling`` the
next decode step is launched before the current one's tokens are read, and that host work
overlaps the device's.

    python bench/engine_host_overlap.py --device-ms 7 --requests 64 --input-len 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_serve import run_load

from hwrun.engine.async_engine import AsyncEngine
from hwrun.engine.batch import ChunkLogits
from hwrun.engine.config import EngineConfig
from hwrun.engine.op_table import OpChoice

HOST_READS = ("tolist", "item", "__int__", "__float__")


class DeviceClock(TorchFunctionMode):
    """Tensors may carry ``ready_at`` (perf_counter seconds); an op's result carries its inputs'
    latest, and a host read of one sleeps until then."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        for arg in args:
            if isinstance(arg, (list, tuple)):
                tensors += [t for t in arg if isinstance(t, torch.Tensor)]
        ready = max((getattr(t, "ready_at", 0.0) for t in tensors), default=0.0)
        if getattr(func, "__name__", "") in HOST_READS:
            time.sleep(max(0.0, ready - time.perf_counter()))
        out = func(*args, **(kwargs or {}))
        if ready and isinstance(out, torch.Tensor):
            out.ready_at = ready
        return out


class EmulatedDeviceRunner:
    """A model runner whose steps take ``device_s`` each on a device that runs them in order."""

    device_token_inputs = True

    def __init__(self, device_s: float, vocab_size: int = 1024):
        self.device_s = device_s
        self.block_size, self.num_blocks, self.vocab_size = 64, 1 << 16, vocab_size
        self.max_model_len = 1 << 20
        self.eos_token_ids = ()
        self.device = torch.device("cpu")
        self.op_table = [OpChoice("sparse_mla.decode", "emulated", "none", False)]
        self.logits = torch.randn(1, vocab_size, generator=torch.Generator().manual_seed(0))
        self.device_free_at = 0.0
        self.steps = 0

    def execute(self, chunks, input_ids=None) -> list[ChunkLogits]:
        self.device_free_at = max(time.perf_counter(), self.device_free_at) + self.device_s
        self.steps += 1
        # One tensor of the step's logits, each chunk naming its row, as the model runner's
        rows = sum(chunk.needs_logits for chunk in chunks)
        step = self.logits.expand(rows, -1).clone()
        step.ready_at = self.device_free_at
        results, row = [], 0
        for chunk in chunks:
            if chunk.needs_logits:
                results.append(ChunkLogits(chunk.seq_id, step, range(row, row + 1)))
                row += 1
            else:
                results.append(ChunkLogits(chunk.seq_id, None))
        return results


async def measure(args, async_scheduling: bool) -> dict:
    runner = EmulatedDeviceRunner(args.device_ms / 1e3)
    config = EngineConfig(
        max_model_len=args.input_len + args.output_len + 8,
        max_num_seqs=args.requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
        async_scheduling=async_scheduling,
    )
    engine = AsyncEngine(config, runner=runner, tokenizer=None)
    run = engine._run  # the step loop's thread: torch function modes are per thread

    def run_with_clock():
        with DeviceClock():
            run()

    engine._run = run_with_clock
    await engine.start()
    try:
        started = time.perf_counter()
        row = await run_load(engine, args, math.inf, args.requests, seed=0)
        seconds = time.perf_counter() - started
    finally:
        await engine.shutdown()
    return {
        "async_scheduling": async_scheduling,
        "device_ms": args.device_ms,
        "steps": runner.steps,
        "step_ms": 1e3 * seconds / runner.steps,
        "tpot_ms_p50": row["tpot_ms_p50"],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device-ms", type=float, default=7.0, help="device time of a step")
    parser.add_argument("--requests", type=int, default=64, help="all at once, all in flight")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    for async_scheduling in (False, True):
        row = asyncio.run(measure(args, async_scheduling))
        rows.append(row)
        print(
            f"async scheduling {'on ' if async_scheduling else 'off'}: {row['step_ms']:.2f} ms "
            f"a step ({row['steps']} steps, device {args.device_ms:.2f} ms each), TPOT p50 "
            f"{row['tpot_ms_p50']:.2f} ms"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
