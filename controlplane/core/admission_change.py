"""Where, in admission time, a shift to a new output-length law began: the first admission bucket of the new law.

A shift is detected in the completion stream, and after a shift to longer outputs that stream lags the new
law's first admissions: the new law's requests finish only after their lifetimes, short ones first, while the
old law's requests in flight keep finishing. A window of the requests admitted since the detector's change
point would drop the new law's oldest requests, the ones that inform its hazard at older ages.

`admission_change_point` locates the start in admission time instead. Each request admitted in the scanned
buckets is an observation of its law's survival at its output length: an event when it completed, censored
at its length so far when it still runs. For every split of the admission buckets into those before a bucket
and those from it on, a log-rank test compares the two groups' hazards (nonparametric: no law is assumed,
and it needs no model of the old law); the split with the largest z in the shift's direction is the change
point, and it must reach z ≥ CHANGE_Z. The bucket there may hold both laws' admissions (its old-law requests
admitted first): it is left out, so the new law's requests admitted in it are lost and the old law's never
enter. Ages are grouped on a log grid of AGE_GROUPS groups (ties within a group share its at-risk count, as
in a life table), so the scan costs O(buckets · AGE_GROUPS), not O(buckets · longest output).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from controlplane.core.admitted_counts import AdmittedCounts

# The log-rank z in the shift's direction a split must reach (one-sided 0.13% for one split under one law).
CHANGE_Z = 3.0
# Age groups of the log-rank scan: exact below this many tokens…
EXACT_AGE_TOKENS = 32
# …then geometric, this many groups in all at most.
AGE_GROUPS = 160


def admission_change_point(completed: Iterable[AdmittedCounts], running: Iterable[AdmittedCounts], *,
                           first_bucket: int, last_candidate: int, direction: int, z: float = CHANGE_Z
                           ) -> int | None:
    """The first admission bucket, in [first_bucket + 2, last_candidate + 2], of the requests admitted after the
    law changed towards longer (direction +1) or shorter (−1) outputs; None when no split reaches z.

    completed: the completions by admission bucket (each an event), in parts (the buckets they completed in);
    running: the requests still running, by admission bucket, at their lengths so far (censored), in parts
    (replicas). Requests admitted before first_bucket are ignored; those admitted after last_candidate are
    one group (every split puts them after the change). Candidate changes: the buckets (first_bucket,
    last_candidate + 1].

    Raises:
        ValueError: last_candidate < first_bucket, or direction not ±1.
    """
    if last_candidate < first_bucket:
        raise ValueError(f"admission change point: last candidate {last_candidate} before first {first_bucket}")
    if direction not in (1, -1):
        raise ValueError(f"admission change point: direction must be +1 or -1, got {direction}")
    completed, running = list(completed), list(running)
    longest = max((int(c.lengths.max()) for c in (*completed, *running) if c.lengths.size), default=1)
    edges = _age_edges(longest)
    rows = last_candidate - first_bucket + 2  # one per candidate bucket, then the later admissions
    cells = rows * edges.size
    events = np.zeros(cells)
    ended = np.zeros(cells)  # requests whose length falls in the group (completed or censored)
    for counts, is_event in [(c, True) for c in completed] + [(c, False) for c in running]:
        keep = counts.admitted >= first_bucket
        row = np.minimum(counts.admitted[keep] - first_bucket, rows - 1)
        cell = row * edges.size + np.searchsorted(edges, counts.lengths[keep], side="right") - 1
        weighted = np.bincount(cell, weights=counts.counts[keep].astype(np.float64), minlength=cells)
        ended += weighted
        if is_event:
            events += weighted
    events, ended = events.reshape(rows, edges.size), ended.reshape(rows, edges.size)
    at_risk = np.cumsum(ended[:, ::-1], axis=1)[:, ::-1]  # at risk at a group's first age
    # Splits m = 1 … rows − 1: the first m rows before the change. Cumulative sums give each split's groups.
    events_before = np.cumsum(events, axis=0)[:-1]
    at_risk_before = np.cumsum(at_risk, axis=0)[:-1]
    events_all, at_risk_all = events.sum(axis=0), at_risk.sum(axis=0)
    events_after = events_all - events_before
    at_risk_after = at_risk_all - at_risk_before
    usable = at_risk_all > 1.0
    n = np.where(usable, at_risk_all, 2.0)
    expected_after = at_risk_after * events_all / n
    variance = at_risk_before * at_risk_after * events_all * (n - events_all) / (n * n * (n - 1.0))
    score = np.where(usable, events_after - expected_after, 0.0).sum(axis=1)
    spread = np.sqrt(np.where(usable, variance, 0.0).sum(axis=1))
    statistic = np.divide(-direction * score, spread, out=np.full(score.shape, -np.inf), where=spread > 0.0)
    best = int(np.argmax(statistic))
    if not statistic[best] >= z:
        return None
    return first_bucket + best + 2  # split m = best + 1 starts at bucket first + m, the mixed one: skipped


def _age_edges(longest_tokens: int) -> np.ndarray:
    """Each age group's first length: 0 … EXACT_AGE_TOKENS − 1 exact, then geometric to longest_tokens."""
    exact = np.arange(0, EXACT_AGE_TOKENS, dtype=np.int64)
    if longest_tokens < EXACT_AGE_TOKENS:
        return exact
    log_edges = np.geomspace(EXACT_AGE_TOKENS, longest_tokens + 1, AGE_GROUPS - EXACT_AGE_TOKENS)
    return np.unique(np.concatenate((exact, np.floor(log_edges).astype(np.int64))))
