"""Where a decode step's device time goes when kernels overlap: each kernel's exposed time and
the device's idle gaps, from the kernels' start and end times.

A kernel profile that sums each kernel's duration double-counts once kernels overlap: with
programmatic dependent launch (kernels/triton/pdl.py) a kernel starts while the one before it
still runs and waits inside, so its duration holds the wait; with the decode side stream two
kernels run at once. Here kernels are taken in order of their start, and each is charged only
the time past every earlier kernel's end (its exposed time), so the charges add up to the time
the device was busy. What is left of the span are the gaps where no kernel ran: launch
bubbles within a step, and the host's time between steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Timeline:
    exposed_us: dict[str, float] = field(default_factory=dict)  # by kernel name
    launches: dict[str, int] = field(default_factory=dict)
    busy_us: float = 0.0  # union of the kernels' intervals
    span_us: float = 0.0  # first start to last end
    gaps_us: list[float] = field(default_factory=list)  # idle stretches, in time order

    def idle_us(self, longest: float) -> float:
        """Idle time in gaps no longer than ``longest`` us (a step's launch bubbles, without
        the host's time between synchronous steps)."""
        return sum(gap for gap in self.gaps_us if gap <= longest)


def timeline(kernels: Iterable[tuple[str, float, float]]) -> Timeline:
    """``kernels``: (name, start us, end us) in any order."""
    result = Timeline()
    covered = None  # the latest end among the kernels seen so far
    first = None
    for name, start, end in sorted(kernels, key=lambda k: (k[1], k[2])):
        if end < start:
            raise ValueError(f"kernel {name!r} ends ({end}) before it starts ({start})")
        if covered is None:
            first, covered = start, start
        elif start > covered:
            result.gaps_us.append(start - covered)
        exposed = max(0.0, end - max(start, covered))
        result.exposed_us[name] = result.exposed_us.get(name, 0.0) + exposed
        result.launches[name] = result.launches.get(name, 0) + 1
        result.busy_us += exposed
        covered = max(covered, end)
    if first is not None:
        result.span_us = covered - first
    return result
