"""`RunningReports`: each engine's latest report of its running requests in one pool, summed when a bucket
closes, and the turnover since the previous close (`loop.turnover`).

An engine enters at its first report (`report` returns True) and leaves at `forget`; both add its report at
that moment to the turnover the next close carries. Pure: no I/O, no clock.
"""

from __future__ import annotations

import contextlib

import numpy as np

from controlplane.core.admitted_counts import AdmittedCounts
from controlplane.core.length_histogram import LengthHistogram
from controlplane.loop.buckets import MAX_ADMISSION_LAG_BUCKETS
from controlplane.loop.turnover import Turnover

# Engines whose first running report a pool keeps for its running-only floor (a pool with more engines and
# no completion yet has no such floor).
MAX_ENTERED_ENGINES = 10_000
# Reports held for the next close's turnover before they are summed into one (an engine cycling its
# connection enters and leaves at every connect: memory stays bounded by the distinct lengths).
MAX_PENDING_REPORTS = 256

Report = tuple[np.ndarray, np.ndarray]  # (output lengths so far, counts)


def running_sum(reports: list[Report]) -> LengthHistogram | None:
    """The sum of running histograms, each (lengths, counts); None when one is malformed."""
    if not reports:
        return LengthHistogram.empty()
    try:
        return LengthHistogram.from_counts(np.concatenate([lengths for lengths, _ in reports]),
                                           np.concatenate([counts for _, counts in reports]))
    except ValueError:
        return None


def admitted_running_sum(reports: list[Report], admitted: list[np.ndarray | None],
                         bucket_id: int) -> AdmittedCounts | None:
    """Running histograms by admission bucket (each report's admission buckets in `admitted`, None: not
    known), as of bucket_id; None when one is not known or is malformed."""
    if not reports:
        return AdmittedCounts.empty()
    if any(a is None for a in admitted):
        return None
    try:
        counts = AdmittedCounts.from_columns(np.concatenate(admitted),  # type: ignore[arg-type]
                                             np.concatenate([lengths for lengths, _ in reports]),
                                             np.concatenate([counts for _, counts in reports]))
    except ValueError:
        return None
    return counts.cap_admission(bucket_id - MAX_ADMISSION_LAG_BUCKETS)


class _Pending:
    """Reports (with their admission buckets, None: not known) awaiting the next close."""

    __slots__ = ("admitted", "reports")

    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.admitted: list[np.ndarray | None] = []

    def add(self, report: Report, admitted: np.ndarray | None) -> None:
        self.reports.append(report)
        self.admitted.append(admitted)
        if len(self.reports) > MAX_PENDING_REPORTS:
            self._compact()

    def _compact(self) -> None:
        """Sum the reports into one entry with the histograms' own builders (admissions kept while every report
        knows them); a malformed report leaves the entries concatenated, for the close to find unknown."""
        lengths = np.concatenate([lengths for lengths, _ in self.reports])
        counts = np.concatenate([counts for _, counts in self.reports])
        known = not any(a is None for a in self.admitted)
        admitted = np.concatenate(self.admitted) if known else None  # type: ignore[arg-type]
        try:
            if admitted is not None:
                summed = AdmittedCounts.from_columns(admitted, lengths, counts)
                self.reports, self.admitted = [(summed.lengths, summed.counts)], [summed.admitted]
            else:
                histogram = LengthHistogram.from_counts(lengths, counts)
                self.reports, self.admitted = [(histogram.lengths, histogram.counts)], [None]
        except ValueError:
            self.reports, self.admitted = [(lengths, counts)], [admitted]

    def take(self, bucket_id: int) -> tuple[LengthHistogram | None, AdmittedCounts | None]:
        histogram = running_sum(self.reports)
        admitted = admitted_running_sum(self.reports, self.admitted, bucket_id)
        self.reports, self.admitted = [], []
        return histogram, admitted


class RunningReports:
    """The latest running report of each engine of one pool, and the pool's turnover since the last close."""

    def __init__(self) -> None:
        self._latest: dict[str, Report] = {}
        self._admitted: dict[str, np.ndarray | None] = {}
        self._entered = _Pending()
        self._left = _Pending()
        # Until the pool's first completion (the running requests are then no longer every request the pool
        # started; the owner sets None): each engine's first report ever, for the pool's running-only floor
        # (`core.survival.running_mean_lower_bound`): its requests count at risk only past those lengths (an
        # engine that joins with old requests had its short ones finish unseen). Kept after the engine leaves;
        # at most MAX_ENTERED_ENGINES, else None.
        self.first_reports: dict[str, LengthHistogram] | None = {}

    def __contains__(self, engine_id: str) -> bool:
        return engine_id in self._latest

    def report(self, engine_id: str, report: Report, admitted: np.ndarray | None) -> bool:
        """Replace the engine's report (admitted: its entries' admission buckets, None: not known); True when
        it is the engine's first since it entered (then counted as entering at this report)."""
        entered = engine_id not in self._latest
        self._latest[engine_id] = report
        self._admitted[engine_id] = admitted
        if entered:
            self._entered.add(report, admitted)
        first = self.first_reports
        if first is not None and engine_id not in first:
            if len(first) >= MAX_ENTERED_ENGINES:
                self.first_reports = None  # no running-only floor for this pool
            else:
                with contextlib.suppress(ValueError):  # malformed: the bucket's running is unknown anyway
                    first[engine_id] = LengthHistogram.from_counts(*report)
        return entered

    def forget(self, engine_id: str) -> None:
        """The engine left: its latest report leaves the pool's running requests, censored at the next close."""
        report = self._latest.pop(engine_id, None)
        admitted = self._admitted.pop(engine_id, None)
        if report is not None:
            self._left.add(report, admitted)

    def close(self, bucket_id: int) -> tuple[LengthHistogram | None, AdmittedCounts | None, Turnover | None]:
        """(the sum of the latest reports, the same by admission bucket, the turnover since the previous close
        or None when no engine entered or left); a histogram is None when a report is malformed (or does not
        know its admissions: the admitted sums)."""
        reports = list(self._latest.values())
        running = running_sum(reports)
        admitted = admitted_running_sum(reports, [self._admitted[engine] for engine in self._latest], bucket_id)
        if not (self._entered.reports or self._left.reports):
            return running, admitted, None
        entered, entered_admitted = self._entered.take(bucket_id)
        left, left_admitted = self._left.take(bucket_id)
        if entered is None or left is None:
            return running, admitted, None  # a malformed report: its requests are unknown anyway
        turnover = Turnover(entered, left, entered_admitted, left_admitted)
        return running, admitted, None if turnover.is_empty else turnover
