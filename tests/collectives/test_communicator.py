"""The communicator: plugin choice through hwrun_communicator, and the default's own checks."""

import socket
import textwrap

import pytest
import torch

from hwrun.collectives import dcp
from hwrun.collectives.communicator import CollectiveError, init_torch_communicator
from hwrun.plugins import load_plugins

PLUGIN = """
from hwrun.hookspecs import hookimpl
from hwrun.platform import PlatformInfo
from hwrun.collectives.communicator import Communicator

class Loopback(Communicator):
    def __init__(self, rank, world_size):
        self._rank, self._world_size = rank, world_size
    rank = property(lambda self: self._rank)
    world_size = property(lambda self: self._world_size)
    def all_gather(self, x):
        return x.unsqueeze(0)
    def all_to_all(self, inputs, output_shapes):
        return list(inputs)
    def all_reduce(self, x, op="sum"):
        return x.clone()
    def barrier(self):
        pass

@hookimpl
def hwrun_api_version():
    return "1.0"

@hookimpl
def hwrun_platform():
    return PlatformInfo(name="{name}", vendor="test", description="test", device_source="none")

@hookimpl
def hwrun_communicator(world_size, rank):
    return Loopback({rank_expr}, world_size)
"""


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = []
    for name, rank_expr in (("loopback", "rank"), ("liar", "rank + 1")):
        module = f"hwrun_test_comm_{name}"
        body = PLUGIN.format(name=name, rank_expr=rank_expr)
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
        modules.append(module)
    return load_plugins(modules)


def test_a_platform_communicator_is_used(plugins) -> None:
    comm = plugins.communicator("loopback", 1, 0)
    assert type(comm).__name__ == "Loopback"
    assert dcp.topk_merge(comm, torch.tensor([[3.0, 1.0, 2.0]]), 2).local_indices.tolist() == [
        [0, 2]
    ]


def test_a_communicator_for_another_rank_is_refused(plugins) -> None:
    with pytest.raises(CollectiveError, match=r"asked for rank 0 of 1.*'liar' is rank 1 of 1"):
        plugins.communicator("liar", 1, 0)


def test_the_default_needs_an_initialized_group(plugins) -> None:
    with pytest.raises(CollectiveError, match="init_torch_communicator"):
        plugins.communicator("reference", 2, 0)


def test_the_default_checks_its_arguments() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    comm = init_torch_communicator(0, 1, f"tcp://127.0.0.1:{port}", backend="gloo", timeout_s=5)
    try:
        assert comm.all_gather(torch.arange(3)).tolist() == [[0, 1, 2]]
        with pytest.raises(ValueError, match="one input and one output shape per rank"):
            comm.all_to_all([torch.zeros(1), torch.zeros(1)], [(1,)])
        with pytest.raises(ValueError, match="one of"):
            comm.all_reduce(torch.zeros(1), "mean")
        with pytest.raises(CollectiveError, match=r"rank 0 of 1: all_to_all .* failed"):
            comm.all_to_all([torch.zeros(3)], [(4,)])  # sizes that disagree
    finally:
        torch.distributed.destroy_process_group()
