"""Chart options rendered by real Helm: the engine pods' PodMonitor, the controller's priorityClassName and extra
volumes. Each enabled rendering is linted; the Kubernetes objects are validated against the Kubernetes JSON
schemas, the PodMonitor (a prometheus-operator object those schemas lack) against the engine Deployment of
deploy/helm/ENGINE_PODS.md it is meant to scrape.
"""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import FULLNAME, NAMESPACE, by_kind, controller_container, lint, one, render, selects
from tests.deploy.paths import CHART, ENGINE_PODS

KUBERNETES_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())


def _engine_deployment() -> dict[str, Any]:
    [block] = re.findall(r"```yaml\n(.*?)```", ENGINE_PODS.read_text(encoding="utf-8"), flags=re.S)
    return yaml.safe_load(block)


def _lint_clean(values: dict[str, Any]) -> None:
    report = lint(values)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def _validate_label_selector(selector: dict[str, Any]) -> None:
    """Validate `selector` as a Kubernetes LabelSelector (the schema's, strict), in a Deployment that uses it."""
    deployment = _engine_deployment()
    deployment["spec"]["selector"] = selector
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)


def test_no_pod_monitor_by_default() -> None:
    assert by_kind(render(), "PodMonitor") == []


def test_pod_monitor_scrapes_the_engine_pods_of_engine_pods_md() -> None:
    engines = _engine_deployment()
    pod_labels = engines["spec"]["template"]["metadata"]["labels"]
    [container] = engines["spec"]["template"]["spec"]["containers"]
    values = {"metrics": {"enginePodMonitor": {"enabled": True, "selector": {"matchLabels": pod_labels},
                                               "interval": "15s", "labels": {"release": "kps"}}}}
    _lint_clean(values)
    monitor = one(render(values), "PodMonitor", f"{FULLNAME}-engines")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE and monitor["metadata"]["labels"]["release"] == "kps"
    spec = monitor["spec"]
    assert spec["selector"] == {"matchLabels": pod_labels}
    _validate_label_selector(spec["selector"])
    assert selects(spec["selector"]["matchLabels"], pod_labels)
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {port["name"] for port in container["ports"]}  # vLLM serves /metrics on it
    assert (endpoint["path"], endpoint["interval"], endpoint["scrapeTimeout"]) == ("/metrics", "15s", "10s")
    assert {"targetLabel": "job", "replacement": "vllm"} in endpoint["relabelings"]  # compose's job name
    assert {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "engine_id"} in endpoint["relabelings"]
    assert set(spec) == {"selector", "namespaceSelector", "podMetricsEndpoints"}


def test_pod_monitor_takes_expressions_namespaces_port_and_path() -> None:
    selector = {"matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                      "values": ["qwen3-8b", "llama-3-70b"]}]}
    values = {"metrics": {"enginePodMonitor": {"enabled": True, "selector": selector, "port": "metrics",
                                               "path": "/vllm/metrics", "namespaces": ["llm-a", "llm-b"]}}}
    _lint_clean(values)
    spec = one(render(values), "PodMonitor")["spec"]
    assert spec["selector"]["matchExpressions"] == selector["matchExpressions"]
    _validate_label_selector(spec["selector"])
    assert spec["namespaceSelector"] == {"matchNames": ["llm-a", "llm-b"]}
    endpoint = spec["podMetricsEndpoints"][0]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/vllm/metrics")


def test_pod_monitor_needs_a_selector() -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape("metrics.enginePodMonitor: set selector")):
        render({"metrics": {"enginePodMonitor": {"enabled": True}}})


@pytest.mark.parametrize(("values", "named"), [
    ({"port": "8000"}, "/metrics/enginePodMonitor/port"),
    ({"port": "HTTP"}, "/metrics/enginePodMonitor/port"),
    ({"path": "metrics"}, "/metrics/enginePodMonitor/path"),
    ({"interval": "soon"}, "/metrics/enginePodMonitor/interval"),
    ({"selector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}, "/metrics/enginePodMonitor/selector"),
    ({"selector": {"app": "x"}}, "additional properties 'app'"),
], ids=["numeric-port", "upper-case-port", "relative-path", "interval", "operator", "bare-labels"])
def test_schema_rejects_bad_pod_monitor_values(values: dict[str, Any], named: str) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError) as raised:
        chart.validate_schema({"metrics": {"enginePodMonitor": values}})
    assert named in str(raised.value)


EXTRAS = {
    "priorityClassName": "vllm-critical",
    "controller": {
        "extraVolumes": [{"name": "settings", "configMap": {"name": "controller-settings"}}],
        "extraVolumeMounts": [{"name": "settings", "mountPath": "/etc/controlplane/config", "readOnly": True}],
        "extraArgs": ["--config=/etc/controlplane/config/controller.yaml"],
    },
}


def test_priority_class_and_extra_volumes_render_into_the_controller_pod() -> None:
    _lint_clean(EXTRAS)
    objects = render(EXTRAS)
    deployment = one(objects, "Deployment", FULLNAME)
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "vllm-critical"
    assert {"name": "settings", "configMap": {"name": "controller-settings"}} in pod["volumes"]
    assert {v["name"] for v in pod["volumes"]} == {"tmp", "settings"}  # the chart's own are kept
    mounts = controller_container(objects)["volumeMounts"]
    assert {"name": "settings", "mountPath": "/etc/controlplane/config", "readOnly": True} in mounts
    assert {"name": "tmp", "mountPath": "/tmp"} in mounts
    # The bundled Valkey is not the controller: it keeps the cluster's default priority.
    assert "priorityClassName" not in one(objects, "StatefulSet")["spec"]["template"]["spec"]


def test_defaults_set_no_priority_class() -> None:
    assert "priorityClassName" not in one(render(), "Deployment")["spec"]["template"]["spec"]


@pytest.mark.parametrize(("values", "message"), [
    ({"controller": {"extraVolumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}},
     '"nowhere" names no volume of the pod'),
    ({"controller": {"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}}, 'the volume name "tmp" is taken'),
], ids=["unknown-volume", "taken-name"])
def test_inconsistent_volumes_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize(("values", "named"), [
    ({"priorityClassName": "Not A Name"}, "/priorityClassName"),
    ({"controller": {"extraVolumeMounts": [{"name": "settings"}]}}, "/controller/extraVolumeMounts/0"),
    ({"controller": {"extraVolumes": [{"configMap": {"name": "x"}}]}}, "/controller/extraVolumes/0"),
], ids=["priority-class", "mount-without-path", "volume-without-name"])
def test_schema_rejects_bad_extras(values: dict[str, Any], named: str) -> None:
    with pytest.raises(helm.HelmValuesError) as raised:
        render(values)
    assert named in str(raised.value)
