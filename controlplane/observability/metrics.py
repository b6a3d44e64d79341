"""Prometheus metrics of the controller, on a registry the caller owns (no global registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class ControllerMetrics:
    """Counters and gauges the service updates; `serve(port)` exposes them over HTTP."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.connected_engines = Gauge("cp_connected_engines", "Engines with an open agent stream", registry=r)
        self.batches = Counter("cp_telemetry_batches_total", "Telemetry batches by result", ["result"], registry=r)
        self.events = Counter("cp_telemetry_events_total", "Telemetry events (completions, steps) by result",
                              ["kind", "result"], registry=r)
        self.sequence_gaps = Counter("cp_telemetry_sequence_gaps_total", "Batches missing by sequence number",
                                     registry=r)
        self.decisions = Counter("cp_decisions_total", "Decisions pushed, by mode and reason", ["mode", "reason"],
                                 registry=r)
        self.decision_latency = Histogram(
            "cp_decision_latency_seconds", "Time to compute one decision (fit + policy)",
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1), registry=r,
        )
        self.store_errors = Counter("cp_store_errors_total", "Redis store operations that failed", ["operation"],
                                    registry=r)
        self.acks = Counter("cp_decision_acks_total", "Decision acknowledgements by result", ["result"], registry=r)

    def serve(self, port: int, *, addr: str = "127.0.0.1") -> None:
        """Expose /metrics on addr:port (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)
