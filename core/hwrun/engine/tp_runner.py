"""The engine's model runner across a tensor-parallel group of local processes.

Rank 0 is the engine's own process: its scheduler and sampler run there as with one rank, and
:class:`TensorParallelRunner` stands in for the model runner. Every ``execute`` sends the step's
chunks to the other ranks (one ``broadcast_object_list``) and runs rank 0's shard; each worker
process (:func:`_worker_main`) runs the same step on its shard, and the all-reduces inside the
model join them, so every rank ends with the whole model's logits. The workers start with the
runner (one process per rank, ``spawn``ed so they inherit no state; rank r uses GPU r) and stop
when it closes, or with the engine's process (they are daemons). torch.distributed joins them
over loopback TCP: gloo on CPU, NCCL on GPUs, every collective bounded by
``HWRUN_COLLECTIVE_TIMEOUT_S``.
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
from hwrun.engine.model_runner import ModelRunner, TensorShard


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(config: EngineConfig) -> str:
    on_cpu = (config.device or "").startswith("cpu") or not torch.cuda.is_available()
    return "gloo" if on_cpu else "nccl"


def _join(config: EngineConfig, rank: int, world: int, init_method: str) -> TensorShard:
    backend = _backend(config)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    comm = init_torch_communicator(rank, world, init_method, backend=backend)

    def all_reduce(x: torch.Tensor) -> torch.Tensor:
        return comm.all_reduce(x)

    return TensorShard(rank, world, all_reduce)


def _worker_main(config: EngineConfig, rank: int, world: int, init_method: str) -> None:
    shard = _join(config, rank, world, init_method)
    runner = model_runner.build_model_runner(config, shard=shard)
    while True:
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0)
        if message[0] is None:
            break
        runner.execute(message[0])
    dist.destroy_process_group()


def build_runner(config: EngineConfig) -> ModelRunner | TensorParallelRunner:
    """The model runner ``config`` asks for: one process, or ``tensor_parallel`` of them.
    (``build_model_runner`` is looked up on its module at the call, so tests can replace it.)"""
    if config.tensor_parallel > 1:
        return TensorParallelRunner(config, config.tensor_parallel)
    return model_runner.build_model_runner(config)


class TensorParallelRunner:
    """Rank 0's runner: the model runner's interface over ``world`` processes."""

    def __init__(self, config: EngineConfig, world: int):
        if world < 2:
            raise ValueError(f"a tensor-parallel group needs at least 2 ranks, got {world}")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        context = mp.get_context("spawn")
        self._workers = [
            context.Process(
                target=_worker_main,
                args=(config, rank, world, init_method),
                name=f"hwrun-tp-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, world)
        ]
        for worker in self._workers:
            worker.start()
        self.local: ModelRunner = model_runner.build_model_runner(
            config, shard=_join(config, 0, world, init_method)
        )
        self.world = world
        self._open = True

    def __getattr__(self, name: str) -> Any:  # block_size, num_blocks, op_table, ...
        if name == "local":  # not built (yet): no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.local, name)

    def execute(self, chunks: list[ScheduledChunk]) -> list[ChunkLogits]:
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
