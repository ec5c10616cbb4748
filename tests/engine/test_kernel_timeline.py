"""bench/kernel_timeline.py: exposed time per kernel and the device's idle gaps, the figures
the kernel profile reports once kernels overlap (programmatic dependent launch, side stream)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from kernel_timeline import timeline


def test_back_to_back_kernels_are_charged_their_durations_and_gaps_are_idle():
    spans = timeline([("b", 12.0, 20.0), ("a", 0.0, 10.0), ("c", 20.0, 21.0)])
    assert spans.exposed_us == {"a": 10.0, "b": 8.0, "c": 1.0}
    assert spans.busy_us == 19.0
    assert spans.span_us == 21.0
    assert spans.gaps_us == [2.0]


def test_a_dependent_kernel_that_starts_early_is_charged_only_past_its_predecessor():
    # b launched while a runs (PDL) and waited inside until a's end: its duration is 13 us,
    # its exposed time 5
    spans = timeline([("a", 0.0, 10.0), ("b", 2.0, 15.0)])
    assert spans.exposed_us == {"a": 10.0, "b": 5.0}
    assert spans.busy_us == spans.span_us == 15.0
    assert spans.gaps_us == []


def test_a_kernel_inside_another_costs_nothing_and_repeats_add_up():
    # the side stream's kernel runs wholly under the main stream's one
    kernels = [("main", 0.0, 10.0), ("side", 3.0, 6.0), ("main", 30.0, 40.0), ("side", 41.0, 43.0)]
    spans = timeline(kernels)
    assert spans.exposed_us == {"main": 20.0, "side": 2.0}
    assert spans.launches == {"main": 2, "side": 2}
    assert spans.busy_us == 22.0
    assert spans.gaps_us == [20.0, 1.0]
    assert spans.idle_us(longest=5.0) == 1.0
    assert spans.span_us == 43.0


def test_no_kernels_and_a_bad_interval():
    empty = timeline([])
    assert (empty.busy_us, empty.span_us, empty.gaps_us) == (0.0, 0.0, [])
    with pytest.raises(ValueError, match="ends"):
        timeline([("k", 5.0, 4.0)])
