"""The engine's model runner across a group of local processes: tensor or decode context
parallelism.

Rank 0 is the engine's own process: its scheduler and sampler run there as with one rank, and
:class:`ProcessGroupRunner` stands in for the model runner. Every ``execute`` sends the step's
chunks to the other ranks (one ``broadcast_object_list``) and runs rank 0's part; each worker
process (:func:`_worker_main`) runs the same step on its part, and the collectives inside the
model join them, so every rank ends with the whole model's logits. What a rank's part is depends
on the group (:func:`_rank_runner`): under tensor parallelism (``tensor_parallel``) a shard of
the heads and widths, joined by all-reduces (tensor_parallel.py); under decode context
parallelism (``decode_context_parallel``) the whole model over a shard of every request's
tokens, joined by the top-k merge, the LSE combine and the prefill context gather
(context_parallel.py). The workers start with the runner (one process per rank, ``spawn``ed so
they inherit no state; rank r uses GPU r) and stop when it closes, or with the engine's process
(they are daemons). torch.distributed joins them over loopback TCP: gloo on CPU, NCCL on GPUs,
every collective bounded by ``HWRUN_COLLECTIVE_TIMEOUT_S``.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
from typing import Any

import torch
import torch.distributed as dist

from hwrun.collectives.communicator import init_torch_communicator
from hwrun.engine import model_runner
from hwrun.engine.batch import ChunkLogits, ScheduledChunk
from hwrun.engine.config import EngineConfig
from hwrun.engine.context_parallel import TokenShardedContext
from hwrun.engine.model_runner import ModelRunner, TensorShard
from hwrun.engine.op_table import EngineStartupError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(config: EngineConfig) -> str:
    on_cpu = (config.device or "").startswith("cpu") or not torch.cuda.is_available()
    return "gloo" if on_cpu else "nccl"


def group_size(config: EngineConfig) -> int:
    """Processes ``config`` runs on (tensor and decode context parallelism do not combine yet:
    ``EngineConfig.problems`` refuses both above 1)."""
    return config.tensor_parallel * config.decode_context_parallel


def _rank_runner(config: EngineConfig, rank: int, world: int, init_method: str) -> ModelRunner:
    """Join the group as ``rank`` and build this rank's model runner."""
    backend = _backend(config)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    comm = init_torch_communicator(rank, world, init_method, backend=backend)
    build = model_runner.build_model_runner  # looked up at the call: tests replace it
    if config.decode_context_parallel > 1:
        return build(config, context=TokenShardedContext(comm))
    return build(config, shard=TensorShard(rank, world, comm.all_reduce))


def _worker_main(config: EngineConfig, rank: int, world: int, init_method: str) -> None:
    runner = _rank_runner(config, rank, world, init_method)
    while True:
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0)
        if message[0] is None:
            break
        runner.execute(message[0])
    dist.destroy_process_group()


def build_runner(config: EngineConfig) -> ModelRunner | ProcessGroupRunner:
    """The model runner ``config`` asks for: one process, or a group of them.
    (``build_model_runner`` is looked up on its module at the call, so tests can replace it.)"""
    if group_size(config) > 1:
        return ProcessGroupRunner(config)
    return model_runner.build_model_runner(config)


class ProcessGroupRunner:
    """Rank 0's runner: the model runner's interface over ``group_size(config)`` processes."""

    def __init__(self, config: EngineConfig):
        problems = config.problems()
        if problems:  # before any process starts
            raise EngineStartupError("the engine options cannot run", problems)
        world = group_size(config)
        if world < 2:
            raise ValueError(
                f"a process group needs at least 2 ranks, got {world} (--tensor-parallel-size "
                f"{config.tensor_parallel}, --decode-context-parallel-size "
                f"{config.decode_context_parallel})"
            )
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = mp.get_context("spawn")
        self._workers = [
            context.Process(
                target=_worker_main,
                args=(config, rank, world, init_method),
                name=f"hwrun-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, world)
        ]
        for worker in self._workers:
            worker.start()
        self.local: ModelRunner = _rank_runner(config, 0, world, init_method)
        self.world = world
        self._open = True

    def __getattr__(self, name: str) -> Any:  # block_size, num_blocks, op_table, ...
        if name == "local":  # not built (yet): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.local, name)

    def execute(self, chunks: list[ScheduledChunk]) -> list[ChunkLogits]:
        for chunk in chunks:
            self.local.check(chunk)  # a step no rank can run is refused before the workers see it
        dist.broadcast_object_list([chunks], src=0)
        return self.local.execute(chunks)

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        if not self._open:
            return
        self._open = False
        dist.broadcast_object_list([None], src=0)
        for worker in self._workers:
            worker.join(timeout=30)
        dist.destroy_process_group()
