"""The dashboard's engine panels name only metrics a real vLLM CPU engine exports, and show them per pool.

One stack for the module: a real controller (`controlplane serve`, embedded Redis), one OpenAI-compatible vLLM
server (`tests/e2e/openai_server.py`: the tiny random-weight model, the agent's scheduler class attached to that
controller) and Debian's Prometheus scraping both as the deployment does (jobs `controlplane` and `vllm`, the
engine's id as `engine_id` on vLLM's series). A few concurrent completions give vLLM's counters and histograms
samples. vLLM's /metrics scrape is the reference for every `vllm:` name a dashboard query names (histogram
queries name the `_bucket` series, counters the `_total` one: `tests/deploy/promql.py` maps the scrape's
families to those names as it does the controller's registry); the dashboard's other names are the
controller's, checked by tests/deploy/test_metric_names.py. Prometheus then evaluates every engine panel's
query: each answers for the engine's pool, and none for a pool the variable does not select.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from testbench.net import free_port
from testbench.serve_process import ServeProcess
from tests.deploy.processes import http_text, prometheus_api, prometheus_server, wait_for
from tests.deploy.promql import is_vllm_name, metric_names, scraped_names, unknown_names
from tests.deploy.test_metric_names import dashboard_exprs
from tests.e2e.openai_server import complete, openai_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MODEL = "tiny-qwen2"
ENGINE_ID = "dashboard-engine"
POOL = f"{MODEL}|cpu"  # the agent's pool: vLLM's served model name, the CPU accelerator
NUM_REQUESTS = 8
MAX_TOKENS = 8
# The engine panels, by the metric each one reads (vLLM 0.32 and 0.33 export the same names).
ENGINE_TOPICS = {
    "generation throughput": "vllm:generation_tokens_total",
    "TTFT": "vllm:time_to_first_token_seconds_bucket",
    "TPOT per request": "vllm:request_time_per_output_token_seconds_bucket",
    "inter-token latency": "vllm:inter_token_latency_seconds_bucket",
    "requests running": "vllm:num_requests_running",
    "requests waiting (queue length)": "vllm:num_requests_waiting",
    "KV-cache usage": "vllm:kv_cache_usage_perc",
}
# Labels the scrape adds (job, instance: Prometheus; engine_id: the chart's PodMonitor and the compose config) and
# the dashboard's join adds (pool). vLLM must not export them itself: Prometheus would rename the scrape's to
# exported_<label> (honor_labels off) and the join to the controller's series would find nothing.
SCRAPE_LABELS = frozenset({"job", "instance", "engine_id", "pool"})
GRAFANA_VARIABLES = {"job": "controlplane", "engine": ".*", "__rate_interval": "1m"}


@dataclass(frozen=True)
class Stack:
    exposition: str  # vLLM's /metrics text after NUM_REQUESTS finished completions (all of them counted)
    prometheus_url: str


@pytest.fixture(scope="module")
def stack(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("engine-dashboard")
    metrics_port, vllm_port = free_port(), free_port()
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": [
        {"job_name": "controlplane", "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]},
        {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{vllm_port}"],
                                                 "labels": {"engine_id": ENGINE_ID}}]}]}
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    controller = ServeProcess.start(workdir / "data", log_path=workdir / "controller.log",
                                    args=("--metrics-port", str(metrics_port)))
    try:
        with prometheus_server(workdir / "prometheus.yml", workdir) as prometheus_url, \
             openai_server(tiny_model, workdir / "server.log", served_model_name=MODEL, port=vllm_port,
                           env={"CP_CONTROLLER_ADDRESS": controller.address, "CP_ENGINE_ID": ENGINE_ID}) as base_url:
            # Prometheus holds a sample from before the requests, so rate() sees them all.
            wait_for(lambda: True if _values(prometheus_url, 'up{job="vllm"}') == {"": 1.0} else None,
                     timeout_s=10, what="Prometheus scraped the engine")
            prompts = [[1 + (7 * i + j) % 1000 for j in range(16 + 8 * i)] for i in range(NUM_REQUESTS)]
            with ThreadPoolExecutor(max_workers=4) as pool:
                answers = list(pool.map(lambda prompt: complete(base_url, MODEL, prompt, max_tokens=MAX_TOKENS),
                                        prompts))
            assert [answer["usage"]["completion_tokens"] for answer in answers] == [MAX_TOKENS] * NUM_REQUESTS

            def all_counted() -> str | None:  # the stats of the last requests may land just after their answers
                text = http_text(f"{base_url}/metrics")
                return text if _total(text, "vllm:request_success_total") >= NUM_REQUESTS else None

            yield Stack(exposition=wait_for(all_counted, timeout_s=10, what="every request counted"),
                        prometheus_url=prometheus_url)
    finally:
        controller.stop()


def _values(prometheus_url: str, query: str) -> dict[str, float]:
    """{pool label (or ""): value} of an instant query."""
    result = prometheus_api(prometheus_url, "/api/v1/query", query=query)["result"]
    return {series["metric"].get("pool", ""): float(series["value"][1]) for series in result}


def _samples(text: str) -> Iterator[tuple[str, dict[str, str], float]]:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def _total(text: str, name: str) -> float:
    """The sum of the samples called `name` (for a `_bucket` series, only the +Inf buckets)."""
    return sum(value for sample, labels, value in _samples(text)
               if sample == name and labels.get("le", "+Inf") == "+Inf")


def _engine_exprs() -> list[str]:
    return [expr for expr in dashboard_exprs() if any(is_vllm_name(name) for name in metric_names(expr))]


def _dashboard_vllm_names() -> set[str]:
    return {name for expr in dashboard_exprs() for name in metric_names(expr) if is_vllm_name(name)}


def _substitute(expr: str, pool: str) -> str:
    """`expr` as Grafana sends it with `pool` selected: the value regex-escaped, then escaped for a PromQL string."""
    variables = GRAFANA_VARIABLES | {"pool": re.escape(pool).replace("\\", "\\\\")}
    return re.sub(r"\$\{?(\w+)\}?", lambda match: variables[match.group(1)], expr)


def test_every_vllm_name_in_the_dashboard_is_in_the_engines_scrape(stack: Stack) -> None:
    assert _dashboard_vllm_names()  # the check below is not vacuous
    assert unknown_names(dashboard_exprs(), scraped_names(stack.exposition), owned=is_vllm_name) == {}


def test_the_dashboard_has_a_panel_per_engine_topic() -> None:
    missing = {topic: name for topic, name in ENGINE_TOPICS.items() if name not in _dashboard_vllm_names()}
    assert missing == {}


def test_the_engine_fed_every_counter_and_histogram_the_dashboard_reads(stack: Stack) -> None:
    """Names exported but never fed (e.g. a histogram this engine leaves empty) would draw empty panels."""
    cumulative = [name for name in _dashboard_vllm_names() if name.endswith(("_total", "_bucket", "_count", "_sum"))]
    assert len(cumulative) >= 4
    totals = {name: _total(stack.exposition, name) for name in cumulative}
    assert {name: total for name, total in totals.items() if total <= 0} == {}
    assert totals["vllm:generation_tokens_total"] == NUM_REQUESTS * MAX_TOKENS


def test_vllm_leaves_the_join_labels_to_the_scrape(stack: Stack) -> None:
    labels = {label for name, sample_labels, _ in _samples(stack.exposition) if is_vllm_name(name)
              for label in sample_labels}
    assert "model_name" in labels
    assert labels & SCRAPE_LABELS == set()


def test_every_engine_panel_answers_for_the_engines_pool_only(stack: Stack) -> None:
    """Each engine query, as Grafana sends it, gives one series labelled with the engine's pool (the join through
    the controller's cp_engine_mode), a positive one for the rates and latency quantiles; selecting another pool
    leaves it empty."""
    exprs = _engine_exprs()
    assert len(exprs) >= len(ENGINE_TOPICS)
    rates = [expr for expr in exprs if "rate(" in expr]
    assert len(rates) >= 7  # throughput, and p50 and p95 of TTFT, TPOT and inter-token latency

    def answers() -> dict[str, dict[str, float]]:
        return {expr: _values(stack.prometheus_url, _substitute(expr, POOL)) for expr in exprs}

    def wrong(found: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        return {expr: answer for expr, answer in found.items()
                if answer.keys() != {POOL} or (expr in rates and not answer[POOL] > 0)}  # NaN: no samples

    try:  # until Prometheus has scraped the engine after the last requests
        wait_for(lambda: True if not wrong(answers()) else None, timeout_s=20, what="every engine panel answering")
    except TimeoutError:
        raise AssertionError(wrong(answers())) from None
    assert {expr: _values(stack.prometheus_url, _substitute(expr, "other|cpu")) for expr in exprs} == {
        expr: {} for expr in exprs}
