"""Shift detection over a pool's settled buckets: where the pool's output-length window is re-based.

`ShiftTracker` feeds the completions of each settled bucket, oldest first, to a
`core.change_detection.ShiftDetector` and maps every detected change point to a bucket (the one it fell in, or
the next when it fell past the first quarter of its bucket: `_bucket_of_sample`). The pool's window
(`loop.pool_stats`) never reaches back before that bucket (`rebase_bucket`), and the shift is kept
(`last_shift`) for the explain view.

Confirmation (when `advance` is given `compare`): the detector watches the completed lengths, and those also
move when the law does not. After a shift to longer outputs the requests of the new law finish short ones
first, and the completed lengths keep growing for several mean lifetimes while the running requests' ages
fill in; in an engine with a queue, requests of the old law keep starting (and finishing) after the shift.
Each such move raised a new alarm, and each re-based the window on fewer completions (measured in the twin,
H200, c = 2,048, geometric 128 → 1,024: nine re-bases after the first, one of them taking a converged
estimate to −100%). So an alarm is pending until a log-rank test of the hazard (`core.survival.
compare_hazards`, which counts the running requests as censored and truncated observations and is therefore
blind to length bias) between the buckets before its change point (at most PRE_BUCKETS, none before the
current re-base) and those since says whether the law changed: confirmed (|z| ≥ CONFIRM_Z in the alarm's
direction) the window is re-based at the change point found by the detector; refuted (REFUTE_EVENTS
completions at comparable ages without that, or REFUTE_FED_SAMPLES fed since the alarm) it is dropped and
counted (`num_unconfirmed`). An alarm while
one is pending is ignored (the pending test's later buckets hold its data). With nothing to compare (no
completion before the change point) an alarm is confirmed at once, as it is without `compare`.

Deterministic: what is fed depends only on the merged bucket (every replica's completions summed) and its id.
A histogram has no order, and a sorted one would drive the CUSUM far off, so a bucket's completions are fed in
a pseudo-random order seeded by the bucket id, at most MAX_SAMPLES_PER_BUCKET of them (a random subset
beyond that), and their tie-spreading positions come from the bucket id too. Replicas holding the same buckets thus
detect the same shifts at the same buckets. A bucket that changes after it was fed (another replica's bucket
read late, a warm-start snapshot) is fed again: the tracker keeps its state from before each of the last
REWIND_BUCKETS buckets and rewinds to the oldest one that changed. A replica that starts later feeds every
bucket it holds from the oldest a window may use (max_window_s back): when the pool's history is no older, it
reaches the others' state at once; otherwise its detector reaches theirs once both have seen the same
max_reference + reference_lag completions since their last alarm and their CUSUM sums have met at zero.

Pure: no I/O, no clock. Cost per bucket: O(min(completions, MAX_SAMPLES_PER_BUCKET) · log 4096) plus a copy
of the detector's state (O(4096)) for the last REWIND_BUCKETS buckets.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from controlplane.core.change_detection import ShiftDetector, ShiftEvent
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.survival import HazardComparison

# At most this many completions of one bucket are fed (1.4 µs each): a detection needs tens of them, and a
# pool completing tens of thousands per second must not pay the detector for each.
MAX_SAMPLES_PER_BUCKET = 1024
# Buckets whose late change is still honoured by re-feeding them (controllers re-read the last 3).
REWIND_BUCKETS = 8
# A change point past this fraction of its bucket's fed completions starts the re-based window at the next bucket.
_LATE_IN_BUCKET = 0.25
# Tie-spreading positions are (bucket id mod this) · MAX_SAMPLES_PER_BUCKET + position in the bucket.
_JITTER_PERIOD_BUCKETS = 1 << 20
# Confirmation of an alarm (see the module docstring): the log-rank z in the alarm's direction that confirms
# it (one-sided 0.13% under one law), and the completions of the buckets since its change point, at ages the
# buckets before it also cover, after which an unconfirmed alarm is dropped (a 1.3× hazard ratio reaches
# z = 3 after about 130 of them, a 2× one after about 20).
CONFIRM_Z = 3.0
REFUTE_EVENTS = 400
REFUTE_FED_SAMPLES = 4 * REFUTE_EVENTS
# The buckets before a change point that the confirmation compares with: at most this many, and none older
# than PRE_BUCKETS + REWIND_BUCKETS before the alarm's bucket (every replica still holds those, whatever its
# refresh history: `PoolStatistics.refresh` keeps them; see `ShiftTracker.keep_from`).
PRE_BUCKETS = 32
# Shifts in one direction, each starting at most this many buckets after the one before, are one episode
# (`PoolShift.episode_start_bucket`).
EPISODE_GAP_BUCKETS = 2 * PRE_BUCKETS


@dataclass(frozen=True, slots=True)
class _Pending:
    """An alarm waiting for its confirmation: the buckets [pre_first, start_bucket) are compared with
    [start_bucket, the newest bucket fed]."""

    event: ShiftEvent
    start_bucket: int
    detected_bucket: int
    pre_first: int


# compare(pre_first, start_bucket, through_bucket): the hazards of [pre_first, start_bucket) against
# [start_bucket, through_bucket]; None when there is nothing before the change point to compare with.
Compare = Callable[[int, int, int], HazardComparison | None]


@dataclass(frozen=True, slots=True)
class PoolShift:
    """A shift of a pool's output-length distribution.

    start_bucket: where the re-based window starts (`ShiftTracker._bucket_of_sample`). detected_bucket: the
    bucket whose completions raised the alarm. direction: +1 towards longer outputs, −1 towards shorter ones.
    mean_ratio: mean length since the change point over the mean of the detector's reference before it.
    episode_start_bucket: the start_bucket of the first of the shifts in this direction that led to this one,
    each starting at most EPISODE_GAP_BUCKETS after the one before (this shift's own start_bucket when it is
    the first). A shift to longer outputs is re-based several times while its new law's completions lengthen
    (`_resolve`); the episode's first change point is nearer the new law's first admissions.
    """

    start_bucket: int
    detected_bucket: int
    direction: int
    mean_ratio: float
    episode_start_bucket: int = 0


@dataclass(slots=True)
class _State:
    detector: ShiftDetector
    spans: deque[tuple[int, int]]  # (index of the bucket's first fed sample, bucket id), oldest first
    rebase_bucket: int | None
    last_shift: PoolShift | None
    num_shifts: int
    pending: _Pending | None = None
    num_unconfirmed: int = 0

    def copy(self) -> _State:
        return _State(self.detector.copy(), self.spans.copy(), self.rebase_bucket, self.last_shift,
                      self.num_shifts, self.pending, self.num_unconfirmed)


# Buckets older than the newest this many fed samples are forgotten: a change point is at most the detector's
# `history` (4,096 by default) samples back.
_SPAN_SAMPLES = 8192


class ShiftTracker:
    """Feeds a pool's settled buckets to a shift detector (see the module docstring).

    Args:
        detector: a fresh detector (its parameters are the tracker's).
    """

    def __init__(self, detector: ShiftDetector) -> None:
        self._state = _State(detector=detector, spans=deque(), rebase_bucket=None, last_shift=None, num_shifts=0)
        self._fed_through: int | None = None
        # (bucket id, replicas fed, state before it) for the newest REWIND_BUCKETS buckets fed.
        self._recent: deque[tuple[int, tuple[str, ...], _State]] = deque(maxlen=REWIND_BUCKETS)

    @property
    def rebase_bucket(self) -> int | None:
        """The bucket of the latest change point (None before the first shift)."""
        return self._state.rebase_bucket

    @property
    def last_shift(self) -> PoolShift | None:
        return self._state.last_shift

    @property
    def num_shifts(self) -> int:
        """Shifts confirmed (each re-based the window)."""
        return self._state.num_shifts

    @property
    def num_unconfirmed(self) -> int:
        """Alarms dropped because the hazard did not change (see the module docstring)."""
        return self._state.num_unconfirmed

    @property
    def keep_from(self) -> int | None:
        """The oldest bucket a pending confirmation still reads (None: none pending)."""
        pending = self._state.pending
        return pending.pre_first if pending is not None else None

    def advance(self, end_bucket: int, *, first_bucket: int, replicas_of: Callable[[int], tuple[str, ...]],
                completions_of: Callable[[int], LengthHistogram], compare: Compare | None = None) -> None:
        """Feed every bucket up to end_bucket not fed yet (from first_bucket on the first call).

        replicas_of(bucket): the replicas holding the bucket, sorted (() when none); completions_of(bucket): their
        completions merged; compare: the confirmation test (see the module docstring; None: every alarm
        re-bases at once). The newest REWIND_BUCKETS buckets fed whose replicas changed since are fed again
        (from the oldest such one on). Otherwise no bucket is fed twice: an end_bucket at or below the newest
        bucket fed only re-checks those.
        """
        target = end_bucket if self._fed_through is None else max(end_bucket, self._fed_through)
        start = first_bucket if self._fed_through is None else self._fed_through + 1
        for position, (bucket_id, replicas, before) in enumerate(self._recent):
            if replicas_of(bucket_id) != replicas:
                self._state = before
                start = bucket_id
                for _ in range(len(self._recent) - position):
                    self._recent.pop()
                break
        for bucket_id in range(start, target + 1):
            replicas = replicas_of(bucket_id)
            if bucket_id > target - REWIND_BUCKETS:
                self._recent.append((bucket_id, replicas, self._state.copy()))
            if replicas:
                self._feed(bucket_id, completions_of(bucket_id), compare)
        self._fed_through = target

    def _feed(self, bucket_id: int, completions: LengthHistogram, compare: Compare | None) -> None:
        if not completions.count:
            return
        state = self._state
        rng = np.random.default_rng(bucket_id & 0xFFFF_FFFF_FFFF)
        if completions.count <= MAX_SAMPLES_PER_BUCKET:
            samples = np.repeat(completions.lengths, completions.counts)[rng.permutation(completions.count)]
        else:
            # A random subset in random order, drawn without expanding the histogram (64,000 completions a
            # second took 1 ms to expand and permute).
            chosen = rng.choice(completions.count, MAX_SAMPLES_PER_BUCKET, replace=False)
            samples = completions.lengths[np.searchsorted(np.cumsum(completions.counts), chosen, side="right")]
        detector = state.detector
        first_index = detector.num_samples
        state.spans.append((first_index, bucket_id))
        event = detector.update(samples, jitter_index=(bucket_id % _JITTER_PERIOD_BUCKETS) * MAX_SAMPLES_PER_BUCKET)
        if event is not None and state.pending is None:
            start_bucket = self._bucket_of_sample(event.start_index)
            pre_first = max(start_bucket - PRE_BUCKETS, bucket_id - PRE_BUCKETS - REWIND_BUCKETS)
            if state.rebase_bucket is not None:
                pre_first = max(pre_first, state.rebase_bucket)
            state.pending = _Pending(event=event, start_bucket=start_bucket, detected_bucket=bucket_id,
                                     pre_first=pre_first)
        if state.pending is not None:
            self._resolve(bucket_id, compare)
        while len(state.spans) > 1 and state.spans[1][0] <= detector.num_samples - _SPAN_SAMPLES:
            state.spans.popleft()

    def _resolve(self, through_bucket: int, compare: Compare | None) -> None:
        """Confirm, drop or keep waiting on the pending alarm, with the buckets fed through through_bucket."""
        state = self._state
        pending = state.pending
        assert pending is not None
        comparison = None
        if compare is not None and pending.pre_first < pending.start_bucket:
            comparison = compare(pending.pre_first, pending.start_bucket, through_bucket)
        if comparison is not None and not -pending.event.direction * comparison.z >= CONFIRM_Z:
            # Dropped once enough comparable completions say nothing changed, or once the detector has seen
            # REFUTE_FED_SAMPLES completions since the alarm without a verdict (few of them at comparable ages:
            # a pending alarm must not block the next one for ever).
            fed_since = state.detector.num_samples - pending.event.detected_index
            if comparison.events_after >= REFUTE_EVENTS or fed_since >= REFUTE_FED_SAMPLES:
                state.pending = None
                state.num_unconfirmed += 1
            return
        state.pending = None
        start_bucket, event = pending.start_bucket, pending.event
        state.rebase_bucket = start_bucket if state.rebase_bucket is None else max(state.rebase_bucket, start_bucket)
        previous = state.last_shift
        episode_start = start_bucket
        if (previous is not None and previous.direction == event.direction
                and start_bucket - previous.start_bucket <= EPISODE_GAP_BUCKETS):
            episode_start = previous.episode_start_bucket
        state.last_shift = PoolShift(start_bucket=start_bucket, detected_bucket=pending.detected_bucket,
                                     direction=event.direction, mean_ratio=event.mean_ratio,
                                     episode_start_bucket=episode_start)
        state.num_shifts += 1

    def _bucket_of_sample(self, sample_index: int) -> int:
        """The bucket where the window re-based at a change point at `sample_index` starts: the bucket holding
        that sample, or the next one fed when the sample lies past the first quarter of its bucket's fed
        samples. A bucket's completions are fed in a shuffled order, so a change point deep in a bucket means
        that few of its completions are the new regime's: a window that starts with the bucket starts with
        old-regime completions (a bias), one that starts after it only waits one bucket longer."""
        spans = self._state.spans
        for (first, bucket_id), (end, next_bucket) in itertools.pairwise(spans):
            if sample_index < end:
                return next_bucket if sample_index - first >= _LATE_IN_BUCKET * (end - first) else bucket_id
        return spans[-1][1]  # the newest bucket fed: there is no later one yet
