"""Render the Helm chart with real Helm (the Helm v4 Go SDK, through the helm-python-sdk wheel)."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import yaml

from tests.deploy.paths import CHART

RELEASE = "cp"
NAMESPACE = "llm"
FULLNAME = "cp-vllm-controlplane"


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders for `values` (NOTES.txt excluded).

    Raises:
        helm.HelmValuesError: values rejected by values.schema.json.
        helm.HelmRenderError: a template failed (e.g. the chart's own `fail` checks).
    """
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        manifests = chart.render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return helm.lint(CHART, values or {}, namespace=NAMESPACE, strict=True)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [obj for obj in by_kind(objects, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, got {[m['metadata']['name'] for m in matches]}"
    return matches[0]


def controller_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment", FULLNAME)
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "controller")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())
