"""Decode time per output token of the engine's model runner, against the decode roofline.

For each (batch, context) the KV pool holds ``batch`` sequences of ``context`` tokens (valid
cache bytes, encoded by the platform's own cache writes: one block's latents copied to every
block, and every slot's own random index key, see :func:`fill_cache`) and
the runner decodes one token per sequence per step, as the scheduler would hand it; the step
time is the median over ``--steps`` steps (wall time of ``runner.execute`` and a synchronize,
CUDA graphs as the engine captures them), and again with each step launched before the host
waits for the previous one, as the engine's async scheduling launches them (the host's
preparation of a step overlaps the device's work on the previous one). The roofline is the
bytes a decode step must read at the measured copy bandwidth: every non-expert weight once, the
routed experts the batch touches (expected distinct experts under uniform routing), and per
sequence and layer the top-k latent rows plus the index keys of the whole context.

    python bench/build_bench_model.py --out /tmp/bench-model
    python bench/engine_decode.py --model /tmp/bench-model --batch 1 8 64 --context 32768 131072

``--topk N`` rewrites the model's ``index_topk`` (``--topk 0``: the whole context, i.e. dense
MLA) in a sibling directory sharing the weights, to compare DSA against dense attention.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import time
from pathlib import Path

import torch
from kernel_timeline import timeline

from hwrun.engine.batch import ScheduledChunk, last_position_logits
from hwrun.engine.config import EngineConfig
from hwrun.engine.model_runner import ModelRunner, build_model_runner
from hwrun.engine.weights import MoEWeights, tensor_bytes
from hwrun.formats.index_keys import get_index_key_format
from hwrun.formats.latent import get_latent_format
from hwrun.report.bench import bench_file


def with_topk(model: Path, topk: int, context: int) -> Path:
    """A sibling checkpoint directory whose config has ``index_topk`` = topk (0: context)."""
    config = json.loads((model / "config.json").read_text())
    config["index_topk"] = topk or context
    out = model.parent / f"{model.name}-topk{config['index_topk']}"
    out.mkdir(exist_ok=True)
    for file in model.glob("*.safetensors"):
        link = out / file.name
        if not link.exists():
            link.symlink_to(file.resolve())
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def fill_cache(runner: ModelRunner, chunk: int = 1 << 18) -> None:
    """Valid bytes in every block: block 0's latents, encoded by the runner's own write ops,
    copied to every block; index keys encoded for every slot, each its own random key.

    Until 2026-12-03 the index keys were copied from block 0 too, so every row's indexer
    logits repeated with the block's period: each value 512 times at 32K, 2048 at 128K. The
    top-k then selected among ties that real keys never make (its select ran 660 us a step
    at 32K x 64 on the H200, 342 at 128K). Latent bytes do not change any kernel's work."""
    model, block = runner.model, runner.block_size
    device = runner.device
    slots = torch.arange(block, dtype=torch.int32, device=device)
    dtype = model.dtype
    for layer in range(model.config.num_layers):
        latent = torch.randn(block, 512, device=device, dtype=dtype)
        rope = torch.randn(block, 64, device=device, dtype=dtype)
        model.ops["kv.write_latent"](
            model.latent_views[layer], latent, rope, slots, model.formats.latent_format
        )
    runner.pool.cache[1:] = runner.pool.cache[0]
    total = runner.num_blocks * block
    for start in range(0, total, chunk):
        slots = torch.arange(start, min(start + chunk, total), dtype=torch.int32, device=device)
        for layer in range(model.config.num_layers):
            keys = torch.randn(slots.numel(), 128, device=device, dtype=dtype)
            model.ops["kv.write_index_keys"](
                model.index_views[layer], keys, slots, model.formats.index_format
            )


def step_bytes(runner: ModelRunner, batch: int, context: int) -> float:
    """Bytes one decode step must read (see the module docstring)."""
    weights, config = runner.model.weights, runner.model_config
    total = 0.0
    for layer in weights.layers:
        mlp = layer.mlp
        for name in ("attention", "input_norm", "post_attention_norm"):
            total += tensor_bytes(getattr(layer, name))
        if isinstance(mlp, MoEWeights):
            experts = config.n_routed_experts
            per_expert = (mlp.w13.nbytes + mlp.w2.nbytes) / experts
            touched = experts * (1 - (1 - config.num_experts_per_tok / experts) ** batch)
            total += touched * per_expert + tensor_bytes(mlp.shared) + tensor_bytes(mlp.router)
        else:
            total += tensor_bytes(mlp)
    total += tensor_bytes(weights.lm_head)
    formats = runner.model.formats
    latent = get_latent_format(formats.latent_format).row_bytes
    keys = get_index_key_format(formats.index_format).bytes_per_token
    rows = min(config.index_topk, context)
    total += batch * config.num_layers * (rows * latent + context * keys)
    return total


def copy_bandwidth(device: torch.device) -> float:
    """The copy rate under the roofline: gpu_bench_common's event-timed copy, as the op benches
    measure it. Until 2026-12-04 this bench timed each copy on the host around a synchronize,
    which counted the host's launch and wait latency as copy time: on one H200 machine 4.14
    TB/s where the event-timed copy read 4.22 in the same run, and 3.98 on another machine; the
    rooflines over it were that much too long and their percentages 2-6% high."""
    from gpu_bench_common import copy_bytes_per_s  # imports Triton: GPU runs only

    return copy_bytes_per_s(device)


def time_decode(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    """Median seconds per decode step of ``batch`` sequences at ``context`` tokens.

    Each row takes a random token each step. The sequences' caches hold the same bytes, so rows
    given one token id had near-identical hidden states and routed to nearly the same experts:
    until 2026-12-01 the bench fed every row token 7 and read fewer expert bytes than the
    roofline counts (the H200 trace: experts 1.6 ms a step at 32K x 64, 2.4 ms with distinct
    tokens)."""
    blocks = -(-(context + steps + 4) // runner.block_size)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(batch)]
    tokens = random.Random(0)
    times = []
    for step in range(steps + 3):
        position = context + step
        chunks = [
            ScheduledChunk(b, [tokens.randrange(runner.vocab_size)], position, tables[b], True)
            for b in range(batch)
        ]
        torch.cuda.synchronize()
        start = time.perf_counter()
        runner.execute(chunks)
        torch.cuda.synchronize()
        if step >= 3:  # the first steps compile and warm caches
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_decode_overlapped(runner: ModelRunner, batch: int, context: int, steps: int) -> float:
    """Median seconds between decode steps launched as the engine's async scheduling launches
    them: each step takes the previous step's tokens (argmax, on the device) as input ids and is
    queued before the host waits for the previous step, so the host's preparation of a step
    overlaps the device's work on the one before."""
    blocks = -(-(context + steps + 4) // runner.block_size)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(batch)]
    first = torch.Generator().manual_seed(0)
    tokens = torch.randint(runner.vocab_size, (batch,), generator=first).to(runner.device)
    previous: torch.cuda.Event | None = None
    marks = []
    torch.cuda.synchronize()
    for step in range(steps + 3):
        position = context + step
        chunks = [ScheduledChunk(b, [0], position, tables[b], True) for b in range(batch)]
        results = runner.execute(chunks, input_ids=tokens)
        tokens = last_position_logits(results).argmax(-1)
        done = torch.cuda.Event()
        done.record()
        if previous is not None:
            previous.synchronize()  # the host reads step N-1's tokens while step N runs
        previous = done
        marks.append(time.perf_counter())
    torch.cuda.synchronize()
    return statistics.median(b - a for a, b in itertools.pairwise(marks[3:]))


def profile_shares(runner: ModelRunner, batch: int, context: int, steps: int) -> dict[str, float]:
    """Share of an eager decode step's GPU time per op: CUDA events around every op call, over
    the events around whole steps. The rest is plain torch (linears, norms, RoPE) and any time
    the GPU waited for the host."""
    table = runner.model.ops
    pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def timed(op, fn):
        def call(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            pending.append((op, start, end))
            return out

        return call

    graphs, runner.graphs = runner.graphs, None
    try:
        time_decode(runner, batch, context, 2)  # warm the eager path
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with table.replaced({op: timed(op, table[op]) for op in table.ops}):
            first.record()
            time_decode(runner, batch, context, steps)
            last.record()
        torch.cuda.synchronize()
    finally:
        runner.graphs = graphs
    total = first.elapsed_time(last)
    shares = dict.fromkeys(table.ops, 0.0)
    for op, start, end in pending:
        shares[op] += start.elapsed_time(end) / total
    shares["plain torch and host gaps"] = max(0.0, 1 - sum(shares.values()))
    return shares


def host_phases(runner: ModelRunner, batch: int, context: int, steps: int) -> dict[str, float]:
    """Median microseconds of a graph-replayed decode step's host work, by phase: the chunks'
    checks with the graph's per-row inputs (``ModelRunner._decode_inputs``), the block tables,
    the rest of ``DecodeGraphs.run`` before the replay, the replay call, what ``execute`` does
    after it, and the host's wait for the device at the end (the synchronous TPOT is their
    sum)."""
    spent: dict[str, float] = {}

    def timed(name, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.perf_counter() - start

        return call

    class TimedGraph:
        def __init__(self, graph):
            self.replay = timed("replay call", graph.replay)

    graphs = runner.graphs
    saved = dict(graphs._graphs)
    graphs._graphs = {b: (TimedGraph(g), logits) for b, (g, logits) in saved.items()}
    runner._decode_inputs = timed("checks", runner._decode_inputs)
    runner.block_tables.fill = timed("block tables", runner.block_tables.fill)
    graphs.run = timed("graphs.run", graphs.run)
    blocks = -(-(context + steps + 4) // runner.block_size)
    tables = [list(range(b * blocks, (b + 1) * blocks)) for b in range(batch)]
    tokens = random.Random(1)
    samples: dict[str, list[float]] = {}
    try:
        for step in range(steps + 3):
            chunks = [
                ScheduledChunk(
                    b, [tokens.randrange(runner.vocab_size)], context + step, tables[b], True
                )
                for b in range(batch)
            ]
            torch.cuda.synchronize()
            spent.clear()
            start = time.perf_counter()
            runner.execute(chunks)
            returned = time.perf_counter()
            torch.cuda.synchronize()
            done = time.perf_counter()
            if step < 3:
                continue
            phases = {
                "checks": spent["checks"],
                "block tables": spent["block tables"],
                "run before the replay": spent["graphs.run"] - spent["replay call"],
                "replay call": spent["replay call"],
                "execute, the rest": returned
                - start
                - spent["checks"]
                - spent["block tables"]
                - spent["graphs.run"],
                "wait for the device": done - returned,
                "step": done - start,
            }
            for name, seconds in phases.items():
                samples.setdefault(name, []).append(seconds * 1e6)
        # One more step under the profiler: the host's torch and CUDA API calls by own time.
        from torch.profiler import ProfilerActivity, profile

        chunks = [
            ScheduledChunk(b, [0], context + steps + 3, tables[b], True) for b in range(batch)
        ]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            runner.execute(chunks)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    finally:
        del runner._decode_inputs, runner.block_tables.fill, graphs.run
        graphs._graphs = saved
    return {name: statistics.median(values) for name, values in samples.items()}


def kernels_by_name(prof) -> dict[str, list[float]]:
    """A torch profiler's CUDA kernels by name: [microseconds, launches]."""
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = kernels.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time
            entry[1] += 1
    return kernels


def add_format_args(parser: argparse.ArgumentParser, index_query_dtype: str = "fp8") -> None:
    """The engine's cache, key, query and linear formats as flags (the H200 benches' defaults:
    fp8_ds_mla latents, fp8 keys)."""
    parser.add_argument("--kv-cache-dtype", default="fp8_ds_mla")
    parser.add_argument("--index-dtype", default="fp8")
    parser.add_argument(
        "--index-query-dtype",
        default=index_query_dtype,
        help="fp8 as DeepSeek's inference code (DeepGEMM)",
    )
    parser.add_argument(
        "--linear-activation-dtype",
        default="bf16",
        help="fp8: the block-FP8 linears as DeepSeek's inference code (dense.linear_a8w8)",
    )
    parser.add_argument(
        "--expert-activation-dtype",
        default="bf16",
        help="fp8: the block-FP8 experts' inputs as DeepSeek's inference code (moe.experts a8w8)",
    )


def format_options(args: argparse.Namespace) -> dict:
    """EngineConfig's platform and format fields from :func:`add_format_args`' flags."""
    names = ("platform", "kv_cache_dtype", "index_dtype", "index_query_dtype")
    activations = ("linear_activation_dtype", "expert_activation_dtype")
    return {name: getattr(args, name) for name in (*names, *activations)}


# Gaps between kernels up to this long are inside a step; the synchronous bench's host work
# between steps takes longer (~0.4 ms at batch 64).
STEP_GAP_US = 100.0


def kernel_profile(
    runner: ModelRunner, batch: int, context: int, steps: int, top: int = 30
) -> dict:
    """GPU kernels of ``steps`` decode steps as the engine runs them (graph replays included),
    by name, heaviest first (torch profiler, CUPTI): microseconds of exposed time per step (see
    kernel_timeline.py: durations overlap under programmatic dependent launch and the side
    stream), summed durations and launches; and the device's idle time inside the steps."""
    from torch.profiler import ProfilerActivity, profile

    time_decode(runner, batch, context, 2)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        time_decode(runner, batch, context, steps - 3)  # time_decode adds 3 warm-up steps
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    spans = timeline((e.name, e.time_range.start, e.time_range.end) for e in events)
    durations = kernels_by_name(prof)
    rows = [
        {
            "kernel": name[:120],
            "exposed_us_per_step": spans.exposed_us[name] / steps,
            "us_per_step": us / steps,
            "launches_per_step": n / steps,
        }
        for name, (us, n) in durations.items()
    ]
    rows.sort(key=lambda r: -r["exposed_us_per_step"])
    summed = sum(r["us_per_step"] for r in rows)
    busy = spans.busy_us / steps
    bubbles = [gap for gap in spans.gaps_us if gap <= STEP_GAP_US]
    launches = sum(r["launches_per_step"] for r in rows)
    print(
        f"  kernels, batch {batch} context {context}: {busy:.0f} us busy per step "
        f"({summed:.0f} us of summed durations), idle inside steps {sum(bubbles) / steps:.0f} us "
        f"in {len(bubbles) / steps:.0f} gaps, {launches:.0f} launches per step"
    )
    print("    exposed us  share  summed us  launches")
    for r in rows[:top]:
        print(
            f"    {r['exposed_us_per_step']:8.1f} {100 * r['exposed_us_per_step'] / busy:5.1f}% "
            f"{r['us_per_step']:9.1f} x{r['launches_per_step']:5.0f}  {r['kernel']}"
        )
    return {"busy_us_per_step": busy, "idle_inside_steps_us": sum(bubbles) / steps, "kernels": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--platform", default="nvidia")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[32768, 131072])
    add_format_args(parser)
    parser.add_argument("--topk", type=int, default=None, help="override index_topk (0: dense)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--profile", action="store_true", help="GPU time share per op")
    parser.add_argument(
        "--kernel-profile", action="store_true", help="GPU time per kernel (graphs included)"
    )
    parser.add_argument(
        "--host-profile", action="store_true", help="host time per phase of a replayed step"
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)

    rows = []
    bandwidth = copy_bandwidth(torch.device("cuda"))
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    for context in args.context:
        model = Path(args.model)
        if args.topk is not None:
            model = with_topk(model, args.topk, context)
        tokens = max(args.batch) * (-(-(context + args.steps + 4) // 64) * 64)
        runner = build_model_runner(
            EngineConfig(
                model=str(model),
                **format_options(args),
                max_model_len=context + args.steps + 4,
                max_num_seqs=max(args.batch),
                num_kv_tokens=tokens,
                cuda_graphs=not args.no_cuda_graphs,
            )
        )
        print(f"context {context}: cuda graphs {runner.cuda_graphs_status}")
        for choice in runner.op_table:
            print(f"  {choice.op:24s} {choice.platform}:{choice.impl}")
        fill_cache(runner)
        for batch in args.batch:
            seconds = time_decode(runner, batch, context, args.steps)
            overlapped = time_decode_overlapped(runner, batch, context, args.steps)
            floor = step_bytes(runner, batch, context) / bandwidth
            row = {
                "batch": batch,
                "context": context,
                "topk": runner.model_config.index_topk,
                "tpot_ms": seconds * 1e3,
                "tokens_per_s": batch / seconds,
                "roofline_ms": floor * 1e3,
                "percent_of_roofline": 100 * floor / seconds,
                "overlapped_tpot_ms": overlapped * 1e3,
                "overlapped_percent_of_roofline": 100 * floor / overlapped,
            }
            rows.append(row)
            print(
                f"  batch {batch:3d} context {context:6d}: TPOT {row['tpot_ms']:.2f} ms, "
                f"{row['tokens_per_s']:.0f} tok/s, roofline {row['roofline_ms']:.2f} ms "
                f"({row['percent_of_roofline']:.0f}%); host overlapped (async scheduling) "
                f"{row['overlapped_tpot_ms']:.2f} ms ({row['overlapped_percent_of_roofline']:.0f}%)"
            )
        if args.profile:
            batch = max(args.batch)
            print(f"  GPU time per op, eager decode, batch {batch}, context {context}:")
            for op, share in sorted(
                profile_shares(runner, batch, context, 3).items(), key=lambda kv: -kv[1]
            ):
                print(f"    {op:40s} {100 * share:5.1f}%")
        if args.host_profile and runner.graphs is not None:
            batch = max(args.batch)
            phases = host_phases(runner, batch, context, args.steps)
            print(f"  host per replayed step, batch {batch}, context {context} (median us):")
            for name, us in phases.items():
                print(f"    {name:24s} {us:8.1f}")
            rows.append({"batch": batch, "context": context, "host_us": phases})
        if args.kernel_profile:
            for batch in sorted({min(args.batch), max(args.batch)}):
                profile = kernel_profile(runner, batch, context, args.steps)
                rows.append({"batch": batch, "context": context, **profile})
        del runner
        torch.cuda.empty_cache()
    if args.json:
        card = (
            f"{torch.cuda.get_device_name(0)}, copy {bandwidth / 1e12:.2f} TB/s, "
            f"torch {torch.__version__}"
        )
        Path(args.json).write_text(bench_file("engine_decode", card, rows))


if __name__ == "__main__":
    main()
