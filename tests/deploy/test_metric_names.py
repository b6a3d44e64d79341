"""The dashboard, the alert rules and Grafana's alert provisioning name only metrics the controller exports (the
dashboard's `vllm:` names, vLLM's own engine metrics, are checked against a real engine's scrape by
tests/e2e/test_engine_metrics_dashboard.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from controlplane.observability.metrics import ControllerMetrics
from tests.deploy.paths import DASHBOARD, GRAFANA_ALERTING, GRAFANA_ALERTING_GENERATOR, RULES
from tests.deploy.promql import (
    exported_names,
    is_vllm_name,
    metric_names,
    scraped_names,
    unknown_names,
    variable_query_names,
)

# Prometheus' own series for every target; the controller's registry has no process or platform collector.
PROMETHEUS_SERIES = {"up"}


@pytest.fixture(scope="module")
def known_names() -> set[str]:
    return exported_names(ControllerMetrics().registry) | PROMETHEUS_SERIES


def _panels(panels: list[dict]) -> list[dict]:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(_panels(panel.get("panels", [])))
    return out


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in _panels(dashboard["panels"]) for target in panel.get("targets", [])
            if "expr" in target]


def dashboard_variable_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def rule_exprs() -> list[str]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def test_extractor_on_known_expressions() -> None:
    assert metric_names('sum by (job, le) (rate(cp_x_bucket{job=~"$job", a="b{c}"}[$__rate_interval]))') == {
        "cp_x_bucket"}
    assert metric_names("max by (kind) (cp_expiry{job=\"j\"} > 0) - time() < 9e2") == {"cp_expiry"}
    assert metric_names("absent(up{job='x'}) or on() vector(1) and b:rec offset 5m") == {"up", "b:rec"}
    assert metric_names("a / ignoring(x) group_left(y) b_total[5m:1m]") == {"a", "b_total"}
    assert variable_query_names('label_values(cp_pool_engines{job=~"$job"}, pool)') == {"cp_pool_engines"}
    assert variable_query_names("label_values(job)") == set()


def test_registry_names_follow_the_exposition_suffixes() -> None:
    names = exported_names(ControllerMetrics().registry)
    assert {"cp_decision_acks_total", "cp_decision_latency_seconds_bucket", "cp_decision_latency_seconds_count",
            "cp_engine_mode", "cp_ready"} <= names
    assert "cp_decision_acks" not in names  # a counter is never exported without _total
    assert "cp_decision_latency_seconds" not in names  # nor a histogram without a suffix


def test_scraped_names_follow_the_exposition_suffixes() -> None:
    exposition = ('# TYPE vllm:tokens_total counter\nvllm:tokens_total{engine="0"} 3.0\n'
                  '# TYPE vllm:ttft_seconds histogram\nvllm:ttft_seconds_bucket{le="+Inf"} 1.0\n'
                  'vllm:ttft_seconds_count 1.0\nvllm:ttft_seconds_sum 0.5\n'
                  '# TYPE vllm:kv_usage gauge\nvllm:kv_usage 0.25\n')
    names = scraped_names(exposition)
    assert {"vllm:tokens_total", "vllm:ttft_seconds_bucket", "vllm:ttft_seconds_count", "vllm:ttft_seconds_sum",
            "vllm:kv_usage"} <= names
    assert not {"vllm:tokens", "vllm:ttft_seconds", "vllm:kv_usage_total"} & names


def test_an_unknown_name_is_reported(known_names: set[str]) -> None:
    exprs = ["rate(cp_decisions_total[5m])", "cp_engine_mode_total", "rate(cp_decisions[5m]) / up"]
    assert unknown_names(exprs, known_names) == {"cp_engine_mode_total": {"cp_engine_mode_total"},
                                                 "rate(cp_decisions[5m]) / up": {"cp_decisions"}}


def _controllers(name: str) -> bool:
    return not is_vllm_name(name)


def test_names_split_by_owner(known_names: set[str]) -> None:
    expr = "sum(rate(vllm:no_such_total[5m]) * on (engine_id) group_left (pool) group by (engine_id, pool) (cp_x))"
    assert metric_names(expr) == {"vllm:no_such_total", "cp_x"}
    assert unknown_names([expr], known_names, owned=_controllers) == {expr: {"cp_x"}}
    assert unknown_names([expr], {"vllm:no_such_total"}, owned=is_vllm_name) == {}
    assert unknown_names([expr], set(), owned=is_vllm_name) == {expr: {"vllm:no_such_total"}}


def test_dashboard_names_only_exported_metrics(known_names: set[str]) -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 40
    assert unknown_names(exprs, known_names, owned=_controllers) == {}
    for query in dashboard_variable_queries():
        assert variable_query_names(query) <= known_names, query


def test_dashboard_covers_the_issue_topics() -> None:
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    required = {"up", "cp_ready", "cp_store_up", "cp_connected_engines", "cp_pool_engines", "cp_engine_mode",
                "cp_engine_k", "cp_engine_n", "cp_engine_budget_max_tokens", "cp_engine_budget_cap_tokens",
                "cp_engine_delta_s_per_token", "cp_telemetry_batches_total", "cp_telemetry_events_total",
                "cp_decision_acks_total", "cp_stale_engines", "cp_overrides_in_force",
                "cp_override_expiry_timestamp_seconds"}
    assert required <= used, required - used


def test_rules_name_only_exported_metrics(known_names: set[str]) -> None:
    exprs = rule_exprs()
    assert len(exprs) >= 5
    assert unknown_names(exprs, known_names) == {}


def test_grafana_alert_provisioning_is_generated_from_the_rules(known_names: set[str]) -> None:
    check = subprocess.run([sys.executable, str(GRAFANA_ALERTING_GENERATOR), "--check"], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    provisioning = yaml.safe_load(GRAFANA_ALERTING.read_text(encoding="utf-8"))
    grafana_rules = [rule for group in provisioning["groups"] for rule in group["rules"]]
    prometheus_alerts = {rule["alert"]: rule["expr"].strip() for group in
                         yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"] for rule in group["rules"]
                         if "alert" in rule}
    assert {rule["title"]: rule["data"][0]["model"]["expr"] for rule in grafana_rules} == prometheus_alerts
    assert len({rule["uid"] for rule in grafana_rules}) == len(grafana_rules)
    for rule in grafana_rules:
        assert "$value " not in " ".join(rule["annotations"].values())
        assert metric_names(rule["data"][0]["model"]["expr"]) <= known_names
