"""A rank that stalls or dies mid-collective ends the collective on every rank, in bounded time.

The bound: a rank raises CollectiveError at most the group timeout after it enters a collective
a peer will not complete (at once when the peer's process is gone). SLACK_S covers scheduling
on a loaded two-core machine.
"""

import re

import pytest

from hwrun.collectives.launch import spawn_group
from hwrun.errors import HwrunError

from .group_checks import die_before_merge, stall_then_merge

TIMEOUT_S = 2.0
SLACK_S = 2.0


def test_a_stalled_rank_makes_every_rank_raise_within_the_timeout() -> None:
    ranks = spawn_group(stall_then_merge, 3, (1, 3 * TIMEOUT_S), timeout_s=TIMEOUT_S)
    for rank, outcome in enumerate(ranks):
        assert outcome["error"] is not None, f"rank {rank}'s merge completed without its peer"
        assert f"rank {rank} of 3: all_gather" in outcome["error"]
        assert outcome["elapsed_s"] <= TIMEOUT_S + SLACK_S, (rank, outcome)


def test_a_dead_rank_makes_the_others_raise_and_is_reported() -> None:
    with pytest.raises(HwrunError) as failure:
        spawn_group(die_before_merge, 3, (1,), timeout_s=TIMEOUT_S, deadline_s=120.0)
    message = str(failure.value)
    assert "rank 1: no result (exit code 3)" in message
    for rank in (0, 2):
        found = re.search(rf"rank {rank}: CollectiveError: failed after ([0-9.]+) s", message)
        assert found, message
        assert float(found.group(1)) <= TIMEOUT_S + SLACK_S
