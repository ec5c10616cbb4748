"""One scripted run of the model runner, on one rank or on every rank of a DCP group, that
records the logits and the DSA selection of every decode row (for test_decode_context_parallel).

Kept apart from the test module so the ranks (spawn_group processes) import no transformers.
"""

from __future__ import annotations

import torch

from hwrun.collectives import dcp
from hwrun.collectives.communicator import Communicator
from hwrun.engine.batch import ScheduledChunk
from hwrun.engine.config import EngineConfig
from hwrun.engine.context_parallel import TokenShardedContext
from hwrun.engine.model_runner import ModelRunner, build_model_runner

# Four sequences: a prompt prefilled in two chunks (the second beside two other sequences' whole
# prompts: three contexts gathered in one step), a 20-token prompt, a 2-token prompt whose first
# decodes see contexts shorter than W and than k (ranks holding none of its tokens), and a
# 1-token prompt prefilled alone (ranks with no row to gather).
PROMPT_LENS = (50, 20, 2, 1)
FIRST_CHUNK = 30
PREFILL_STEPS = 3  # the steps before the decodes
DECODE_STEPS = 8


def flags(path: str) -> dict:
    return dict(model=path, platform="reference", num_kv_tokens=16 * 64)


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    total = [n + DECODE_STEPS for n in PROMPT_LENS]
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in total]


def _block_tables(runner: ModelRunner) -> list[list[int]]:
    """Distinct blocks per sequence, taken from the end of the pool (never 0, 1, 2, ...)."""
    free = list(range(runner.num_blocks - 1, -1, -1))
    tables = []
    for length in (n + DECODE_STEPS for n in PROMPT_LENS):
        needed = -(-length // runner.block_size)
        tables.append(free[:needed])
        free = free[needed:]
    return tables


def run_steps(runner: ModelRunner, tokens: list[list[int]]) -> dict:
    """Prefill, then decode every sequence together; returns the logits of every step (lists)
    and the token positions each decode row attends to, per ``indexer.to_slots`` call (one per
    layer and decode step), as this rank's global positions."""
    context = runner.model.context
    tables = _block_tables(runner)
    selections: list[list[list[int]]] = []
    to_slots = runner.model.ops["indexer.to_slots"]

    def recording(positions, block_table, block_size):
        global_positions = dcp.local_to_global(positions.long(), context.rank, context.world)
        selections.append([sorted(p for p in row if p >= 0) for row in global_positions.tolist()])
        return to_slots(positions, block_table, block_size)

    a, b, c, d = tokens
    steps = [
        [ScheduledChunk(0, a[:FIRST_CHUNK], 0, tables[0], False)],
        [
            ScheduledChunk(0, a[FIRST_CHUNK : PROMPT_LENS[0]], FIRST_CHUNK, tables[0], True, True),
            ScheduledChunk(1, b[: PROMPT_LENS[1]], 0, tables[1], True, True),
            ScheduledChunk(2, c[: PROMPT_LENS[2]], 0, tables[2], True, True),
        ],
        [ScheduledChunk(3, d[: PROMPT_LENS[3]], 0, tables[3], True, True)],
    ]
    for i in range(DECODE_STEPS):
        steps.append(
            [
                ScheduledChunk(s, seq[n + i : n + i + 1], n + i, tables[s], True)
                for s, (seq, n) in enumerate(zip(tokens, PROMPT_LENS, strict=True))
            ]
        )
    logits = []
    with runner.model.ops.replaced({"indexer.to_slots": recording}):
        for step in steps:
            out = runner.execute(step)
            logits.append([None if o.logits is None else o.logits.tolist() for o in out])
    return {"logits": logits, "selections": selections}


def rank_main(comm: Communicator, paths: list[str], tie_rule_control: bool) -> list[dict]:
    """Every checkpoint's :func:`run_steps` on this DCP rank; with ``tie_rule_control``, also
    with a merge that breaks equal scores by rank instead of by token position."""
    results = []
    for path in paths:
        runner = build_model_runner(EngineConfig(**flags(path)), context=TokenShardedContext(comm))
        tokens = prompts(runner.vocab_size)
        result = run_steps(runner, tokens)
        if tie_rule_control:
            runner.model.context.select = _rank_major_merge(comm)
            result["control"] = run_steps(runner, tokens)
        results.append(result)
    return results


def _rank_major_merge(comm: Communicator):
    """A plausible wrong merge (the negative control): gather every rank's scores and take the
    top-k of them laid out rank after rank, so equal scores go to the lower rank first instead
    of to the smaller token position."""

    def select(ops, logits, context_lens, k, starts=None):
        gathered = comm.all_gather(logits)  # [W, R, L_local]
        world, rows, width = gathered.shape
        flat = gathered.permute(1, 0, 2).reshape(rows, world * width)
        starts = torch.zeros(rows, dtype=torch.int32)
        best = ops["indexer.topk"](flat, starts, torch.full_like(starts, world * width), k).long()
        scored = flat.gather(1, best) > float("-inf")  # not a column past a rank's tokens
        mine = scored & ((best // width) == comm.rank)
        return torch.where(mine, best % width, -1).to(torch.int32)

    return select
