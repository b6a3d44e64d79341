"""Locations of the deployment files under test (one place, so a move breaks one line)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DEPLOY_README = DEPLOY / "README.md"
RULES = DEPLOY / "prometheus" / "rules.yaml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yaml"
DASHBOARD = DEPLOY / "grafana" / "controlplane.json"
GRAFANA_ALERTING = DEPLOY / "grafana" / "provisioning" / "alerting" / "controlplane.yaml"
GRAFANA_ALERTING_GENERATOR = DEPLOY / "grafana" / "alerting_from_rules.py"
CHART = DEPLOY / "helm" / "vllm-controlplane"
CHART_RULES = CHART / "files" / "rules.yaml"
CHART_DASHBOARD = CHART / "files" / "controlplane.json"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
ENGINE_PODS = DEPLOY / "helm" / "ENGINE_PODS.md"
HEALTH_CHECK_SCRIPT = DEPLOY / "docker" / "grpc_health_check.py"
