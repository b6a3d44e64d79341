"""Trace export follows the OpenTelemetry SDK's standard variables (console, OTLP gRPC, OTLP HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from controlplane.observability.tracing import tracing_settings_from_env


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
