"""The communicator every distributed op takes, and its torch.distributed implementation.

A :class:`Communicator` is the four collectives hwrun's distributed ops need, nothing more, so a
plugin can provide a faster one (symmetric memory, vendor all-gather kernels) through the
``hwrun_communicator`` hook. :class:`TorchDistributedCommunicator` is the default: gloo on CPU,
NCCL (RCCL on ROCm builds of torch) on GPUs.

Failure bound: every collective of :class:`TorchDistributedCommunicator` is bounded by the
group's timeout. On gloo, a rank whose peer never enters a collective raises
:class:`CollectiveError` at most ``timeout_s`` after entering it; a peer that dies makes it raise
at once (the peer's sockets close). On NCCL the same timeout is enforced by torch's NCCL watchdog,
which tears the waiting process down with the timed-out collective named on stderr instead of
raising.
"""

from __future__ import annotations

import datetime
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from hwrun import knobs
from hwrun.errors import HwrunError

REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

# torch 2.13 renamed all_gather_into_tensor to all_gather_single and deprecated the old name;
# torch 2.11 (the H200 machine's) has only the old one.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CollectiveError(HwrunError):
    """A collective that could not complete: a peer failed, hung, or the inputs disagree."""


class Communicator(ABC):
    """A group of ``world_size`` ranks; this process is ``rank``.

    Every collective must be called by every rank of the group in the same order (that is what
    makes it a collective); tensors stay on the device they came from.
    """

    @property
    @abstractmethod
    def rank(self) -> int:
        """(required) This process's rank, 0 <= rank < world_size."""

    @property
    @abstractmethod
    def world_size(self) -> int:
        """(required) Number of ranks in the group (W)."""

    @abstractmethod
    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(required) Every rank's ``x`` stacked by rank: ``[W, *x.shape]``.

        ``x`` must have the same shape and dtype on every rank.
        """

    @abstractmethod
    def all_to_all(
        self, inputs: Sequence[torch.Tensor], output_shapes: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        """(required) Send ``inputs[s]`` to rank s; return what every rank p sent here.

        ``inputs`` has W tensors of one dtype, any shapes; ``output_shapes[p]`` is the shape of
        the tensor rank p sends to this rank (the caller knows it: hwrun's ops agree on sizes
        before they exchange data). Returns W tensors of those shapes, by sending rank.
        """

    @abstractmethod
    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """(required) Elementwise reduction of every rank's ``x`` (``op``: sum, max or min).

        Returns a new tensor; ``x`` is left as it was.
        """

    @abstractmethod
    def barrier(self) -> None:
        """(required) Return once every rank has called it."""


class TorchDistributedCommunicator(Communicator):
    """The default communicator: the torch.distributed default process group (or ``group``).

    Build it with :func:`init_torch_communicator`, or wrap a group a serving engine already
    initialized. ``timeout_s`` is only reported in error messages; the group's own timeout
    (``init_process_group(timeout=...)``) is what bounds each collective.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, timeout_s: float | None = None):
        if not dist.is_initialized():
            raise CollectiveError(
                "TorchDistributedCommunicator needs an initialized torch.distributed process "
                "group; call hwrun.collectives.communicator.init_torch_communicator(...) or "
                "torch.distributed.init_process_group(...) first"
            )
        self._group = group
        self._rank = dist.get_rank(group)
        self._world_size = dist.get_world_size(group)
        self._timeout_s = timeout_s

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.contiguous().reshape(-1)
        out = torch.empty(self._world_size * flat.numel(), dtype=x.dtype, device=x.device)
        self._run("all_gather", x, lambda: _all_gather_flat(out, flat, group=self._group))
        return out.view(self._world_size, *x.shape)

    def all_to_all(
        self, inputs: Sequence[torch.Tensor], output_shapes: Sequence[Sequence[int]]
    ) -> list[torch.Tensor]:
        if len(inputs) != self._world_size or len(output_shapes) != self._world_size:
            raise ValueError(
                f"all_to_all needs one input and one output shape per rank (W={self._world_size}),"
                f" got {len(inputs)} inputs and {len(output_shapes)} output shapes"
            )
        dtypes = {t.dtype for t in inputs}
        if len(dtypes) != 1:
            raise ValueError(
                f"all_to_all inputs must share one dtype, got {sorted(map(str, dtypes))}"
            )
        send = torch.cat([t.reshape(-1) for t in inputs])
        out_numels = [_numel(shape) for shape in output_shapes]
        recv = torch.empty(sum(out_numels), dtype=send.dtype, device=send.device)
        self._run(
            "all_to_all",
            send,
            lambda: dist.all_to_all_single(
                recv,
                send,
                output_split_sizes=out_numels,
                input_split_sizes=[t.numel() for t in inputs],
                group=self._group,
            ),
        )
        return [
            part.reshape(tuple(shape))
            for part, shape in zip(recv.split(out_numels), output_shapes, strict=True)
        ]

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op not in REDUCE_OPS:
            raise ValueError(f"all_reduce op must be one of {sorted(REDUCE_OPS)}, got {op!r}")
        out = x.clone()
        self._run("all_reduce", out, lambda: dist.all_reduce(out, REDUCE_OPS[op], self._group))
        return out

    def barrier(self) -> None:
        self._run("barrier", None, lambda: dist.barrier(group=self._group))

    def _run(self, name: str, x: torch.Tensor | None, call: Callable[[], object]) -> None:
        try:
            call()
        except Exception as exc:  # gloo raises RuntimeError subclasses with C++ context
            what = name if x is None else f"{name} of {x.dtype} {list(x.shape)}"
            bound = f" ({self._timeout_s:g} s)" if self._timeout_s is not None else ""
            raise CollectiveError(
                f"rank {self._rank} of {self._world_size}: {what} failed: {type(exc).__name__}: "
                f"{_first_line(exc)}. A peer that fails, or does not enter the collective within "
                f"the group timeout{bound}, ends it this way on every rank: check the other "
                "ranks' errors, and that every rank calls the same collectives in the same order "
                "with matching shapes."
            ) from exc


def init_torch_communicator(
    rank: int,
    world_size: int,
    init_method: str,
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
) -> TorchDistributedCommunicator:
    """Initialize torch.distributed's default group and wrap it.

    :param init_method: rendezvous URL, e.g. ``"tcp://127.0.0.1:29500"``.
    :param backend: ``"gloo"``, ``"nccl"``; None picks NCCL (RCCL on ROCm) when CUDA is
        available, else gloo.
    :param timeout_s: bound on every collective (see the module docstring); None reads
        ``HWRUN_COLLECTIVE_TIMEOUT_S``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout_s = knobs.collective_timeout_s() if timeout_s is None else timeout_s
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return TorchDistributedCommunicator(timeout_s=timeout_s)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no message"
