"""Outputs keep the request's times as they were when made."""

from dataclasses import fields

from hwrun.engine.outputs import RequestMetrics


def test_a_metrics_snapshot_is_an_equal_copy_that_later_changes_do_not_reach():
    metrics = RequestMetrics(1.0, 2.0, 3.0, None, num_cached_tokens=64, num_preemptions=1)
    snapshot = metrics.snapshot()
    assert snapshot == metrics and snapshot is not metrics
    assert [f.name for f in fields(snapshot)] == [f.name for f in fields(metrics)]
    metrics.finished_time, metrics.num_preemptions = 4.0, 2
    assert snapshot.finished_time is None and snapshot.num_preemptions == 1
