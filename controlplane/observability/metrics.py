"""Prometheus metrics of the controller, on a registry the caller owns (no global registry).

Label sets are bounded: per-engine series carry `engine_id` and `pool` and are removed when the engine
is evicted (`forget_engine`); per-pool series carry `pool`; causes and results are fixed vocabularies.
Numeric codes: `cp_engine_mode` is 1 = MB, 2 = EB, 3 = PASSTHROUGH (0: no decision yet).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from controlplane.api.v1 import common_pb2
from controlplane.observability.engine_series import COLUMN, DECISION_SLICE, EngineSeries
from controlplane.observability.latency_histograms import PoolLatencyHistograms
from controlplane.protocol import MODE_CODES, split_version

_ACKED_SEQUENCE, _TELEMETRY_AGE = COLUMN["cp_engine_acked_sequence"], COLUMN["cp_engine_telemetry_age_seconds"]


class ControllerMetrics:
    """Counters and gauges the service updates; `serve(port)` exposes them over HTTP."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        # ---- ingest ----
        self.connected_engines = Gauge("cp_connected_engines", "Engines with an open agent stream", registry=r)
        self.engines_by_support = Gauge(
            "cp_engines_by_support", "Engines with an open agent stream on this replica, by pool and by what their "
            "agent's probe of vLLM found: level full, degraded, stock (the engine runs stock vLLM), or unreported "
            "(an agent that does not say)", ["pool", "level"], registry=r)
        self._support_counts: dict[tuple[str, str], int] = {}
        self.batches = Counter("cp_telemetry_batches_total", "Telemetry batches by result", ["result"], registry=r)
        self.events = Counter("cp_telemetry_events_total", "Telemetry events (completions, steps) by result",
                              ["kind", "result"], registry=r)
        self.sequence_gaps = Counter("cp_telemetry_sequence_gaps_total",
                                     "Sequence-number gaps seen (one per gap event, whatever its size)", registry=r)
        self.rejections = Counter("cp_rejections_total", "Agent messages or streams rejected, by cause", ["cause"],
                                  registry=r)
        self.streams_awaiting_hello = Gauge("cp_streams_awaiting_hello", "Agent streams open whose Hello has not "
                                            "arrived yet (each is closed after the Hello deadline)", registry=r)
        # ---- decisions ----
        self.decisions = Counter("cp_decisions_total", "Decisions pushed, by mode and reason", ["mode", "reason"],
                                 registry=r)
        self.decision_latency = Histogram(
            "cp_decision_latency_seconds", "Time to compute one engine's decision from its pool's estimate",
            buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1), registry=r,
        )
        self.pool_fit_latency = Histogram(
            "cp_pool_fit_latency_seconds", "Time to fit one pool's estimate (hazard and cost fits)",
            buckets=(1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1), registry=r,
        )
        self.acks = Counter("cp_decision_acks_total", "Decision acknowledgements by result "
                            "(applied, rejected, unknown_version)", ["result"], registry=r)
        # ---- per engine (bounded: removed on eviction): one table, see engine_series.py ----
        self.engine_series = EngineSeries()
        r.register(self.engine_series)
        self.stale_engines = Gauge("cp_stale_engines", "Connected engines whose telemetry is older than the "
                                   "stale threshold", registry=r)
        # ---- per pool ----
        self.pool_engines = Gauge("cp_pool_engines", "Connected engines per pool", ["pool"], registry=r)
        self.pool_theta_star = Gauge("cp_pool_theta_star", "θ̂* of the pool's latest estimate", ["pool"], registry=r)
        self.pool_theta0 = Gauge("cp_pool_theta0", "θ0 of the pool's latest estimate", ["pool"], registry=r)
        self.pool_p0 = Gauge("cp_pool_p0", "Hazard intercept p̂0 of the pool, per token", ["pool"], registry=r)
        self.pool_mu_o = Gauge("cp_pool_mu_o_tokens", "Mean output length of the pool's window, tokens", ["pool"],
                               registry=r)
        self.pool_mu_l = Gauge("cp_pool_mu_l_tokens", "Mean prompt length of the pool's window, tokens", ["pool"],
                               registry=r)
        self.pool_samples = Gauge("cp_pool_samples", "Completions in the pool's window", ["pool"], registry=r)
        self.pool_excluded_engines = Gauge("cp_pool_excluded_engines", "Engines kept out of the pool statistics "
                                           "(a distinct workload, decided from their own)", ["pool"], registry=r)
        self.pool_shifts = Counter("cp_pool_workload_shifts_total", "Workload shifts detected per pool", ["pool"],
                                   registry=r)
        self.pool_buckets_unreadable = Counter(
            "cp_pool_buckets_unreadable_total", "Other replicas' pool-statistics buckets this replica could not "
            "read and left out (each bucket once; e.g. a replica writing a newer format)", ["pool"], registry=r)
        self.pool_objective_state = Gauge(
            "cp_pool_objective_state", "The pool's latency objective: 1 no latency data, 2 meeting, 3 adjusting, "
            "4 infeasible (the engines cannot reach it at this load); absent without an objective", ["pool"],
            registry=r)
        self.pool_objective_delta = Gauge("cp_pool_objective_delta_s_per_token", "δ the pool's objective loop sets "
                                          "(an explicit δ override or pin wins over it)", ["pool"], registry=r)
        self.pool_objective_budget_scale = Gauge("cp_pool_objective_budget_cap_scale", "The pool's objective loop's "
                                                 "factor on P-PAS's B_cap (1: the policy's own; clamped per engine "
                                                 "to the objective's budget bounds)", ["pool"], registry=r)
        self.pool_rollouts = Counter("cp_pool_rollouts_total", "Guarded rollouts of a mode change per pool, by event "
                                     "(started, promoted, rolled_back, aborted)", ["pool", "event"], registry=r)
        self.pool_latencies = PoolLatencyHistograms()
        r.register(self.pool_latencies)
        # ---- operators ----
        self.overrides_in_force = Gauge("cp_overrides_in_force", "Overrides in force by kind and scope kind",
                                        ["kind", "scope_kind"], registry=r)
        self.override_expiry = Gauge("cp_override_expiry_timestamp_seconds",
                                     "Expiry of each override in force (Unix seconds; 0: never)", ["kind", "scope"],
                                     registry=r)
        # ---- store and health ----
        self.store_errors = Counter("cp_store_errors_total", "Redis store operations that failed", ["operation"],
                                    registry=r)
        self.store_up = Gauge("cp_store_up", "1 when the store answered its latest ping", registry=r)
        self.store_pending_writes = Gauge("cp_store_pending_writes", "Decisions waiting to be written to the store",
                                          registry=r)
        self.ready = Gauge("cp_ready", "1 when the controller reports SERVING", registry=r)
        self.watchers_dropped = Counter("cp_watch_events_dropped_total",
                                        "Decision events not delivered to a slow WatchDecisions client", registry=r)
        self.decision_watchers = Gauge("cp_decision_watchers", "Open WatchDecisions streams on this replica",
                                       registry=r)
        self.evictions = Counter("cp_engines_evicted_total", "Disconnected engines forgotten, by reason: ttl "
                                 "(disconnected for engine_ttl_s) or capacity (their agent identity had more than "
                                 "max_disconnected_engines disconnected)", ["reason"], registry=r)
        self.loop_restarts = Counter("cp_background_loop_restarts_total", "Background loops restarted after an "
                                     "error", ["loop"], registry=r)

    def show_decision(self, engine_id: str, pool_key: str, decision: common_pb2.Decision, acked_version: int) -> None:
        """The per-engine decision gauges of the decision in force, and its acknowledged sequence."""
        epoch, sequence = split_version(decision.version)
        row = self.engine_series.row(engine_id, pool_key)
        row[DECISION_SLICE] = (MODE_CODES.get(decision.mode, 0), decision.k, decision.n, decision.budget.b_max_tokens,
                               decision.budget.b_cap_tokens, decision.delta_s_per_token, epoch,
                               sequence)  # in the order of DECISION_COLUMNS
        self.show_acked(engine_id, pool_key, decision, acked_version)

    def show_acked(self, engine_id: str, pool_key: str, decision: common_pb2.Decision, acked_version: int) -> None:
        """The acked version's sequence within the epoch of the decision in force (-1: none acked in it)."""
        acked_epoch, acked_sequence = split_version(acked_version)
        same_epoch = acked_epoch == split_version(decision.version)[0]
        self.engine_series.row(engine_id, pool_key)[_ACKED_SEQUENCE] = acked_sequence if same_epoch else -1

    def count_support(self, pool: str, level: str, delta: int) -> None:
        """An agent stream of `pool` with this support level opened (+1) or ended (-1); a series back at 0 is
        removed (the label set stays bounded by the pools and levels connected now)."""
        key = (pool, level)
        count = self._support_counts.get(key, 0) + delta
        if count > 0:
            self._support_counts[key] = count
            self.engines_by_support.labels(pool=pool, level=level).set(count)
            return
        self._support_counts.pop(key, None)
        with contextlib.suppress(KeyError):
            self.engines_by_support.remove(pool, level)

    def show_telemetry_age(self, engine_id: str, pool_key: str, age_s: float) -> None:
        self.engine_series.row(engine_id, pool_key)[_TELEMETRY_AGE] = age_s

    def show_overrides(self, overrides: list[tuple[str, str, str, float]]) -> None:
        """The overrides in force, as (kind "delta" | "pin", scope kind, scope key, expires_at_s)."""
        self.overrides_in_force.clear()
        self.override_expiry.clear()
        for kind, scope_kind, scope, expires_at_s in overrides:
            self.overrides_in_force.labels(kind=kind, scope_kind=scope_kind).inc()
            self.override_expiry.labels(kind=kind, scope=scope).set(expires_at_s)

    def forget_engine(self, engine_id: str) -> None:
        """Remove an evicted engine's series (keeps the label set bounded)."""
        self.engine_series.forget(engine_id)

    def forget_pool(self, pool: str) -> None:
        """Remove a forgotten pool's series."""
        for gauge in (self.pool_engines, self.pool_theta_star, self.pool_theta0, self.pool_p0, self.pool_mu_o,
                      self.pool_mu_l, self.pool_samples, self.pool_excluded_engines, self.pool_shifts,
                      self.pool_buckets_unreadable, self.pool_objective_state, self.pool_objective_delta,
                      self.pool_objective_budget_scale):
            with contextlib.suppress(KeyError):
                gauge.remove(pool)
        self.pool_latencies.forget(pool)
        for event in ("started", "promoted", "rolled_back", "aborted"):
            with contextlib.suppress(KeyError):
                self.pool_rollouts.remove(pool, event)

    def exposition(self) -> bytes:
        """Every series in the Prometheus text format: the registry's, with the per-engine table rendered
        by its own fast path."""
        with self.engine_series.skipped():
            general = generate_latest(self.registry)
        return general + self.engine_series.render_text().encode()

    def serve(self, port: int, *, addr: str = "127.0.0.1") -> ThreadingHTTPServer:
        """Expose `exposition()` over HTTP on addr:port (any path, GET) from daemon threads."""
        return serve_metrics(self.exposition, port=port, addr=addr)


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.render()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per scrape is noise


def serve_metrics(render: Callable[[], bytes], *, port: int, addr: str) -> ThreadingHTTPServer:
    """Serve `render()` on addr:port (IPv4 or IPv6) in a daemon thread; returns the server (shutdown() stops it)."""
    family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsServer", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server = server_class((addr, port), _MetricsHandler)
    server.render = render  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
