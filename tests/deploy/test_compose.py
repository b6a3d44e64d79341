"""The compose topology: a valid Compose file (the compose-spec parser) whose pieces fit together.

No container runtime runs here (see deploy/README.md); these checks stand in for `docker compose config`
and go further: every file a service mounts or builds from exists, the controller's command is accepted by
the real `controlplane serve` (parser and config validation), the engine's environment by the agent's own
config loader, Prometheus' config by promtool, and every host a config names is a service of the file.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from compose_spec import PyCompose

from agents.config import load_agent_config
from controlplane.cli.serve import add_server_arguments, config_from_args, parse_tokens
from tests.deploy.paths import COMPOSE, DASHBOARD, GRAFANA_ALERTING, REPO, RULES
from tests.deploy.processes import require_binary

COMPOSE_DIR = COMPOSE.parent
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose's ${VAR} / ${VAR:-default} substitution with `env` (empty: every default applies)."""
    env = env or {}
    return _VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    text = COMPOSE.read_text(encoding="utf-8")
    PyCompose.from_yaml(text).validate()
    return yaml.safe_load(interpolate(text))


def _bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((COMPOSE_DIR / source).resolve(), target))
    return mounts


@pytest.mark.parametrize("text", [
    "services:\n  a:\n    imagee: x\n",
    "services:\n  a:\n    image: x\n    ports: [notaport]\n",
    "services:\n  a:\n    image: x\n    healthcheck: {interval: soon}\n",
    "services:\n  a:\n    image: x\n    networks: [missing]\n",
])
def test_the_parser_rejects_what_compose_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        PyCompose.from_yaml(text).validate()


def test_services_and_references(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"valkey", "controller", "engine", "otel-collector", "jaeger", "prometheus", "grafana"}
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: image {image!r} is not pinned"
        for source, _ in _bind_mounts(service):
            assert source.exists(), f"{name} mounts {source}, which does not exist"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):  # a named volume (the parser does not check these)
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"
        if "build" in service:
            context = (COMPOSE_DIR / service["build"]["context"]).resolve()
            assert context == REPO
            assert (context / service["build"]["dockerfile"]).is_file()
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond the loopback"


def test_controller_command_is_accepted_by_controlplane_serve(compose: dict[str, Any]) -> None:
    controller = compose["services"]["controller"]
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args, unknown = parser.parse_known_args(controller["command"])
    assert unknown == []
    config = config_from_args(args, controller["environment"])
    assert config.redis_url == "redis://valkey:6379/0" and config.security.insecure
    assert urlparse(config.redis_url).hostname in compose["services"]
    assert controller["healthcheck"]["test"][1] == "cp-grpc-health"
    assert controller["healthcheck"]["test"][3] == f"127.0.0.1:{args.port}"


def test_engine_environment_is_accepted_by_the_agent(compose: dict[str, Any]) -> None:
    services = compose["services"]
    engine, controller = services["engine"], services["controller"]
    config = load_agent_config(engine["environment"], default_model="", default_accelerator="cpu")
    assert config is not None
    host, port = config.controller_address.rsplit(":", 1)
    assert host == "controller" and f"--port={port}" in controller["command"]
    agent_tokens = parse_tokens(controller["environment"]["CP_AGENT_TOKENS"], source="CP_AGENT_TOKENS")
    assert config.token in agent_tokens
    assert config.pool_model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert engine["environment"]["VLLM_TARGET_DEVICE"] == "cpu" and engine["environment"]["VLLM_CPU_KVCACHE_SPACE"]
    model_flags = [arg for arg in engine["command"] if arg.startswith(("--model=", "--served-model-name="))]
    assert model_flags == ["--model=Qwen/Qwen2.5-0.5B-Instruct", "--served-model-name=Qwen/Qwen2.5-0.5B-Instruct"]


def test_tokens_follow_the_environment() -> None:
    text = interpolate(COMPOSE.read_text(encoding="utf-8"), {"CP_AGENT_TOKEN": "mine-0123456789abcdef"})
    services = yaml.safe_load(text)["services"]
    assert services["engine"]["environment"]["CP_AGENT_TOKEN"] == "mine-0123456789abcdef"
    assert services["controller"]["environment"]["CP_AGENT_TOKENS"] == "engines:mine-0123456789abcdef"


def test_prometheus_config(compose: dict[str, Any], tmp_path: Path) -> None:
    prometheus = compose["services"]["prometheus"]
    mounts = {target: source for source, target in _bind_mounts(prometheus)}
    assert mounts["/etc/prometheus/rules.yaml"] == RULES
    config = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text(encoding="utf-8"))
    assert config["rule_files"] == ["/etc/prometheus/rules.yaml"]
    jobs = {job["job_name"]: job["static_configs"][0]["targets"] for job in config["scrape_configs"]}
    assert jobs["controlplane"] == ["controller:9464"]
    assert "--metrics-port=9464" in compose["services"]["controller"]["command"]
    # The engine's vLLM metrics, on its API port (the chart's enginePodMonitor relabels its job to `vllm` too).
    engine_port = next(arg.removeprefix("--port=") for arg in compose["services"]["engine"]["command"]
                       if arg.startswith("--port="))
    assert jobs["vllm"] == [f"engine:{engine_port}"]
    # …labelled with the engine's id, the label the dashboard joins vLLM's series to the controller's on.
    vllm_labels = next(job["static_configs"][0].get("labels", {}) for job in config["scrape_configs"]
                       if job["job_name"] == "vllm")
    assert vllm_labels == {"engine_id": compose["services"]["engine"]["environment"]["CP_ENGINE_ID"]}
    for targets in jobs.values():
        for target in targets:
            assert target.split(":")[0] in {*compose["services"], "localhost"}
    config["rule_files"] = [str(RULES)]  # the same file, where promtool can read it
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    check = subprocess.run([require_binary("promtool", package="prometheus"), "check", "config",
                            str(tmp_path / "prometheus.yml")], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    num_rules = sum(len(group["rules"]) for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"])
    assert f"SUCCESS: {num_rules} rules found" in check.stdout + check.stderr


def test_otel_collector_pipeline(compose: dict[str, Any]) -> None:
    collector = compose["services"]["otel-collector"]
    mounts = {target: source for source, target in _bind_mounts(collector)}
    config = yaml.safe_load(mounts["/etc/otelcol/config.yaml"].read_text(encoding="utf-8"))
    pipeline = config["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(config[kind]), kind
    endpoint = config["exporters"][pipeline["exporters"][0]]["endpoint"]
    assert endpoint.split(":")[0] == "jaeger" in compose["services"]
    controller_endpoint = urlparse(compose["services"]["controller"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert controller_endpoint.hostname == "otel-collector"
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(f":{controller_endpoint.port}")


def test_grafana_provisioning(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {target: source for source, target in _bind_mounts(grafana)}
    datasources = yaml.safe_load((mounts["/etc/grafana/provisioning/datasources"] / "datasources.yaml").read_text())
    by_uid = {source["uid"]: source for source in datasources["datasources"]}
    assert by_uid["prometheus"]["type"] == "prometheus" and by_uid["jaeger"]["type"] == "jaeger"
    for source in by_uid.values():
        assert urlparse(source["url"]).hostname in compose["services"]
    providers = yaml.safe_load((mounts["/etc/grafana/provisioning/dashboards"] / "dashboards.yaml").read_text())
    dashboard_dir = providers["providers"][0]["options"]["path"]
    assert mounts[f"{dashboard_dir}/controlplane.json"] == DASHBOARD
    assert mounts["/etc/grafana/provisioning/alerting"] == GRAFANA_ALERTING.parent
    alerting = yaml.safe_load(GRAFANA_ALERTING.read_text(encoding="utf-8"))
    uids = {query["datasourceUid"] for group in alerting["groups"] for rule in group["rules"]
            for query in rule["data"]}
    assert uids == {"prometheus", "__expr__"}
