"""The Helm chart, rendered by real Helm: lint, Kubernetes schema validation, and what each variant wires up.

Variants: defaults (2 replicas, bundled Valkey, plaintext), many replicas, an external Redis (URL or
Secret), TLS with a chart-made or an existing Secret (mutual TLS), monitoring resources on, and everything
optional off. Every rendered object is validated against the Kubernetes JSON schemas (kubernetes-validate,
strict: unknown fields fail) of the oldest Kubernetes the chart supports and of the newest the package
ships; the prometheus-operator objects, which those schemas do not cover, are checked with promtool and
against the Service they select. The controller arguments of every variant are parsed by the real
`controlplane serve` parser.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from agents.config import load_agent_config
from controlplane.cli.serve import add_server_arguments, config_from_args, parse_tokens
from tests.deploy.chart import FULLNAME, NAMESPACE, by_kind, controller_container, lint, notes, one, render, selects
from tests.deploy.paths import CHART, CHART_DASHBOARD, DASHBOARD, ENGINE_PODS, RULES
from tests.deploy.processes import require_binary

KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
EXTERNAL_URL = "rediss://:s3cret@redis.example.internal:6380/2"


def variants(pem: dict[str, str]) -> dict[str, dict[str, Any]]:
    return {
        "defaults": {},
        "replicas": {"replicaCount": 5, "podDisruptionBudget": {"maxUnavailable": "40%"}},
        "external-redis-url": {"redis": {"url": EXTERNAL_URL, "bundled": {"enabled": False}}},
        "external-redis-secret": {"redis": {"existingSecret": "redis-conn", "existingSecretKey": "url",
                                            "bundled": {"enabled": False}}},
        "tls-inline-mutual": {"tls": {"enabled": True, "cert": pem["tls.crt"], "key": pem["tls.key"],
                                      "ca": pem["ca.crt"], "mutual": True}, "allowPlaintext": False},
        "tls-existing-secret": {"tls": {"enabled": True, "existingSecret": "controller-tls",
                                        "serverName": "controlplane.example.internal"},
                                "auth": {"existingSecret": "controller-tokens"}},
        "monitoring": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                                   "prometheusRule": {"enabled": True},
                                   "grafanaDashboard": {"enabled": True}},
                       "tracing": {"otlpEndpoint": "http://otel-collector.observability:4317"},
                       "image": {"digest": "sha256:" + "ab" * 32}},
        "minimal": {"replicaCount": 1, "networkPolicy": {"enabled": False},
                    "podDisruptionBudget": {"enabled": False}, "service": {"headless": False},
                    "serviceAccount": {"create": False},
                    "redis": {"bundled": {"persistence": {"enabled": False}}},
                    "auth": {"agentTokens": "pool-a:aaaaaaaaaaaaaaaa1,pool-b:bbbbbbbbbbbbbbbb2",
                             "operatorTokens": "alice:cccccccccccccccc3"},
                    "controller": {"extraArgs": ["--min-samples=800"], "logLevel": "DEBUG"},
                    "helmTest": {"enabled": False}},
    }


VARIANT_NAMES = ["defaults", "replicas", "external-redis-url", "external-redis-secret", "tls-inline-mutual",
                 "tls-existing-secret", "monitoring", "minimal"]


@pytest.fixture(scope="module")
def rendered(pem: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {name: render(values) for name, values in variants(pem).items()}


def _serve_args(objects: list[dict[str, Any]]) -> list[str]:
    return [arg.replace("$(POD_NAME)", f"{FULLNAME}-6d9f-abcde") for arg in controller_container(objects)["args"]]


def test_variant_list_is_complete(pem: dict[str, str]) -> None:
    assert sorted(variants(pem)) == sorted(VARIANT_NAMES)


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_lint_is_clean(variant: str, pem: dict[str, str]) -> None:
    report = lint(variants(pem)[variant])
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # 2: warning, 3: error


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_every_object_validates_against_the_kubernetes_schemas(variant: str, rendered: dict) -> None:
    objects = rendered[variant]
    assert objects
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
        assert obj["metadata"].get("namespace") == NAMESPACE


def test_schema_validation_catches_a_bad_manifest(rendered: dict) -> None:
    deployment = json.loads(json.dumps(one(rendered["defaults"], "Deployment")))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["port"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)
    deployment = json.loads(json.dumps(one(rendered["defaults"], "Deployment")))
    deployment["spec"]["replicasCount"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_controller_arguments_are_accepted_by_controlplane_serve(variant: str, rendered: dict) -> None:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args, unknown = parser.parse_known_args(_serve_args(rendered[variant]))
    assert unknown == []
    assert (args.host, args.port, args.metrics_port) == ("0.0.0.0", 50151, 9464)
    assert getattr(args, "metrics_host", None) == "0.0.0.0"
    if variant.startswith("tls"):
        assert args.tls_cert == Path("/etc/controlplane/tls/tls.crt") and not args.insecure
        return
    env = {"CP_AGENT_TOKENS": "agents:" + "a" * 40, "CP_OPERATOR_TOKENS": "operator:" + "o" * 40,
           "CP_REDIS_URL": "redis://cp-vllm-controlplane-valkey:6379/0"}
    config = config_from_args(args, env)  # the controller's own validation: non-loopback needs --insecure here
    assert config.redis_url == env["CP_REDIS_URL"] and config.data_dir is None


def test_defaults(rendered: dict) -> None:
    objects = rendered["defaults"]
    deployment = one(objects, "Deployment", FULLNAME)
    pod = deployment["spec"]["template"]
    container = controller_container(objects)
    assert deployment["spec"]["replicas"] == 2
    assert container["readinessProbe"]["grpc"] == {"port": 50151}
    assert container["startupProbe"]["grpc"] == {"port": 50151}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "grpc"}
    assert "--insecure" in container["args"]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {item["name"]: item for item in container["env"]}
    assert env["CP_REDIS_URL"]["value"] == "redis://cp-vllm-controlplane-valkey:6379/0"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Bundled Valkey: a StatefulSet with a claim, its Service named in the URL, reachable from the controller only.
    valkey = one(objects, "StatefulSet", f"{FULLNAME}-valkey")
    assert valkey["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    valkey_service = one(objects, "Service", f"{FULLNAME}-valkey")
    assert selects(valkey_service["spec"]["selector"], valkey["spec"]["template"]["metadata"]["labels"])
    redis_policy = one(objects, "NetworkPolicy", f"{FULLNAME}-valkey")
    assert selects(redis_policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"],
                   pod["metadata"]["labels"])
    # Generated tokens in the controller's format, read by the controller's own parser.
    secret = one(objects, "Secret", f"{FULLNAME}-auth")
    for key, identity in (("CP_AGENT_TOKENS", "agents"), ("CP_OPERATOR_TOKENS", "operator")):
        tokens = parse_tokens(base64.b64decode(secret["data"][key]).decode(), source=key)
        assert list(tokens.values()) == [identity] and len(next(iter(tokens))) == 40
        assert env[key]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-auth", "key": key}
    # Services, the headless one, the PDB and the NetworkPolicy select the controller pods.
    services = {service["metadata"]["name"]: service for service in by_kind(objects, "Service")}
    assert services[f"{FULLNAME}-headless"]["spec"]["clusterIP"] == "None"
    for name in (FULLNAME, f"{FULLNAME}-headless"):
        assert selects(services[name]["spec"]["selector"], pod["metadata"]["labels"])
        assert {p["targetPort"] for p in services[name]["spec"]["ports"]} <= {p["name"] for p in container["ports"]}
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    policy = one(objects, "NetworkPolicy", FULLNAME)
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert {rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]} == {"grpc", "metrics"}
    assert by_kind(objects, "ServiceMonitor") == [] and by_kind(objects, "PrometheusRule") == []
    assert "WARNING: gRPC is served without TLS" in notes()


def test_replicas(rendered: dict) -> None:
    objects = rendered["replicas"]
    assert one(objects, "Deployment")["spec"]["replicas"] == 5
    assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "40%"


def test_external_redis(rendered: dict) -> None:
    objects = rendered["external-redis-url"]
    assert by_kind(objects, "StatefulSet") == []
    assert [p["metadata"]["name"] for p in by_kind(objects, "NetworkPolicy")] == [FULLNAME]
    env = {item["name"]: item for item in controller_container(objects)["env"]}
    assert env["CP_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-redis", "key": "redis-url"}
    secret = one(objects, "Secret", f"{FULLNAME}-redis")
    assert base64.b64decode(secret["data"]["redis-url"]).decode() == EXTERNAL_URL
    assert EXTERNAL_URL not in json.dumps(one(objects, "Deployment"))  # the password stays in the Secret
    objects = rendered["external-redis-secret"]
    env = {item["name"]: item for item in controller_container(objects)["env"]}
    assert env["CP_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "redis-conn", "key": "url"}
    assert [s["metadata"]["name"] for s in by_kind(objects, "Secret")] == [f"{FULLNAME}-auth"]


def test_tls_with_a_chart_made_secret(rendered: dict, pem: dict[str, str]) -> None:
    objects = rendered["tls-inline-mutual"]
    container = controller_container(objects)
    assert "--insecure" not in container["args"]
    assert {"--tls-cert=/etc/controlplane/tls/tls.crt", "--tls-key=/etc/controlplane/tls/tls.key",
            "--tls-client-ca=/etc/controlplane/tls/ca.crt"} <= set(container["args"])
    for probe in ("startupProbe", "readinessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[0] == "cp-grpc-health" and "grpc" not in container[probe]
        assert f"--tls-server-name={FULLNAME}.{NAMESPACE}.svc" in command
        assert "--tls-client-cert=/etc/controlplane/tls/tls.crt" in command
    assert {"name": "tls", "mountPath": "/etc/controlplane/tls", "readOnly": True} in container["volumeMounts"]
    secret = one(objects, "Secret", f"{FULLNAME}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert {key: base64.b64decode(value).decode() for key, value in secret["data"].items()} == {
        "tls.crt": pem["tls.crt"], "tls.key": pem["tls.key"], "ca.crt": pem["ca.crt"]}
    assert "WARNING" not in notes(variants(pem)["tls-inline-mutual"])


def test_tls_with_an_existing_secret(rendered: dict) -> None:
    objects = rendered["tls-existing-secret"]
    container = controller_container(objects)
    assert "--tls-client-ca=/etc/controlplane/tls/ca.crt" not in container["args"]
    assert "--tls-server-name=controlplane.example.internal" in container["readinessProbe"]["exec"]["command"]
    volume = next(v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "controller-tls"
    assert [s["metadata"]["name"] for s in by_kind(objects, "Secret")] == []  # both Secrets are the user's
    env = {item["name"]: item for item in container["env"]}
    assert env["CP_AGENT_TOKENS"]["valueFrom"]["secretKeyRef"]["name"] == "controller-tokens"


def test_monitoring_objects(rendered: dict, tmp_path: Path) -> None:
    objects = rendered["monitoring"]
    service = one(objects, "Service", FULLNAME)
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert {"targetLabel": "job", "replacement": "controlplane"} in endpoint["relabelings"]
    # The PrometheusRule carries exactly the shipped rules, and promtool accepts them as a rule file.
    rule = one(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text(encoding="utf-8"))
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    check = subprocess.run([require_binary("promtool", package="prometheus"), "check", "rules",
                            str(tmp_path / "rules.yaml")], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    dashboard = one(objects, "ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["vllm-controlplane.json"]) == json.loads(DASHBOARD.read_text(encoding="utf-8"))
    container = controller_container(objects)
    assert container["image"] == "vllm-controlplane/controller@sha256:" + "ab" * 32
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4317"


def test_minimal(rendered: dict) -> None:
    objects = rendered["minimal"]
    assert {obj["kind"] for obj in objects} == {"Deployment", "Service", "Secret", "StatefulSet"}
    assert {s["metadata"]["name"] for s in by_kind(objects, "Service")} == {FULLNAME, f"{FULLNAME}-valkey"}
    valkey = one(objects, "StatefulSet")
    assert "volumeClaimTemplates" not in valkey["spec"]
    assert valkey["spec"]["template"]["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "default"
    assert controller_container(objects)["args"][-1] == "--min-samples=800"


def test_chart_ships_the_same_dashboard() -> None:
    assert CHART_DASHBOARD.read_bytes() == DASHBOARD.read_bytes()


BAD_VALUES = [
    ({"replicaCount": 0}, "/replicaCount"),
    ({"replicaCount": "three"}, "/replicaCount"),
    ({"redis": {"url": "http://redis:6379"}}, "/redis/url"),
    ({"auth": {"agentTokens": "agents:short"}}, "/auth/agentTokens"),
    ({"auth": {"operatorTokens": "no-identity-token-0123456789"}}, "/auth/operatorTokens"),
    ({"controller": {"grpcPort": 70000}}, "/controller/grpcPort"),
    ({"controller": {"logLevel": "verbose"}}, "/controller/logLevel"),
    ({"controller": {"ttlS": 0}}, "/controller/ttlS"),
    ({"image": {"digest": "sha256:nothex"}}, "/image/digest"),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
    ({"tracing": {"otlpEndpoint": "otel:4317"}}, "/tracing/otlpEndpoint"),
    ({"replicas": 3}, "additional properties 'replicas'"),
    ({"tls": {"enabeld": True}}, "additional properties 'enabeld'"),
]


@pytest.mark.parametrize(("values", "named"), BAD_VALUES, ids=[named for _, named in BAD_VALUES])
def test_schema_rejects_bad_values(values: dict[str, Any], named: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as raised:
        chart.validate_schema(values)
    assert named in str(raised.value)
    with pytest.raises(helm.HelmValuesError):
        render(values)  # an install validates too
    assert lint(values)["errors"]


CROSS_FIELD = [
    ({"redis": {"url": "redis://r:6379/0"}}, "not both"),
    ({"redis": {"bundled": {"enabled": False}}}, "the controller needs a Redis"),
    ({"redis": {"url": "redis://r:6379/0", "existingSecret": "x", "bundled": {"enabled": False}}},
     "redis.url or redis.existingSecret, not both"),
    ({"tls": {"enabled": True}}, "tls.enabled needs tls.existingSecret or both tls.cert and tls.key"),
    ({"tls": {"enabled": True, "cert": "c", "key": "k", "mutual": True}}, "tls.mutual needs tls.ca"),
    ({"tls": {"mutual": True}}, "tls.mutual needs tls.enabled=true"),
    ({"allowPlaintext": False}, "enable TLS or allow plaintext"),
]


@pytest.mark.parametrize(("values", "message"), CROSS_FIELD, ids=[message for _, message in CROSS_FIELD])
def test_inconsistent_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError) as raised:
        render(values)
    assert message in str(raised.value)


def test_engine_pod_snippet_is_valid_and_configures_the_agent() -> None:
    text = ENGINE_PODS.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 1
    deployment = yaml.safe_load(blocks[0])
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # CP_ENGINE_ID: the pod name
            env[item["name"]] = "qwen3-8b-7c9d5b7f4-x2x9q"
        else:
            env[item["name"]] = "t" * 40  # the token, from a Secret
    config = load_agent_config(env, default_model="", default_accelerator="NVIDIA H200")
    assert config is not None
    assert config.engine_id == "qwen3-8b-7c9d5b7f4-x2x9q" and config.token == "t" * 40
    served = next(arg.split("=", 1)[1] for arg in container["args"] if arg.startswith("--served-model-name="))
    assert config.pool_model == served
    host = config.controller_address.rsplit(":", 1)[0]
    assert host == f"{FULLNAME}-headless.{NAMESPACE}.svc"  # the chart's headless Service in the example release
    assert set(env) == {"CP_CONTROLLER_ADDRESS", "CP_AGENT_TOKEN", "CP_ENGINE_ID", "CP_POOL_MODEL"}
