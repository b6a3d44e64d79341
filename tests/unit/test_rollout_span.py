"""A guarded rollout is one OpenTelemetry span from its start to its verdict, with an event for each."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.loop.effects import RolloutEvent
from controlplane.observability.tracing import ROLLOUT_SPAN, DecisionTracer


def _tracer() -> tuple[DecisionTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return DecisionTracer(provider), exporter


def test_a_rollout_is_one_span_from_its_start_to_its_verdict() -> None:
    tracer, exporter = _tracer()
    tracer.trace_rollout(RolloutEvent("m|a", "started", "mb", "eb", "canary 1 of 4 engines"))
    tracer.trace_rollout(RolloutEvent("other|b", "started", "eb", "mb", "canary 1 of 2 engines"))
    assert exporter.get_finished_spans() == ()  # open until their verdicts
    tracer.trace_rollout(RolloutEvent("m|a", "rolled_back", "mb", "eb", "−6.1% ± 1.2% tokens/s"))
    (span,) = exporter.get_finished_spans()
    assert span.name == ROLLOUT_SPAN and span.attributes["cp.pool"] == "m|a"
    assert (span.attributes["cp.rollout.from_mode"], span.attributes["cp.rollout.to_mode"],
            span.attributes["cp.rollout.verdict"]) == ("mb", "eb", "rolled_back")
    assert [(e.name, e.attributes["cp.rollout.detail"]) for e in span.events] == [
        ("started", "canary 1 of 4 engines"), ("rolled_back", "−6.1% ± 1.2% tokens/s")]
    assert span.start_time <= span.events[0].timestamp <= span.events[1].timestamp <= span.end_time
    tracer.trace_rollout(RolloutEvent("other|b", "aborted", "eb", "mb", "aborted by an operator", actor="alice",
                                      reason="maintenance"))
    aborted = exporter.get_finished_spans()[1]
    assert aborted.events[-1].attributes["cp.rollout.actor"] == "alice"
    assert aborted.events[-1].attributes["cp.rollout.reason"] == "maintenance"


def test_a_verdict_without_its_start_and_a_second_start_each_end_a_span() -> None:
    tracer, exporter = _tracer()
    tracer.trace_rollout(RolloutEvent("m|a", "promoted", "mb", "eb", "begun before a restart"))
    tracer.trace_rollout(RolloutEvent("m|a", "started", "mb", "eb", "first"))
    tracer.trace_rollout(RolloutEvent("m|a", "started", "eb", "mb", "second"))
    tracer.trace_rollout(RolloutEvent("m|a", "promoted", "eb", "mb", "done"))
    spans = exporter.get_finished_spans()
    assert [[e.name for e in s.events] for s in spans] == [["promoted"], ["started", "superseded"],
                                                           ["started", "promoted"]]
