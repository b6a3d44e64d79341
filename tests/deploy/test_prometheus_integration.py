"""A real Prometheus scrapes a real controller with the shipped alert rules loaded.

The controller runs as `controlplane serve` in a subprocess (embedded Redis in a temporary directory);
the image's health check (cp-grpc-health) answers SERVING, then fails once it is stopped.
Prometheus is Debian's server binary with a test-only config (1 s scrape and evaluation, every rule's
`for` shortened to 3 s, the expressions unchanged). Checked: the controller's target is up, every rule
and every dashboard query evaluates without error against the live series, every rule group is healthy,
cp_ready and cp_store_up read 1 and no controller, readiness or store alert is active while it runs,
and after the controller is killed ControlPlaneControllerDown goes pending and then firing.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from controlplane.store.embedded import stop_process
from testbench.net import free_port
from tests.deploy.paths import DASHBOARD, RULES
from tests.deploy.processes import health_check, http_text, prometheus_api, require_binary, wait_for
from tests.deploy.test_metric_names import dashboard_exprs

TEST_FOR = "3s"
GRAFANA_VARIABLES = {"job": "controlplane", "pool": ".*", "engine": ".*", "__rate_interval": "1m"}


@contextmanager
def _process(args: list[str], *, log: Path, cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            yield process
        finally:
            stop_process(process, timeout_s=10.0)


def _test_rules(tmp_path: Path) -> Path:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = TEST_FOR
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def _prometheus_config(tmp_path: Path, *, metrics_port: int, rules: Path) -> Path:
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "controlplane",
                            "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def _substitute(expr: str) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda match: GRAFANA_VARIABLES[match.group(1)], expr)


def _alerts(base_url: str, name: str) -> list[dict]:
    return [alert for alert in prometheus_api(base_url, "/api/v1/alerts")["alerts"]
            if alert["labels"]["alertname"] == name]


def _logs(*paths: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}" for path in paths if path.exists())


def test_prometheus_scrapes_the_controller_and_fires_controller_down(tmp_path: Path) -> None:
    prometheus_bin = require_binary("prometheus", package="prometheus")
    controlplane_bin = str(Path(sys.executable).parent / "controlplane")
    grpc_port, metrics_port, prometheus_port = free_port(), free_port(), free_port()
    base_url = f"http://127.0.0.1:{prometheus_port}"
    config = _prometheus_config(tmp_path, metrics_port=metrics_port, rules=_test_rules(tmp_path))
    check = subprocess.run([require_binary("promtool", package="prometheus"), "check", "config", str(config)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    controller_log, prometheus_log = tmp_path / "controller.log", tmp_path / "prometheus.log"

    with _process([controlplane_bin, "serve", "--port", str(grpc_port), "--metrics-port", str(metrics_port),
                   "--data-dir", str(tmp_path / "data"), "--log-level", "WARNING"],
                  log=controller_log, cwd=tmp_path) as controller, \
         _process([prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                   f"--web.listen-address=127.0.0.1:{prometheus_port}"], log=prometheus_log, cwd=tmp_path):
        try:
            def controller_metrics() -> str:
                if controller.poll() is not None:
                    raise AssertionError(f"the controller exited with {controller.returncode}")
                return http_text(f"http://127.0.0.1:{metrics_port}/metrics")

            metrics = wait_for(controller_metrics, timeout_s=60, what="the controller's /metrics")
            assert "cp_connected_engines" in metrics
            healthy = health_check("--address", f"127.0.0.1:{grpc_port}")
            assert (healthy.returncode, healthy.stdout.strip()) == (0, f"127.0.0.1:{grpc_port}: SERVING")
            wait_for(lambda: http_text(f"{base_url}/-/ready") or None, timeout_s=30, what="Prometheus ready")

            def target_up() -> bool | None:
                result = prometheus_api(base_url, "/api/v1/query", query='up{job="controlplane"}')["result"]
                return True if result and result[0]["value"][1] == "1" else None

            wait_for(target_up, timeout_s=30, what='up{job="controlplane"} == 1')
            scraped = prometheus_api(base_url, "/api/v1/query", query='cp_connected_engines{job="controlplane"}')
            assert [series["value"][1] for series in scraped["result"]] == ["0"]

            # Every expression evaluates against the live series (a bad function or label name is an error here).
            rule_exprs = [rule["expr"] for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
                          for rule in group["rules"]]
            for expr in [*rule_exprs, *(_substitute(expr) for expr in dashboard_exprs())]:
                prometheus_api(base_url, "/api/v1/query", query=expr)

            def rules_evaluated() -> list[dict] | None:
                groups = prometheus_api(base_url, "/api/v1/rules")["groups"]
                rules = [rule for group in groups for rule in group["rules"]]
                return rules if rules and all(not rule["lastEvaluation"].startswith("0001") for rule in rules) \
                    else None

            rules = wait_for(rules_evaluated, timeout_s=20, what="every rule evaluated once")
            assert len(rules) == len(rule_exprs)
            assert [(rule["name"], rule.get("lastError", "")) for rule in rules if rule["health"] != "ok"] == []
            assert _alerts(base_url, "ControlPlaneControllerDown") == []

            def gauge_is_one(name: str) -> bool | None:
                result = prometheus_api(base_url, "/api/v1/query", query=f'{name}{{job="controlplane"}}')["result"]
                return True if [series["value"][1] for series in result] == ["1"] else None

            # A healthy controller on a healthy store: ready, store up, and neither alert pending or firing.
            for gauge in ("cp_ready", "cp_store_up"):
                wait_for(lambda gauge=gauge: gauge_is_one(gauge), timeout_s=15, what=f"{gauge} == 1")
            wait_for(lambda: True if not (_alerts(base_url, "ControlPlaneControllerUnready")
                                          or _alerts(base_url, "ControlPlaneStoreDown")) else None,
                     timeout_s=15, what="no readiness or store alert for a healthy controller")
            # Evaluations before the first scrape saw no target at all; they clear once `up` exists.
            wait_for(lambda: True if not _alerts(base_url, "ControlPlaneControllerAbsent") else None, timeout_s=15,
                     what="ControlPlaneControllerAbsent resolved while the controller is scraped")

            controller.send_signal(signal.SIGTERM)
            assert controller.wait(timeout=30) == 0
            assert health_check("--address", f"127.0.0.1:{grpc_port}", "--timeout-s", "1").returncode == 1
            states: list[str] = []

            def controller_down_firing() -> bool | None:
                alerts = _alerts(base_url, "ControlPlaneControllerDown")
                states.extend(alert["state"] for alert in alerts)
                return True if any(alert["state"] == "firing" for alert in alerts) else None

            started = time.monotonic()
            wait_for(controller_down_firing, timeout_s=30, what="ControlPlaneControllerDown firing")
            assert "pending" in states, states  # `for` held it back first
            assert time.monotonic() - started >= 2.0
            firing = _alerts(base_url, "ControlPlaneControllerDown")[0]
            assert firing["labels"]["instance"] == f"127.0.0.1:{metrics_port}"
            assert firing["labels"]["severity"] == "critical"
        except BaseException:
            print(_logs(controller_log, prometheus_log))
            raise


def test_dashboard_json_is_valid_and_has_unique_panel_ids() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "vllm-controlplane"
