"""Metric names referenced by PromQL expressions, and the names a prometheus_client registry exports.

A small lexical pass, not a PromQL parser: it removes string literals, label matchers, range and
subquery brackets, grouping clauses, durations, numbers and Grafana variables, then takes every
identifier that is not a function call or a keyword. That is exact for the expressions this project
writes (tests/deploy/test_metric_names.py checks it on known expressions, including ones it must reject).

Names split by owner: `vllm:` names are vLLM's own engine metrics (checked against a real engine's scrape,
tests/e2e/test_engine_metrics_dashboard.py), every other name the controller's or Prometheus' (checked against
the controller's registry, tests/deploy/test_metric_names.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_DURATION = re.compile(r"\b\d+(?:ms|s|m|h|d|w|y)\b")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "atan2", "inf", "nan", "Inf", "NaN"})
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<expr>.*),\s*[A-Za-z_]\w*\s*\)\s*$", re.S)
VLLM_PREFIX = "vllm:"


def is_vllm_name(name: str) -> bool:
    """Whether `name` is one of vLLM's own metrics (an engine's /metrics), not the controller's."""
    return name.startswith(VLLM_PREFIX)


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` selects (functions, keywords and label names excluded)."""
    text = _STRING.sub(" ", expr)
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _GRAFANA_VARIABLE.sub(" ", text)
    text = _DURATION.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        if match.group(0) in _KEYWORDS or text[match.end():].lstrip().startswith("("):
            continue
        names.add(match.group(0))
    return names


def variable_query_names(query: str) -> set[str]:
    """Metric names of a Grafana Prometheus variable query (`label_values(expr, label)`, `query_result(expr)`)."""
    match = _LABEL_VALUES.match(query)
    if match:
        return metric_names(match.group("expr"))
    if query.strip().startswith("label_values("):  # label_values(label): no metric
        return set()
    return metric_names(query)


def series_names(families: Iterable[Metric]) -> set[str]:
    """Every series name the metric families can export, including families that have no sample yet.

    Counters export `<name>_total` (and `_created`), histograms `_bucket`, `_sum`, `_count` (and `_created`),
    gauges their name.
    """
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "summary": ("", "_sum", "_count", "_created"), "gauge": ("",), "info": ("_info",),
                "stateset": ("",), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}
    names: set[str] = set()
    for family in families:
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def exported_names(registry: CollectorRegistry) -> set[str]:
    """Every series name the registry can export (`series_names` of its families)."""
    return series_names(registry.collect())


def scraped_names(exposition: str) -> set[str]:
    """Every series name a Prometheus text exposition (a /metrics scrape) declares or carries."""
    return series_names(text_string_to_metric_families(exposition))


def unknown_names(exprs: Iterable[str], known: set[str], *,
                  owned: Callable[[str], bool] = lambda name: True) -> dict[str, set[str]]:
    """{expr: names in it that `owned` selects and `known` lacks} for every expression naming such a name.

    `owned` picks the names this check answers for (e.g. `is_vllm_name`); the others are left to another check.
    """
    unknown: dict[str, set[str]] = {}
    for expr in exprs:
        missing = {name for name in metric_names(expr) if owned(name)} - known
        if missing:
            unknown[expr] = missing
    return unknown
