"""A scheduled step in, logits out: builds the step's metadata and runs the model on the pool.

:func:`build_model_runner` is the engine's startup: it reads the checkpoint's config, resolves
the platform's Target, loads the weights onto its device, plans the packed KV layout with hwrun's
planner (one block = one row of every layer's latent and index-key pages), sizes and allocates the
pool, and resolves every op for the model's real shapes (failing closed with every reason).

Under decode context parallelism (``context``, see context_parallel.py) each rank's pool holds
its share of every request's tokens, and the scheduler's blocks are every rank's blocks of the
same number together (``W * block_size`` tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from hwrun import knobs
from hwrun.engine.batch import ChunkLogits, ScheduledChunk
from hwrun.engine.block_tables import BlockTables
from hwrun.engine.config import EngineConfig
from hwrun.engine.context_parallel import ContextShard
from hwrun.engine.cuda_graphs import DecodeGraphs, graph_blockers
from hwrun.engine.fused_projections import fuse_projections
from hwrun.engine.host_copy import to_device
from hwrun.engine.linears import a8w8_reasons, bind_linears, quantized_linear_formats
from hwrun.engine.model import DecodeRows, DeepseekV32, PrefillRows, StepMetadata
from hwrun.engine.model_config import ModelConfig, parse_model_config, read_config_json
from hwrun.engine.op_table import (
    EngineStartupError,
    ModelFormats,
    OpChoice,
    OpTable,
    engine_op_specs,
    resolve_ops,
)
from hwrun.engine.tensor_parallel import shard_config, shard_weights, tp_reasons
from hwrun.engine.weights import MoEWeights, expert_a8w8_reasons, load_weights
from hwrun.kv.layout import PackedLayout, plan_packed_layout
from hwrun.kv.views import allocate_cache, kernel_id_reasons
from hwrun.models.hf_config import spec_from_hf_config
from hwrun.plugins import PluginSet, load_plugins

BLOCK_SIZE = 64  # one kernel page per block: the strided cache views the ops take need it
DEFAULT_POOL_BYTES = 1 << 30  # pool cap when neither --num-kv-tokens nor --kv-cache-memory


@dataclass(frozen=True)
class TensorShard:
    """This process's place in a tensor-parallel group: its rank, the group's size, and how its
    partial sums are added across the group (identity when alone)."""

    rank: int = 0
    world: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None


@dataclass(frozen=True)
class KVPool:
    layout: PackedLayout
    num_blocks: int
    cache: torch.Tensor  # [num_blocks, row_bytes] uint8


class ModelRunner:
    """Runs scheduled chunks through the model; owns the KV pool and the op table."""

    # execute() takes a decode step's token ids as a device tensor (``input_ids``): the engine's
    # async scheduling launches a step before the previous one's tokens reach the host.
    device_token_inputs = True

    def __init__(
        self,
        model: DeepseekV32,
        pool: KVPool,
        model_config: ModelConfig,
        ops: OpTable,
        platform: str,
        max_model_len: int,
        graphs: DecodeGraphs | None = None,
        graphs_status: str = "off",
        cpu_threads: int = 1,
    ):
        self.model, self.pool, self.model_config = model, pool, model_config
        self.graphs, self.cuda_graphs_status = graphs, graphs_status
        self.cpu_threads = cpu_threads
        self.ops, self.platform = ops, platform
        self.context = model.context
        self.local_block_size = pool.layout.block_size  # tokens per block of this rank's pool
        self.block_size = self.context.scheduler_block_size(self.local_block_size)
        self.num_blocks = pool.num_blocks
        self.max_model_len = max_model_len
        self.vocab_size = model_config.vocab_size
        self.eos_token_ids = model_config.eos_token_ids
        self.device = pool.cache.device
        self.block_tables = BlockTables()

    @property
    def op_table(self) -> list[OpChoice]:
        return self.ops.choices

    def execute(
        self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
    ) -> list[ChunkLogits]:
        """Compute ``chunks`` (KV written to their blocks); logits where each chunk asks.

        ``input_ids``: for a step of decode chunks only, their token ids as an int64 tensor on
        this runner's device, one per chunk in order, used instead of the chunks' own
        ``token_ids`` (then placeholders: the tokens are still on the device)."""
        if not chunks:
            return []
        if input_ids is not None and not all(c.is_decode for c in chunks):
            raise ValueError("input_ids replace the token ids of decode-only steps only")
        if self.graphs is not None and self._replayable(chunks):
            return self._replay(chunks, input_ids)
        meta, spans = self._metadata(chunks)
        if input_ids is not None:
            meta = replace(meta, input_ids=input_ids.to(self.device, torch.int64))
        logits = self._forward(meta)
        return [
            ChunkLogits(chunk.seq_id, None)
            if span is None
            else ChunkLogits(chunk.seq_id, logits, span)
            for chunk, span in zip(chunks, spans, strict=True)
        ]

    def _forward(self, meta: StepMetadata) -> torch.Tensor:
        if self.device.type != "cpu":
            return self.model.forward(meta)
        # Process-wide, so set for the step and given back after it.
        threads = torch.get_num_threads()
        torch.set_num_threads(self.cpu_threads)
        try:
            return self.model.forward(meta)
        finally:
            torch.set_num_threads(threads)

    def _replayable(self, chunks: list[ScheduledChunk]) -> bool:
        return self.graphs.fits(len(chunks)) and all(
            c.is_decode and not c.all_logits for c in chunks
        )

    def _replay(
        self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None
    ) -> list[ChunkLogits]:
        token_ids, positions, slots = self._decode_inputs(chunks)
        self.block_tables.fill(chunks, self.block_size, self.graphs.host_tables(len(chunks)))
        logits = self.graphs.run(token_ids if input_ids is None else input_ids, positions, slots)
        # Each chunk names its row of the step's logits: no view per row (logits.split(1) and
        # its 64 views were ~0.2-0.4 ms of a step's host time on the H200's host).
        return [ChunkLogits(c.seq_id, logits, range(i, i + 1)) for i, c in enumerate(chunks)]

    def _decode_inputs(
        self, chunks: list[ScheduledChunk]
    ) -> tuple[list[int], list[int], list[int]]:
        """Token ids, positions and cache slots of a step of decode chunks, checked as
        :meth:`check` checks each chunk (raising its error) but in one pass and a few min/max
        over the step: a decode chunk writes one token at one slot (64 calls of check were
        55-85 us of a step's host time on the H200's host)."""
        bs = self.block_size
        token_ids, positions, slots = [], [], []
        try:
            for chunk in chunks:
                start = chunk.start
                token_ids.append(chunk.token_ids[0])
                positions.append(start)
                slots.append(chunk.block_table[start // bs] * bs + start % bs)
            # A slot b * bs + (start % bs) is in [0, num_blocks * bs) iff its block b is in
            # [0, num_blocks); the table is long enough iff the index above did not raise.
            valid = (
                max(positions) < self.max_model_len
                and min(slots) >= 0
                and max(slots) < self.num_blocks * bs
                and min(token_ids) >= 0
                and max(token_ids) < self.vocab_size
            )
        except (IndexError, TypeError):
            valid = False
        if not valid:
            for chunk in chunks:
                self.check(chunk)
            raise AssertionError(f"a decode step failed its checks, but no chunk did: {chunks}")
        return token_ids, positions, slots

    def _metadata(self, chunks: list[ScheduledChunk]) -> tuple[StepMetadata, list[range | None]]:
        bs, local_bs = self.block_size, self.local_block_size
        ids, positions, slots, logit_rows, spans = [], [], [], [], []
        decode_rows, decode_chunks, decode_lens = [], [], []
        prefill_rows, context_runs, key_starts, key_ends = [], [], [], []
        run_start = 0
        for chunk in chunks:
            self.check(chunk)
            first_row = len(ids)
            chunk_positions = range(chunk.start, chunk.end)
            ids.extend(chunk.token_ids)
            positions.extend(chunk_positions)
            slots.extend(self.context.write_slot(chunk, p, local_bs) for p in chunk_positions)
            rows = range(first_row, len(ids))
            if chunk.is_decode:
                decode_rows.append(first_row)
                decode_chunks.append(chunk)
                decode_lens.append(chunk.end)
            else:
                context_runs.append(self.context.context_slots(chunk, local_bs))
                prefill_rows.extend(rows)
                key_starts.extend([run_start] * len(rows))
                key_ends.extend(run_start + p + 1 for p in chunk_positions)
                run_start += chunk.end
            if chunk.all_logits:
                spans.append(range(len(logit_rows), len(logit_rows) + len(rows)))
                logit_rows.extend(rows)
            elif chunk.needs_logits:
                spans.append(range(len(logit_rows), len(logit_rows) + 1))
                logit_rows.append(rows[-1])
            else:
                spans.append(None)

        device = self.device

        def tensor(values, dtype=torch.int64):
            return to_device(values, dtype, device)

        decode = None
        if decode_rows:
            tables = np.empty((len(decode_chunks), -(-max(decode_lens) // bs)), dtype=np.int32)
            self.block_tables.fill(decode_chunks, bs, tables)
            decode = DecodeRows(
                rows=tensor(decode_rows),
                block_table=tensor(tables, torch.int32),
                context_lens=tensor(decode_lens, torch.int32),
                max_context=max(decode_lens),
            )
        prefill = None
        if prefill_rows:
            prefill = PrefillRows(
                rows=tensor(prefill_rows),
                context_slots=tensor(torch.cat(context_runs)),
                key_starts=tensor(key_starts, torch.int32),
                key_ends=tensor(key_ends, torch.int32),
            )
        meta = StepMetadata(
            input_ids=tensor(ids),
            positions=tensor(positions),
            slots=tensor(slots, torch.int32),
            decode=decode,
            prefill=prefill,
            logit_rows=tensor(logit_rows),
        )
        return meta, spans

    def check(self, chunk: ScheduledChunk) -> None:
        """Raise ValueError when ``chunk`` cannot run here (before anything is computed).

        Called per chunk by eager steps (a replayed step checks its chunks together, in
        :meth:`_decode_inputs`): plain loops over what the chunk writes, no slices or
        generators (2.6 us a chunk before, on the development machine)."""
        tokens, table = chunk.token_ids, chunk.block_table
        if not tokens:
            raise ValueError(f"sequence {chunk.seq_id}: a scheduled chunk must hold tokens")
        end = chunk.end
        if end > self.max_model_len:
            raise ValueError(
                f"sequence {chunk.seq_id}: position {end - 1} is past max_model_len "
                f"{self.max_model_len}"
            )
        needed = -(-end // self.block_size)
        # The blocks this chunk writes; earlier ones passed this check when they were written
        # (checking a 128K-token table every step would cost milliseconds of host time).
        valid = len(table) >= needed
        if valid:
            num_blocks = self.num_blocks
            for i in range(chunk.start // self.block_size, needed):
                if not 0 <= table[i] < num_blocks:
                    valid = False
                    break
        if not valid:
            raise ValueError(
                f"sequence {chunk.seq_id}: positions up to {end - 1} need {needed} valid "
                f"blocks (of {self.num_blocks}), got block table {table}"
            )
        vocab = self.vocab_size
        for t in tokens:
            if not 0 <= t < vocab:
                bad = [t for t in tokens if not 0 <= t < vocab]
                raise ValueError(
                    f"sequence {chunk.seq_id}: token ids {bad[:5]} outside the vocabulary "
                    f"[0, {vocab})"
                )


def _pool_blocks(config: EngineConfig, layout: PackedLayout, max_model_len: int, world: int) -> int:
    """Blocks of each rank's pool. Under DCP (``world`` ranks) a request of L tokens takes
    ``ceil(ceil(L / W) / block_size)`` blocks on every rank (kv.capacity.rows_per_request), so
    ``--num-kv-tokens`` counts the whole group's tokens, and ``--kv-cache-memory`` is each
    rank's pool. (The row itself does not change with DCP: it is planned at TP1 DCP1, since
    hwrun's planner models vLLM's DCP carved out of a TP group, which the engine's is not.)"""
    group_block = layout.block_size * world
    per_sequence = -(-max_model_len // group_block)
    if config.num_kv_tokens is not None:
        return -(-config.num_kv_tokens // group_block)
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory // layout.row_bytes
    wanted = config.max_num_seqs * per_sequence
    return max(min(wanted, DEFAULT_POOL_BYTES // layout.row_bytes), per_sequence)


def build_model_runner(
    config: EngineConfig,
    plugins: PluginSet | None = None,
    shard: TensorShard | None = None,
    context: ContextShard | None = None,
) -> ModelRunner:
    """Start the engine's model side for ``config``; raises EngineStartupError (every reason).

    ``shard``: this process's rank of a tensor-parallel group (see ``tp_runner``); None runs the
    whole model here. ``context``: this process's rank of a decode-context-parallel group
    (a ``TokenShardedContext``); None keeps every token here.
    """
    problems = config.problems()
    if problems:
        raise EngineStartupError("the engine options cannot run", problems)
    model_dir = config.model_dir
    raw_config = read_config_json(model_dir)  # read once: the model's and the planner's view
    model_config = parse_model_config(raw_config, str(model_dir / "config.json"))
    plugins = plugins or load_plugins()
    platform = plugins.choose_platform(config.platform)
    target = plugins.target(platform)
    shard = shard or TensorShard()
    context = context or ContextShard()
    if shard.world > 1 and context.world > 1:
        raise EngineStartupError(
            "the engine options cannot run",
            ["a rank cannot be in a tensor-parallel and a decode-context-parallel group at once"],
        )
    device = torch.device(config.device or target.torch_device(max(shard.rank, context.rank)))
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    max_model_len = config.max_model_len or model_config.max_position_embeddings

    spec = spec_from_hf_config(
        raw_config, str(model_dir), config.kv_cache_dtype, config.index_dtype
    )
    layout = plan_packed_layout(spec, block_size=BLOCK_SIZE)
    num_blocks = _pool_blocks(config, layout, max_model_len, context.world)
    reasons = kernel_id_reasons(layout, num_blocks)
    group_block = context.scheduler_block_size(layout.block_size)
    if num_blocks * group_block < max_model_len:
        per_rank = "" if context.world == 1 else f" on each of {context.world} DCP ranks"
        reasons.append(
            f"a pool of {num_blocks} blocks{per_rank} ({group_block} tokens each) cannot hold "
            f"one sequence of max_model_len {max_model_len}; raise --num-kv-tokens / "
            f"--kv-cache-memory (a block is {layout.row_bytes} B) or lower --max-model-len"
        )
    if reasons:
        raise EngineStartupError(f"the KV pool for {model_dir} cannot be planned", reasons)

    weights = load_weights(model_dir, model_config, device, dtype)
    moe = [layer.mlp for layer in weights.layers if isinstance(layer.mlp, MoEWeights)]
    expert_format = moe[0].w13.format if moe else "bf16"
    linear_formats = quantized_linear_formats(weights)
    reasons = tp_reasons(model_config, shard.world, expert_format, linear_formats)
    if reasons:
        raise EngineStartupError(f"{model_dir} cannot run with --tp {shard.world}", reasons)
    # a8w8 needs block-FP8 weights: with bf16 projections the flag has nothing to change
    linear_a8w8 = config.linear_activation_dtype == "fp8" and bool(linear_formats)
    if linear_a8w8 and (reasons := a8w8_reasons(weights)):
        raise EngineStartupError(f"{model_dir} cannot run with fp8 linear activations", reasons)
    weights = shard_weights(weights, model_config, shard.rank, shard.world)
    expert_mode = "a8w8" if config.expert_activation_dtype == "fp8" else "bf16"
    if expert_mode == "a8w8" and (reasons := expert_a8w8_reasons(weights)):
        raise EngineStartupError(f"{model_dir} cannot run with fp8 expert activations", reasons)
    if shard.world == 1:  # tensor parallelism splits these projections each its own way
        weights = fuse_projections(weights)
    model_config = shard_config(model_config, shard.world)
    formats = ModelFormats(
        dtype=str(dtype).removeprefix("torch."),
        latent_format=config.kv_cache_dtype,
        index_format=config.index_dtype,
        expert_format=expert_format,
        block_size=layout.block_size,
        index_query_fp8=config.index_query_dtype == "fp8",
        linear_formats=linear_formats,
        linear_a8w8=linear_a8w8,
        expert_activation_mode=expert_mode,
    )
    arch = target.arch if device.type == target.device_type else None
    specs = engine_op_specs(model_config, formats, device.type, arch, context.world)
    ops = resolve_ops(
        plugins.registry(platform),
        specs,
        allow_fallback=config.allow_fallback and knobs.reference_fallback(),
        what=f"{model_dir.name} on platform {platform!r}",
        batch_invariant=config.batch_invariant,
    )
    weights = bind_linears(weights, ops, dtype, formats.linear_op)
    pool = KVPool(layout, num_blocks, allocate_cache(layout, num_blocks, device))
    model = DeepseekV32(
        model_config,
        weights,
        ops,
        formats,
        layout,
        pool.cache,
        config.batch_invariant,
        shard.all_reduce,
        context,
    )
    graphs, status = _decode_graphs(config, model, ops, device, max_model_len, layout.block_size)
    return ModelRunner(
        model, pool, model_config, ops, platform, max_model_len, graphs, status, config.cpu_threads
    )


def _decode_graphs(
    config: EngineConfig,
    model: DeepseekV32,
    ops: OpTable,
    device: torch.device,
    max_model_len: int,
    block_size: int,
) -> tuple[DecodeGraphs | None, str]:
    """Capture the decode graphs when asked, on CUDA, with graph-safe ops; else say why not."""
    if not config.cuda_graphs:
        return None, "off (--no-cuda-graphs)"
    if device.type != "cuda":
        return None, f"off (the model runs on {device.type!r}, not CUDA)"
    if model.context.world > 1:
        # the top-k merge decides its rounds on the host from the data: not capturable
        return None, "off (decode context parallelism: the top-k merge syncs with the host)"
    blockers = graph_blockers(ops)
    if blockers:
        return None, "off: " + "; ".join(blockers)
    graphs = DecodeGraphs(model, config.max_num_seqs, max_model_len, block_size)
    graphs.capture()
    return graphs, f"on: decode batch buckets {graphs.buckets}"
