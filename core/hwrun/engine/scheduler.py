"""Continuous batching: which sequences compute which positions in the next step.

Each step spends at most ``max_num_batched_tokens`` positions, in this order:

1. running sequences that decode (one uncomputed token), oldest first;
2. running sequences still in prefill, oldest first, each a chunk of what the budget leaves
   (chunked prefill);
3. waiting sequences, first come first served, while fewer than ``max_num_seqs`` run: each
   takes its cached prefix blocks, then a chunk of the rest. The queue head blocks the queue:
   when it cannot get blocks nothing behind it starts.

When a running sequence cannot get a block, the newest running sequence is preempted by
recompute: its blocks are freed, its chunk (if already scheduled) is dropped, and it goes back to
the front of the waiting queue with its tokens; its KV is computed again when it is readmitted
(its prefix mostly from the cache). When the sequence needing a block is itself the newest, it
preempts itself. No waiting sequence is admitted in a step that preempted.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.block_manager import BlockManager
from hwrun.engine.sequence import Sequence, SequenceStatus

PENDING_TOKEN = 0  # a chunk's token id placeholder while the token is still on the device


@dataclass
class ScheduledStep:
    """What one step computes: one chunk per scheduled sequence, in the same order."""

    seqs: list[Sequence]
    chunks: list[ScheduledChunk]

    @property
    def num_tokens(self) -> int:
        return sum(len(chunk.token_ids) for chunk in self.chunks)


class Scheduler:
    def __init__(
        self, block_manager: BlockManager, *, max_num_seqs: int, max_num_batched_tokens: int
    ):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the newest is last
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of the queues and free its blocks (finished or aborted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free_sequence(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> ScheduledStep:
        budget = self.max_num_batched_tokens
        planned: dict[int, int] = {}  # seq_id -> positions to compute this step
        preempted = False
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_allocate(seq, num_tokens):
                victim = self.running[-1]
                budget += planned.pop(victim.seq_id, 0)
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                self.block_manager.allocate(seq, num_tokens)
                planned[seq.seq_id] = num_tokens
                budget -= num_tokens

        while (
            not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            cached = self.block_manager.match_prefix(seq)
            num_tokens = min(seq.num_tokens - len(cached) * self.block_manager.block_size, budget)
            if not self.block_manager.can_allocate(seq, num_tokens, cached):
                break
            self.waiting.popleft()
            self.block_manager.allocate(seq, num_tokens, cached)
            served = min(seq.num_computed_tokens, seq.num_prompt_tokens)  # prompt tokens only
            seq.metrics.num_cached_tokens = max(seq.metrics.num_cached_tokens, served)
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            planned[seq.seq_id] = num_tokens
            budget -= num_tokens

        seqs = [s for s in self.running if s.seq_id in planned]
        return ScheduledStep(seqs, [self._chunk(s, planned[s.seq_id]) for s in seqs])

    def schedule_ahead(self, seqs: list[Sequence], ending: set[int]) -> ScheduledStep | None:
        """The decode step after a step of decodes of ``seqs``, made before that step's tokens
        reach the host (the engine's async scheduling): each sequence decodes its pending
        token at position ``num_computed_tokens``, except those in ``ending`` (seq ids whose
        pending token is their last). Chunk token ids are placeholders: the runner takes the
        tokens from the device. None unless this is the step :meth:`schedule` would make once
        the tokens are known (barring an end no one can foresee: eos, a stop): nothing is
        waiting, every running sequence is in ``seqs``, and each gets its block without a
        preemption (blocks taken before a refusal are the ones its next step would take)."""
        if self.waiting or len(self.running) != len(seqs):
            return None
        ahead = [seq for seq in seqs if seq.seq_id not in ending]
        if not ahead or len(ahead) > self.max_num_batched_tokens:
            return None
        for seq in ahead:
            if not self.block_manager.can_allocate(seq, 1):
                return None
            self.block_manager.allocate(seq, 1)
        chunks = [
            ScheduledChunk(
                seq_id=seq.seq_id,
                token_ids=[PENDING_TOKEN],
                start=seq.num_computed_tokens,
                block_table=seq.block_table,
                needs_logits=True,
                table_epoch=seq.table_epoch,
            )
            for seq in ahead
        ]
        return ScheduledStep(ahead, chunks)

    def _chunk(self, seq: Sequence, num_tokens: int) -> ScheduledChunk:
        start = seq.num_computed_tokens
        end = start + num_tokens
        return ScheduledChunk(
            seq_id=seq.seq_id,
            token_ids=seq.token_ids[start:end],
            start=start,
            # The sequence's own list, not a copy (2,048 ids at 128K tokens, per sequence per
            # step): chunks are built after every allocation of the step, a table only grows
            # at the next step's allocation, and freeing rebinds seq.block_table to a new list.
            block_table=seq.block_table,
            needs_logits=end == seq.num_tokens,
            all_logits=seq.needs_prompt_logprobs,
            table_epoch=seq.table_epoch,
        )

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free_sequence(seq)
        seq.status = SequenceStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
