"""Trace export follows the OpenTelemetry SDK's standard variables (console, OTLP gRPC, OTLP HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.core.policy import decide
from controlplane.core.types import EngineLimits, Observations, OperatorIntent, PolicyConfig, PolicyState
from controlplane.observability.tracing import (
    DecisionTracer,
    TracingSettings,
    create_tracer_provider,
    tracing_settings_from_env,
)


def test_nothing_is_exported_unless_asked() -> None:
    assert tracing_settings_from_env({}).exporters == ()
    assert tracing_settings_from_env({"OTEL_TRACES_EXPORTER": "none"}).exporters == ()
    assert tracing_settings_from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
                                      "OTEL_TRACES_EXPORTER": "none"}).exporters == ()


def test_otlp_follows_the_protocol_variables() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    assert tracing_settings_from_env(endpoint).exporters == ("otlp_proto_grpc",)
    http = {**endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    assert tracing_settings_from_env(http).exporters == ("otlp_proto_http",)
    traces = {**http, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_TRACES_EXPORTER": "otlp,console"}
    assert tracing_settings_from_env(traces).exporters == ("otlp_proto_grpc", "console")


def test_unknown_exporters_and_protocols_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="zipkin"):
        tracing_settings_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="http/json"):
        tracing_settings_from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_the_console_exporter_prints_spans() -> None:
    # In a fresh process: the SDK's console exporter binds sys.stdout when it is imported.
    script = ("import os\n"
              "from controlplane.observability.tracing import create_tracer_provider, tracing_settings_from_env\n"
              "provider = create_tracer_provider(tracing_settings_from_env(os.environ))\n"
              "with provider.get_tracer('test').start_as_current_span('controlplane.decide'):\n"
              "    pass\n"
              "provider.shutdown()\n")
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "cp-test"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout
    assert '"name": "controlplane.decide"' in out and "cp-test" in out


def _decision():
    limits = EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192, kv_capacity_tokens=10**6,
                          max_model_len_tokens=32768)
    observations = Observations(costs=None, limits=limits, n_obs=10.0, num_rejected_samples=0, num_preemptions=0)
    return decide(observations, PolicyState(), 0.0, intent=OperatorIntent(), config=PolicyConfig(), fit=None)[0]


def test_a_decision_span_carries_the_batch_trace_with_or_without_an_exporter() -> None:
    parent = "00-" + "4bf92f3577b34da6a3ce929d0e0e4736" + "-00f067aa0ba902b7-01"
    exporter = InMemorySpanExporter()
    exported = DecisionTracer(create_tracer_provider(TracingSettings(), exporter=exporter))
    trace_id = exported.trace_decision(_decision(), engine_id="e1", pool="m|a", version=7, traceparent=parent)
    [span] = exporter.get_finished_spans()
    assert trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" == format(span.context.trace_id, "032x")
    assert span.attributes["cp.engine_id"] == "e1" and span.attributes["cp.version"] == 7
    # No exporter: no span is built, the decision still carries the batch's trace (or a fresh one).
    silent = DecisionTracer(create_tracer_provider(TracingSettings()))
    assert silent.trace_decision(_decision(), engine_id="e1", pool="m|a", version=7, traceparent=parent) == trace_id
    fresh = {silent.trace_decision(_decision(), engine_id="e1", pool="m|a", version=7) for _ in range(3)}
    assert len(fresh) == 3 and all(len(t) == 32 and int(t, 16) for t in fresh)
    assert silent.trace_decision(_decision(), engine_id="e1", pool="m|a", version=7, traceparent="garbage") != ""
