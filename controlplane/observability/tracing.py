"""OpenTelemetry tracing of decisions and overrides.

One span `controlplane.decide` per decision, with an attribute for every input and term; one span
`controlplane.override` per override change. The agent's W3C trace context (traceparent) becomes the
parent when present. The tracer provider is built from explicit settings (the entry point reads the
standard OTEL_* variables, `tracing_settings_from_env`) with the SDK's own exporters; with no exporter
configured nothing is exported.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from controlplane.core.types import Decision

DECIDE_SPAN = "controlplane.decide"
OVERRIDE_SPAN = "controlplane.override"
ROLLOUT_SPAN = "controlplane.rollout"
_PROPAGATOR = TraceContextTextMapPropagator()


_EXPORTER_GROUP = "opentelemetry_traces_exporter"


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """exporters: names of the OpenTelemetry SDK's span exporters (the `opentelemetry_traces_exporter`
    entry points: "otlp"/"otlp_proto_grpc", "otlp_proto_http", "console"); empty means no export. Each
    exporter reads its own standard variables (endpoint, headers, TLS, timeout, compression)."""

    service_name: str = "vllm-controlplane"
    exporters: tuple[str, ...] = ()


def tracing_settings_from_env(env: Mapping[str, str]) -> TracingSettings:
    """OTEL_TRACES_EXPORTER as the SDK reads it: a comma-separated list of exporter names, "none" for none.

    Unset, it means "otlp" when an OTLP endpoint is configured (OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT) and
    nothing otherwise: the controller exports nothing unless asked. "otlp" follows
    OTEL_EXPORTER_OTLP_TRACES_PROTOCOL / OTEL_EXPORTER_OTLP_PROTOCOL ("grpc", the default, or
    "http/protobuf"). OTEL_SERVICE_NAME names the service.

    Raises:
        ValueError: for an exporter name the installed SDK does not provide, or an unknown protocol.
    """
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    raw = env.get("OTEL_TRACES_EXPORTER", "otlp" if endpoint else "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if "none" in names:
        names = []
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip().lower()
    if protocol not in ("grpc", "http/protobuf"):
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: expected grpc or http/protobuf, got {protocol!r}")
    resolved = []
    available = {e.name for e in entry_points(group=_EXPORTER_GROUP)}
    for name in names:
        if name == "otlp":
            name = "otlp_proto_http" if protocol == "http/protobuf" else "otlp_proto_grpc"
        if name not in available:
            raise ValueError(f"OTEL_TRACES_EXPORTER: no span exporter {name!r} is installed "
                             f"(available: {', '.join(sorted(available))})")
        resolved.append(name)
    return TracingSettings(service_name=env.get("OTEL_SERVICE_NAME", "vllm-controlplane"),
                           exporters=tuple(dict.fromkeys(resolved)))


def create_tracer_provider(settings: TracingSettings, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """A provider for the controller. `exporter` (e.g. the SDK's in-memory exporter in tests) replaces the
    configured exporters; each configured exporter is the SDK's own class, built with no arguments so it
    reads its standard environment variables itself."""
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        return provider
    for name in settings.exporters:
        (point,) = entry_points(group=_EXPORTER_GROUP, name=name)
        provider.add_span_processor(BatchSpanProcessor(point.load()()))
    return provider


def decision_attributes(decision: Decision, *, engine_id: str, pool: str, version: int) -> dict[str, object]:
    """Every input and term of a decision as span attributes (names under `cp.`)."""
    d = decision.diagnostics
    return {
        "cp.engine_id": engine_id,
        "cp.pool": pool,
        "cp.version": version,
        "cp.mode": decision.mode.value,
        "cp.k": decision.k,
        "cp.n": decision.n,
        "cp.budget.b_max_tokens": decision.budget.b_max_tokens,
        "cp.budget.b_cap_tokens": decision.budget.b_cap_tokens,
        "cp.budget.n_th": decision.budget.n_th,
        "cp.budget.t_large_tokens": decision.budget.t_large_tokens,
        "cp.budget.n_d_large": decision.budget.n_d_large,
        "cp.delta_s_per_token": decision.delta_s_per_token,
        "cp.delta_source": decision.delta_source.value,
        "cp.reason": decision.reason.value,
        "cp.flags": [f.value for f in decision.flags],
        "cp.advisory": decision.advisory,
        "cp.p0": d.p0,
        "cp.eta": d.eta,
        "cp.mu_l_tokens": d.mu_l_tokens,
        "cp.mu_o_tokens": d.mu_o_tokens,
        "cp.sigma_o_tokens": d.sigma_o_tokens,
        "cp.t95_tokens": d.t95_tokens,
        "cp.theta0": d.theta0,
        "cp.delta_theta": d.delta_theta,
        "cp.theta_star": d.theta_star,
        "cp.n_star": d.n_star,
        "cp.k_star": d.k_star,
        "cp.n_obs": d.n_obs,
        "cp.lhs_s_per_token": d.lhs_s_per_token,
        "cp.rhs_s_per_token": d.rhs_s_per_token,
        "cp.samples": d.num_samples,
        "cp.rejected_samples": d.num_rejected_samples,
        "cp.mu_o_lower_tokens": d.mu_o_lower_tokens,
        "cp.cold_start_mu_l_tokens": d.cold_start_mu_l_tokens,
        "cp.cold_start_mu_o_tokens": d.cold_start_mu_o_tokens,
        "cp.cold_start_p0": d.cold_start_p0,
    }


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def _has_span_processor(provider: trace.TracerProvider) -> bool:
    """False only for an SDK provider known to have no span processor (its spans reach no one)."""
    processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None)
    return processors is None or len(processors) > 0


class DecisionTracer:
    """Emits the decision, rollout and override spans on a given tracer provider."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("controlplane")
        self._rollouts: dict[str, trace.Span] = {}  # pool key → its rollout's open span

    def trace_decision(
        self, decision: Decision, *, engine_id: str, pool: str, version: int, traceparent: str = ""
    ) -> str:
        """Record one `controlplane.decide` span; returns its trace id (32 hex digits, "" if not sampled).

        With no span processor on the provider (no exporter configured) no span is built: it would reach
        no one, and building one costs about 100 µs, as much as the decision. The trace id returned is then
        the batch's (from its traceparent) or a fresh random one, as the span's would have been."""
        if not _has_span_processor(self._provider):
            found = _TRACEPARENT.fullmatch(traceparent) if traceparent else None
            if found is not None and found.group(1) != "0" * 32:
                return found.group(1)
            return format(random.getrandbits(128) or 1, "032x")
        parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        with self._tracer.start_as_current_span(DECIDE_SPAN, context=parent) as span:
            span.set_attributes(decision_attributes(decision, engine_id=engine_id, pool=pool, version=version))
            context = span.get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else ""

    def trace_rollout(self, event: Any) -> None:
        """A rollout is one `controlplane.rollout` span from its start to its verdict
        (`loop.effects.RolloutEvent`): "started" opens it, with an event; the verdict ("promoted",
        "rolled_back", "aborted") adds its event (detail, the operator who ended it and why), sets
        `cp.rollout.verdict` and ends it. A verdict with no open span (a rollout begun before a restart) is a span
        of its own; a second start for a pool ends the open one as superseded. At most one open span per pool."""
        attributes = {"cp.pool": event.pool_key, "cp.rollout.from_mode": event.from_mode,
                      "cp.rollout.to_mode": event.to_mode}
        if event.event == "started":
            open_span = self._rollouts.pop(event.pool_key, None)
            if open_span is not None:
                open_span.add_event("superseded")
                open_span.end()
            span = self._tracer.start_span(ROLLOUT_SPAN, attributes=attributes)
            span.add_event("started", {"cp.rollout.detail": event.detail})
            self._rollouts[event.pool_key] = span
            return
        span = self._rollouts.pop(event.pool_key, None)
        if span is None:
            span = self._tracer.start_span(ROLLOUT_SPAN, attributes=attributes)
        span.add_event(event.event, {"cp.rollout.detail": event.detail, "cp.rollout.actor": event.actor,
                                     "cp.rollout.reason": event.reason})
        span.set_attribute("cp.rollout.verdict", event.event)
        span.end()

    def trace_override(self, *, action: str, kind: str, scope: str, actor: str, reason: str,
                       old: str, new: str) -> None:
        """Record one `controlplane.override` span (old/new as JSON text, "" when absent)."""
        with self._tracer.start_as_current_span(OVERRIDE_SPAN) as span:
            span.set_attributes({
                "cp.override.action": action, "cp.override.kind": kind, "cp.override.scope": scope,
                "cp.override.actor": actor, "cp.override.reason": reason,
                "cp.override.old": old, "cp.override.new": new,
            })
