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

        def buffer(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = buffer(biggest, dtype=torch.int64)
        self.positions = buffer(biggest, dtype=torch.int64)
        self.slots = buffer(biggest, dtype=torch.int32)
        self.block_table = buffer(biggest, width, dtype=torch.int32)
        self.context_lens = buffer(biggest, dtype=torch.int32)
        self.rows = torch.arange(biggest, device=device)
        # The host side of each step's copies, pinned so that the copies are queued without
        # waiting for the device (see engine/host_copy.py), and two of each, alternating steps:
        # a step's buffers are written while the previous step's copy may not have run yet.
        self._host_tables = [
            torch.full((biggest, width), -1, dtype=torch.int32, pin_memory=True) for _ in range(2)
        ]
        self._host_rows = [
            torch.zeros((3, biggest), dtype=torch.int64, pin_memory=True) for _ in range(2)
        ]
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
        return self._host_tables[self._turn].numpy()[:batch]

    def run(
        self, input_ids: list[int] | torch.Tensor, positions: list[int], slots: list[int]
    ) -> torch.Tensor:
        """Replay the bucket for these B decode rows (context of row i: positions[i] + 1), their
        block tables already in ``host_tables(B)``; logits ``[B, V]`` float32. ``input_ids``
        may be a tensor on the device (copied there, never through the host)."""
        batch = len(positions)
        bucket = next(b for b in self.buckets if b >= batch)
        if batch < bucket:  # only the bucket's rows are read: five fills fewer when it is full
            self._pad(batch, bucket)
        on_device = isinstance(input_ids, torch.Tensor)
        turn = self._turn
        # One copy for the per-row values: each host-to-device copy costs microseconds.
        host_rows = self._host_rows[turn]
        host_values = host_rows.numpy()
        host_values[0, :batch] = positions
        host_values[1, :batch] = slots
        if not on_device:
            host_values[2, :batch] = input_ids
        rows = host_rows.to(self.input_ids.device, non_blocking=True)[:, :batch]
        self.block_table[:batch].copy_(self._host_tables[turn][:batch], non_blocking=True)
        self._copied[turn].record()
        self._turn = 1 - turn
        self.input_ids[:batch] = input_ids if on_device else rows[2]
        self.positions[:batch] = rows[0]
        self.slots[:batch] = rows[1].to(torch.int32)
        self.context_lens[:batch] = rows[0].to(torch.int32) + 1
        graph, logits = self._graphs[bucket]
        graph.replay()
        return logits[:batch].clone()
