"""Per-engine gauges as one table, rendered to the Prometheus text format in one pass.

At 1,000 engines the per-engine gauges are 10,000 series, 98% of a scrape. Kept as prometheus_client
`Gauge` children they cost a label lookup per update and about 0.1 s of the interpreter per scrape
(formatting through generic sample objects in the HTTP thread), taken from the event loop that serves the
agents while Prometheus scrapes. Here each engine is one row of floats with its label text escaped once;
`render_text` formats the table with one f-string per sample, and `collect` yields the same samples as
metric families for anything that reads the registry (tests, `get_sample_value`).

Thread safety: the event loop updates rows; the HTTP thread renders from a snapshot of the rows taken in
one C-level call (the GIL makes it atomic), so a scrape never sees a dict changing size. A sample is absent
until set (NaN cells are skipped), like a gauge child that was never created.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# (metric name, help text): the table's columns, in order.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("cp_engine_mode", "Mode in force: 1 MB, 2 EB, 3 PASSTHROUGH"),
    ("cp_engine_k", "EB phase-switch threshold k in force, requests"),
    ("cp_engine_n", "Admission cap N in force, requests"),
    ("cp_engine_budget_max_tokens", "P-PAS B_max in force, tokens"),
    ("cp_engine_budget_cap_tokens", "P-PAS B_cap in force, tokens"),
    ("cp_engine_delta_s_per_token", "Operator margin δ in force, s/token"),
    # Versions are epoch · 10^9 + sequence, and epochs are floored at the clock's seconds, so a version is
    # above 2^53 and no float (a Prometheus sample) holds it exactly: export its parts.
    ("cp_engine_decision_epoch", "Epoch of the version of the decision in force"),
    ("cp_engine_decision_sequence", "Sequence, within its epoch, of the version of the decision in force"),
    ("cp_engine_acked_sequence", "Sequence of the latest version the agent applied, within the epoch of the "
                                 "decision in force (-1: none applied in that epoch yet)"),
    ("cp_engine_telemetry_age_seconds", "Seconds since the engine's latest telemetry batch"),
)
COLUMN = {name: i for i, (name, _) in enumerate(COLUMNS)}
LABELS = ("engine_id", "pool")
# The columns a decision sets, one slice of a row, in the order `Controller._set_engine_gauges` writes them.
DECISION_COLUMNS = ("cp_engine_mode", "cp_engine_k", "cp_engine_n", "cp_engine_budget_max_tokens",
                    "cp_engine_budget_cap_tokens", "cp_engine_delta_s_per_token", "cp_engine_decision_epoch",
                    "cp_engine_decision_sequence")
DECISION_SLICE = slice(COLUMN[DECISION_COLUMNS[0]], COLUMN[DECISION_COLUMNS[-1]] + 1)
if [COLUMN[name] for name in DECISION_COLUMNS] != list(range(DECISION_SLICE.start, DECISION_SLICE.stop)):
    raise RuntimeError("DECISION_COLUMNS must be contiguous and in the order of COLUMNS")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample_text(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


class EngineSeries(Collector):
    """The per-engine gauges (`COLUMNS`), labelled engine_id and pool."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str, tuple[str, str], list[float]]] = {}
        self._skip = threading.local()

    def row(self, engine_id: str, pool: str) -> list[float]:
        """The engine's values (mutable, indexed by `COLUMN[name]`), created empty on first use; an engine
        whose pool changed gets a fresh row."""
        entry = self._rows.get(engine_id)
        if entry is None or entry[1][1] != pool:
            entry = (f'engine_id="{_escape(engine_id)}",pool="{_escape(pool)}"', (engine_id, pool),
                     [math.nan] * len(COLUMNS))
            self._rows[engine_id] = entry
        return entry[2]

    def forget(self, engine_id: str) -> None:
        self._rows.pop(engine_id, None)

    def __len__(self) -> int:
        return len(self._rows)

    def render_text(self) -> str:
        """The table in the Prometheus text format (0.0.4)."""
        rows = list(self._rows.values())
        parts: list[str] = []
        for i, (name, doc) in enumerate(COLUMNS):
            parts.append(f"# HELP {name} {doc.replace(chr(92), chr(92) * 2)}\n# TYPE {name} gauge\n")
            parts.extend(f"{name}{{{labels}}} {_sample_text(values[i])}\n"
                         for labels, _, values in rows if not math.isnan(values[i]))
        return "".join(parts)

    @contextlib.contextmanager
    def skipped(self) -> Iterator[None]:
        """Within this context (on this thread) `collect` yields nothing: the caller renders the table itself."""
        self._skip.active = True
        try:
            yield
        finally:
            self._skip.active = False

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, doc in COLUMNS:
            yield GaugeMetricFamily(name, doc, labels=LABELS)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if getattr(self._skip, "active", False):
            return
        rows = list(self._rows.values())
        for i, (name, doc) in enumerate(COLUMNS):
            family = GaugeMetricFamily(name, doc, labels=LABELS)
            for _, labels, values in rows:
                if not math.isnan(values[i]):
                    family.add_metric(labels, values[i])
            yield family
