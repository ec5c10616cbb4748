"""Decode steps replayed from CUDA graphs, one captured per batch-size bucket.

A decode step of B sequences is padded to the smallest bucket >= B and replayed from static
buffers. Padding rows write nothing (slot -1), see an empty context (length 0: no index key is
scored, no latent row attended) and their logits are dropped. The attention's context bound is
``max_model_len`` in every bucket, so one graph serves every context length.

Capture needs every op of the decode path to be graph-safe (``OpImpl.graph_safe``: no host
synchronisation, no data-dependent allocation); :func:`graph_blockers` names those that are not,
and the engine then runs its decode steps eagerly.
"""

from __future__ import annotations

import numpy as np
import torch

from hwrun.engine.model import DecodeRows, DeepseekV32, StepMetadata
from hwrun.engine.op_table import OpTable

DECODE_OPS = (
    "dense.linear",
    "dense.linear_a8w8",
    "kv.write_latent",
    "kv.write_index_keys",
    "indexer.logits_paged",
    "indexer.topk",
    "indexer.to_slots",
    "sparse_mla.decode",
    "moe.route",
    "moe.experts",
)
BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


def graph_blockers(ops: OpTable) -> list[str]:
    """The decode-path impls that cannot be captured, as reasons (empty: all can)."""
    return [
        f"{choice.op} is served by {choice.platform}:{choice.impl}, which is not graph-safe"
        for choice in ops.choices
        if choice.op in DECODE_OPS and not ops.graph_safe(choice.op)
    ]


class DecodeGraphs:
    """Captured decode steps for batch sizes up to ``max_batch``."""

    def __init__(self, model: DeepseekV32, max_batch: int, max_model_len: int, block_size: int):
        self.model = model
        self.max_context = max_model_len
        self.buckets = [b for b in BUCKETS if b < max_batch] + [max_batch]
        device = model.weights.embed.device
        biggest, width = self.buckets[-1], -(-max_model_len // block_size)

        # The per-row inputs and the block tables are regions of one byte buffer, filled each
        # step by one copy from the host: a copy per input (a conversion or fill each, at
        # first) cost ~0.3 ms of host time a step on the H200's host, and with three copies
        # (two row buffers and the tables) the host still spent 89 us in run() before the
        # replay (64 x 32K, 2026-12-04), ~12 us of it per copy call.
        self._layout = _InputLayout(biggest, width)
        self._inputs = torch.zeros(self._layout.nbytes, dtype=torch.uint8, device=device)
        self._rows64, self._rows32, self.block_table = self._layout.views(self._inputs)
        self.input_ids, self.positions = self._rows64
        self.slots, self.context_lens = self._rows32
        self.rows = torch.arange(biggest, device=device)
        # Its host side, pinned so that the copy is queued without waiting for the device (see
        # engine/host_copy.py), and two of it, alternating steps: a step's inputs are written
        # while the previous step's copy may not have run yet.
        self._host_inputs = [
            torch.zeros(self._layout.nbytes, dtype=torch.uint8, pin_memory=True) for _ in range(2)
        ]
        self._host_views = [
            tuple(view.numpy() for view in self._layout.views(host)) for host in self._host_inputs
        ]
        for _, _, tables in self._host_views:
            tables.fill(-1)
        self._copied = [torch.cuda.Event(), torch.cuda.Event()]  # unrecorded: no wait
        self._turn = 0
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def _metadata(self, batch: int) -> StepMetadata:
        rows = self.rows[:batch]
        decode = DecodeRows(
            rows, self.block_table[:batch], self.context_lens[:batch], self.max_context
        )
        return StepMetadata(
            self.input_ids[:batch], self.positions[:batch], self.slots[:batch], decode, None, rows
        )

    def _pad(self, start: int, end: int | None = None) -> None:
        """Rows ``[start, end)`` as padding (write nothing, attend nothing)."""
        rows = slice(start, end)
        self.input_ids[rows] = 0
        self.positions[rows] = 0
        self.slots[rows] = -1
        self.block_table[rows] = -1
        self.context_lens[rows] = 0

    def capture(self) -> None:
        """Capture every bucket, largest first, sharing one memory pool."""
        self._pad(0)
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for batch in reversed(self.buckets):
                self.model.forward(self._metadata(batch))  # warm-up: compile, allocate
        torch.cuda.current_stream().wait_stream(stream)
        for batch in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self.model.forward(self._metadata(batch))
            pool = graph.pool()
            self._graphs[batch] = (graph, logits)
        torch.cuda.synchronize()

    def fits(self, batch: int) -> bool:
        return batch <= self.buckets[-1]

    def host_tables(self, batch: int) -> np.ndarray:
        """The host buffer the next :meth:`run` copies block tables from: int32 ``[batch,
        width]``. Waits for that buffer's copy two steps back, long done in practice."""
        self._copied[self._turn].synchronize()
        return self._host_views[self._turn][2][:batch]

    def run(
        self, input_ids: list[int] | torch.Tensor, positions: list[int], slots: list[int]
    ) -> torch.Tensor:
        """Replay the bucket for these B decode rows (context of row i: positions[i] + 1), their
        block tables already in ``host_tables(B)``; logits ``[B, V]`` float32. ``input_ids``
        may be a tensor on the device (copied there, never through the host)."""
        batch = len(positions)
        bucket = next(b for b in self.buckets if b >= batch)
        on_device = isinstance(input_ids, torch.Tensor)
        turn = self._turn
        rows64, rows32, tables = self._host_views[turn]
        # Rows [batch, bucket) are padding: write nothing (slot -1), attend nothing (length 0).
        if not on_device:
            rows64[0, :batch] = input_ids
        rows64[0, batch:bucket] = 0
        rows64[1, :batch] = positions
        rows64[1, batch:bucket] = 0
        rows32[0, :batch] = slots
        rows32[0, batch:bucket] = -1
        rows32[1, :batch] = rows64[1, :batch] + 1
        rows32[1, batch:bucket] = 0
        tables[batch:bucket] = -1
        nbytes = self._layout.prefix_bytes(bucket)
        self._inputs[:nbytes].copy_(self._host_inputs[turn][:nbytes], non_blocking=True)
        self._copied[turn].record()
        self._turn = 1 - turn
        if on_device:  # after the copy above, which wrote the host's stale ids there
            self.input_ids[:batch].copy_(input_ids)
        graph, logits = self._graphs[bucket]
        graph.replay()
        # The copy stays: the next replay overwrites the graph's buffer, and the engine reads a
        # step's logits after queuing the next one (async scheduling computes a step's logprobs
        # once the step after it is launched) or keeps them (tests compare steps). It is the
        # only copy of the rows: the chunks name their rows of it, and the sampler takes it
        # whole (batch.last_position_logits).
        return logits[:batch].clone()


class _InputLayout:
    """Where a decode step's inputs sit in their byte buffer: int64 ``[2, rows]`` (token ids,
    positions), int32 ``[2, rows]`` (slots, context lengths), then int32 ``[rows, width]``
    (block tables), each region starting on a 256-byte boundary (as an allocation would)."""

    ALIGN = 256

    def __init__(self, rows: int, width: int):
        self.rows, self.width = rows, width
        self.rows32_at = self._aligned(2 * rows * 8)
        self.tables_at = self._aligned(self.rows32_at + 2 * rows * 4)
        self.nbytes = self.tables_at + rows * width * 4

    def prefix_bytes(self, rows: int) -> int:
        """The bytes a step of ``rows`` rows copies: every per-row input, then the first
        ``rows`` tables (a prefix of the tables' region)."""
        return self.tables_at + rows * self.width * 4

    def _aligned(self, offset: int) -> int:
        return -(-offset // self.ALIGN) * self.ALIGN

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows, width = self.rows, self.width
        rows64 = buffer[: 2 * rows * 8].view(torch.int64).view(2, rows)
        rows32 = buffer[self.rows32_at : self.rows32_at + 2 * rows * 4].view(torch.int32)
        tables = buffer[self.tables_at :].view(torch.int32).view(rows, width)
        return rows64, rows32.view(2, rows), tables
