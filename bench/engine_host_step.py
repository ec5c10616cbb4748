"""Host time of a graph-replayed decode step, phase by phase, with the device left out.

The engine's model runner and sampler, as they run one decode step of ``--batch`` sequences at
each ``--context``, over stand-ins for what only a GPU has: the decode graphs become
:class:`HostOnlyGraphs` (a host buffer for the block tables, and a "replay" that returns a
``[B, V]`` float32 CPU tensor made once, where the GPU queues the replay and a copy of its
logits), and the model's weights and pool are never built (the runner reads only their sizes).
What is timed is the engine's own host code, called as the engine calls it:

- ``block tables``: ``BlockTables.fill`` of the step's chunks into the graph's host table;
- ``runner.execute``: the replay path (per-chunk checks, block tables, the graph's inputs, the
  per-chunk results);
- ``launch``: ``LLMEngine._launch`` (``runner.execute`` and, with async scheduling, the rows
  gathered and the tokens sampled on the device);
- ``sample``: ``LLMEngine._sample`` (sampling, or reading the launched tokens; appending them;
  the outputs).

Each phase's median microseconds over ``--steps`` steps, each step one position further on, as
decode goes (a block table gains a block every 64 steps). On a CPU device the rows' gather is a
memory copy that on a GPU is queued device work, so ``--vocab`` smaller than the model's shows
the per-op host cost alone.

    python bench/engine_host_step.py --context 32768 131072 --steps 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.config import EngineConfig
from hwrun.engine.context_parallel import ContextShard
from hwrun.engine.llm_engine import LLMEngine
from hwrun.engine.model_runner import BLOCK_SIZE, KVPool, ModelRunner
from hwrun.engine.sampling_params import SamplingParams
from hwrun.engine.sequence import SequenceStatus

NUM_BLOCKS = 1 << 17  # block ids of the fake tables wrap around this


class HostOnlyGraphs:
    """DecodeGraphs' interface to the runner, without a device: the host table buffer, and a
    replay that returns the step's logits (made once; the GPU's replay and clone are device
    work queued by a few calls)."""

    def __init__(self, batch: int, width: int, vocab: int):
        self.tables = np.full((batch, width), -1, dtype=np.int32)
        self.logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))

    def fits(self, batch: int) -> bool:
        return batch <= self.tables.shape[0]

    def host_tables(self, batch: int) -> np.ndarray:
        return self.tables[:batch]

    def run(self, input_ids, positions, slots) -> torch.Tensor:
        return self.logits[: len(positions)]


def host_runner(batch: int, max_model_len: int, vocab: int) -> ModelRunner:
    """A ModelRunner whose decode steps take the replay path over :class:`HostOnlyGraphs`."""
    width = -(-max_model_len // BLOCK_SIZE)
    layout = SimpleNamespace(block_size=BLOCK_SIZE)
    pool = KVPool(layout, NUM_BLOCKS, torch.empty(0, dtype=torch.uint8))
    model_config = SimpleNamespace(vocab_size=vocab, eos_token_ids=())
    model = SimpleNamespace(context=ContextShard())
    graphs = HostOnlyGraphs(batch, width, vocab)
    return ModelRunner(model, pool, model_config, None, "host", max_model_len, graphs, "host")


def time_step(args, context: int, async_scheduling: bool) -> dict[str, float]:
    steps = args.steps + 3
    max_model_len = context + steps + 8
    runner = host_runner(args.batch, max_model_len, args.vocab)
    config = EngineConfig(
        max_model_len=max_model_len,
        max_num_seqs=args.batch,
        max_num_batched_tokens=max(args.batch, 8192),
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    engine = LLMEngine(config, runner=runner, tokenizer=None)
    blocks = -(-max_model_len // BLOCK_SIZE)
    params = SamplingParams(temperature=0.0, max_tokens=1 << 30, ignore_eos=True)
    seqs = []
    for b in range(args.batch):
        prompt = [(b + i) % args.vocab for i in range(context)]
        seq = engine.make_sequence(str(b), prompt, params)
        seq.block_table = [(b * blocks + i) % NUM_BLOCKS for i in range(-(-context // BLOCK_SIZE))]
        seq.status = SequenceStatus.RUNNING
        seqs.append(seq)

    spent: dict[str, float] = {}

    def timed(name, fn):
        def call(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = time.perf_counter() - start

        return call

    runner.block_tables.fill = timed("block tables", runner.block_tables.fill)
    runner.execute = timed("runner.execute", runner.execute)
    samples: dict[str, list[float]] = {}
    for step in range(steps):
        for b, seq in enumerate(seqs):  # a block added where the block manager would add it
            if len(seq.block_table) * BLOCK_SIZE < seq.num_tokens:
                seq.block_table.append((b * blocks + len(seq.block_table)) % NUM_BLOCKS)
        chunks = [
            ScheduledChunk(
                seq.seq_id, [seq.token_ids[-1]], seq.num_tokens - 1, seq.block_table, True
            )
            for seq in seqs
        ]
        start = time.perf_counter()
        launched = engine._launch(seqs, chunks)
        launch = time.perf_counter()
        engine._record(launched)
        record = time.perf_counter()
        outputs = engine._sample(launched)
        done = time.perf_counter()
        assert len(outputs) == len(seqs)
        if step < 3:
            continue
        phases = {
            "block tables": spent["block tables"],
            "runner.execute": spent["runner.execute"],
            "launch": launch - start,
            "sample": done - record,
            "step (launch, record, sample)": done - start,
        }
        for name, seconds in phases.items():
            samples.setdefault(name, []).append(seconds * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--vocab", type=int, default=129280, help="DeepSeek-V3.2's by default")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the engine's thread: one core, as a step's host work runs
    rows = []
    for context in args.context:
        for async_scheduling in (False, True):
            phases = time_step(args, context, async_scheduling)
            rows.append(
                {
                    "batch": args.batch,
                    "context": context,
                    "vocab": args.vocab,
                    "async_scheduling": async_scheduling,
                    "us": phases,
                }
            )
            mode = "async" if async_scheduling else "sync "
            cells = ", ".join(f"{name} {us:.1f}" for name, us in phases.items())
            print(f"{args.batch} x {context} {mode}: {cells} (us, median of {args.steps})")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
