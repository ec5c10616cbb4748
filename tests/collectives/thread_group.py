"""W ranks as threads of one process, for property tests that would be too slow as processes.

Each collective is a write into a shared table, a barrier, a read and a second barrier (so a
rank cannot overwrite a table its peers are still reading).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from hwrun.collectives.communicator import Communicator


class _Shared:
    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.table: list[Any] = [None] * world_size


class ThreadCommunicator(Communicator):
    def __init__(self, shared: _Shared, rank: int, world_size: int):
        self._shared, self._rank, self._world_size = shared, rank, world_size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def _exchange(self, value: Any) -> list[Any]:
        self._shared.table[self._rank] = value
        self._shared.barrier.wait()
        everyone = list(self._shared.table)
        self._shared.barrier.wait()
        return everyone

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack(self._exchange(x.clone()))

    def all_to_all(self, inputs, output_shapes) -> list[torch.Tensor]:
        sent = self._exchange([t.clone() for t in inputs])
        return [sent[p][self._rank].reshape(tuple(output_shapes[p])) for p in range(len(sent))]

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        stacked = torch.stack(self._exchange(x.clone()))
        return {"sum": stacked.sum(0), "max": stacked.amax(0), "min": stacked.amin(0)}[op]

    def barrier(self) -> None:
        self._exchange(None)


def run_threads(target: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """``[target(comm_r, *args) for every rank r]``, the ranks running concurrently."""
    shared = _Shared(world_size)
    results: list[Any] = [None] * world_size
    errors: list[BaseException] = []

    def main(rank: int) -> None:
        try:
            results[rank] = target(ThreadCommunicator(shared, rank, world_size), *args)
        except BaseException as exc:
            errors.append(exc)
            shared.barrier.abort()  # release the peers instead of leaving them waiting

    threads = [threading.Thread(target=main, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
