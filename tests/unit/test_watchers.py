"""The replica's WatchDecisions clients: the open-watch gauge follows every add and remove, and a watcher that
falls behind loses events (counted) without holding up the others."""

from __future__ import annotations

from controlplane.api.v1 import common_pb2
from controlplane.observability.metrics import ControllerMetrics
from controlplane.service.watchers import Pushed, Watchers


def _value(metrics: ControllerMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    assert value is not None, name
    return value


def test_the_gauge_counts_open_watches_and_a_full_queue_drops_only_its_own_events() -> None:
    metrics = ControllerMetrics()
    watchers = Watchers(metrics)
    assert _value(metrics, "cp_decision_watchers") == 0
    slow, fast = watchers.add(), watchers.add()
    assert _value(metrics, "cp_decision_watchers") == 2
    event = Pushed("e1", "m|a", common_pb2.Decision(version=1))
    while not slow.full():
        slow.put_nowait(event)
    watchers.hand_on(event)
    assert fast.qsize() == 1 and _value(metrics, "cp_watch_events_dropped_total") == 1
    watchers.remove(slow)
    watchers.remove(slow)  # a second remove of the same watch changes nothing
    assert _value(metrics, "cp_decision_watchers") == 1
    watchers.remove(fast)
    assert _value(metrics, "cp_decision_watchers") == 0
