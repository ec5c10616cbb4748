"""bench/engine_decode.py's ``--host-profile`` phases on the CPU, over a stand-in for the decode
graphs: every phase it times must be a call the runner still makes on a replayed step (the
ninth session's bench raised KeyError on the H200 once the per-chunk checks became one pass),
and the runner must get its own methods back afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import engine_decode

from tests.engine.test_model_runner import RecordingGraphs, _runner


class _Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


class ReplayingGraphs(RecordingGraphs):
    """RecordingGraphs whose run replays a graph of ``_graphs``, as DecodeGraphs.run does."""

    def __init__(self, batch: int = 8):
        super().__init__(batch)
        self._graphs = {batch: (_Graph(), self.logits)}

    def run(self, input_ids, positions, slots) -> torch.Tensor:
        self._graphs[self.tables.shape[0]][0].replay()
        return super().run(input_ids, positions, slots)


def test_host_phases_time_every_phase_and_restore_the_runner(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    graphs = ReplayingGraphs()
    runner = _runner(graphs)
    phases = engine_decode.host_phases(runner, batch=2, context=40, steps=5)
    assert set(phases) == {
        "checks",
        "block tables",
        "run before the replay",
        "replay call",
        "execute, the rest",
        "wait for the device",
        "step",
    }
    assert all(value >= 0 for value in phases.values())
    assert phases["step"] >= phases["checks"] + phases["block tables"]
    # 8 timed steps and the profiled one, each one replay; the timing wrappers are gone
    assert graphs._graphs[8][0].replays == 9
    assert "_decode_inputs" not in vars(runner) and "run" not in vars(graphs)
    assert "fill" not in vars(runner.block_tables)
