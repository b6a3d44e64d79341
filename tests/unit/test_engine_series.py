"""The per-engine metrics table (`observability/engine_series.py`): its fast text is valid Prometheus text
with the same samples the registry collects, rows are forgotten on eviction, and the HTTP exposition of
`ControllerMetrics` carries both the table and the other series once each."""

from __future__ import annotations

import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from controlplane.observability.engine_series import COLUMN, COLUMNS, EngineSeries
from controlplane.observability.metrics import ControllerMetrics


def _samples_from_text(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _samples_from_collect(series: EngineSeries) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in series.collect() for s in family.samples}


def test_the_rendered_table_is_prometheus_text_with_the_collected_samples() -> None:
    series = EngineSeries()
    series.row("e-1", "Qwen/Qwen3-8B|NVIDIA H200")[COLUMN["cp_engine_k"]] = 12
    row = series.row('odd"id\\x', "m|a\nb")
    row[:] = [float(i) for i in range(len(COLUMNS))]
    row[COLUMN["cp_engine_decision_epoch"]] = 1_796_048_255
    row[COLUMN["cp_engine_acked_sequence"]] = -1
    row[COLUMN["cp_engine_telemetry_age_seconds"]] = math.inf
    text = series.render_text()
    parsed = _samples_from_text(text)
    assert parsed == _samples_from_collect(series)
    assert len(parsed) == 1 + len(COLUMNS)  # a cell never set is no sample
    labels = (("engine_id", 'odd"id\\x'), ("pool", "m|a\nb"))
    assert parsed[("cp_engine_decision_epoch", labels)] == 1_796_048_255
    assert parsed[("cp_engine_telemetry_age_seconds", labels)] == math.inf
    assert parsed[("cp_engine_k", (("engine_id", "e-1"), ("pool", "Qwen/Qwen3-8B|NVIDIA H200")))] == 12


def test_a_forgotten_engine_and_an_engine_that_changed_pool_leave_no_series() -> None:
    series = EngineSeries()
    series.row("a", "p|1")[COLUMN["cp_engine_n"]] = 64
    series.row("b", "p|1")[COLUMN["cp_engine_n"]] = 32
    series.forget("a")
    series.row("b", "p|2")[COLUMN["cp_engine_mode"]] = 2  # moved pools: a fresh row
    assert _samples_from_text(series.render_text()) == {
        ("cp_engine_mode", (("engine_id", "b"), ("pool", "p|2"))): 2.0}
    assert len(series) == 1


def test_the_metrics_endpoint_serves_the_table_and_the_registry_once_each() -> None:
    metrics = ControllerMetrics()
    metrics.connected_engines.set(3)
    for i in range(100):
        metrics.engine_series.row(f"engine-{i}", "m|a")[COLUMN["cp_engine_k"]] = i
    server = metrics.serve(0)
    try:
        port = server.server_address[1]
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    families = {family.name: family for family in text_string_to_metric_families(body)}
    assert body.count("# TYPE cp_engine_k gauge") == 1
    assert len(families["cp_engine_k"].samples) == 100
    assert families["cp_connected_engines"].samples[0].value == 3
    # The registry still yields the table to its readers (tests, get_sample_value).
    assert metrics.registry.get_sample_value("cp_engine_k", {"engine_id": "engine-7", "pool": "m|a"}) == 7
