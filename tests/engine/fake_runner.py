"""A model runner that checks block tables: its "KV" is the token ids themselves.

It keeps a pool ``[num_blocks, block_size]`` of token ids, writes every chunk's tokens at the
slots its block table gives, and computes the logits of a position from the tokens it reads
back from the pool at positions ``0..pos`` through the block table (a hash of that history
seeds them). A block-table bug (a shared prefix block overwritten, a freed block reused while
still referenced, a cached block whose contents changed) changes what is read back, hence the
logits and the tokens: chunked prefill, prefix caching and preemption must give exactly the
tokens of a plain run.
"""

from __future__ import annotations

import hashlib
import threading

import torch

from hwrun.engine.batch import ChunkLogits, ScheduledChunk
from hwrun.engine.op_table import OpChoice


def history_logits(history: list[int], vocab_size: int) -> torch.Tensor:
    """Deterministic logits ``[V]`` of a token history (what a real model would compute)."""
    digest = hashlib.blake2b(torch.tensor(history, dtype=torch.int64).numpy().tobytes())
    generator = torch.Generator().manual_seed(int.from_bytes(digest.digest()[:8], "little") >> 1)
    return torch.randn(vocab_size, generator=generator) * 3.0


class FakeRunner:
    device_token_inputs = True  # execute(chunks, input_ids=...), as ModelRunner

    def __init__(
        self,
        *,
        num_blocks: int = 64,
        block_size: int = 4,
        vocab_size: int = 50,
        max_model_len: int = 256,
        eos_token_id: int | None = None,
    ):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.eos_token_ids = () if eos_token_id is None else (eos_token_id,)
        self.eos_token_id = eos_token_id
        self.device = torch.device("cpu")
        self.op_table = [OpChoice("sparse_mla.decode", "fake", "reference", False)]
        self.pool = torch.full((num_blocks, block_size), -1, dtype=torch.int64)
        self.steps: list[list[ScheduledChunk]] = []
        self.ahead_steps = 0  # steps whose token ids came as a tensor (async scheduling)
        self.gate: threading.Event | None = None  # when set by a test, execute waits on it

    def slot(self, block_table: list[int], position: int) -> tuple[int, int]:
        index = position // self.block_size
        assert index < len(block_table), f"position {position} beyond block table {block_table}"
        return block_table[index], position % self.block_size

    def execute(
        self, chunks: list[ScheduledChunk], input_ids: torch.Tensor | None = None
    ) -> list[ChunkLogits]:
        if self.gate is not None:
            self.gate.wait()
        self.steps.append(chunks)
        if input_ids is not None:  # a step launched ahead: its tokens came from the "device"
            assert all(c.is_decode for c in chunks) and len(input_ids) == len(chunks)
            self.ahead_steps += 1
        for row, chunk in enumerate(chunks):
            tokens = chunk.token_ids if input_ids is None else [int(input_ids[row])]
            for offset, token in enumerate(tokens):
                self.pool[self.slot(chunk.block_table, chunk.start + offset)] = token
        # One tensor of the step's logits, each chunk naming its rows, as the model runner's
        results, rows = [], []
        for chunk in chunks:
            positions = range(chunk.start, chunk.end) if chunk.all_logits else [chunk.end - 1]
            if not (chunk.needs_logits or chunk.all_logits):
                results.append(ChunkLogits(chunk.seq_id, None))
                continue
            first = len(rows)
            rows += [self.logits_at(chunk.block_table, p) for p in positions]
            results.append(ChunkLogits(chunk.seq_id, None, range(first, len(rows))))
        step = torch.stack(rows) if rows else None
        for result in results:
            if result.rows:
                result.step_logits = step
        return results

    def logits_at(self, block_table: list[int], position: int) -> torch.Tensor:
        history = [int(self.pool[self.slot(block_table, p)]) for p in range(position + 1)]
        return history_logits(history, self.vocab_size)
