"""Shift detection over a pool's settled buckets: where the pool's output-length window is re-based.

`ShiftTracker` feeds the completions of each settled bucket, oldest first, to a
`core.change_detection.ShiftDetector` and maps every detected change point to a bucket (the one it fell in, or
the next when it fell past the first quarter of its bucket: `_bucket_of_sample`). The pool's window
(`loop.pool_stats`) never reaches back before that bucket (`rebase_bucket`), and the shift is kept
(`last_shift`) for the explain view.

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

from controlplane.core.change_detection import ShiftDetector
from controlplane.core.length_histogram import LengthHistogram

# At most this many completions of one bucket are fed (1.4 µs each): a detection needs tens of them, and a
# pool completing tens of thousands per second must not pay the detector for each.
MAX_SAMPLES_PER_BUCKET = 1024
# Buckets whose late change is still honoured by re-feeding them (controllers re-read the last 3).
REWIND_BUCKETS = 8
# A change point past this fraction of its bucket's fed completions starts the re-based window at the next bucket.
_LATE_IN_BUCKET = 0.25
# Tie-spreading positions are (bucket id mod this) · MAX_SAMPLES_PER_BUCKET + position in the bucket.
_JITTER_PERIOD_BUCKETS = 1 << 20


@dataclass(frozen=True, slots=True)
class PoolShift:
    """A shift of a pool's output-length distribution.

    start_bucket: where the re-based window starts (`ShiftTracker._bucket_of_sample`). detected_bucket: the
    bucket whose completions raised the alarm. direction: +1 towards longer outputs, −1 towards shorter ones.
    mean_ratio: mean length since the change point over the mean of the detector's reference before it.
    """

    start_bucket: int
    detected_bucket: int
    direction: int
    mean_ratio: float


@dataclass(slots=True)
class _State:
    detector: ShiftDetector
    spans: deque[tuple[int, int]]  # (index of the bucket's first fed sample, bucket id), oldest first
    rebase_bucket: int | None
    last_shift: PoolShift | None
    num_shifts: int

    def copy(self) -> _State:
        return _State(self.detector.copy(), self.spans.copy(), self.rebase_bucket, self.last_shift,
                      self.num_shifts)


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
        return self._state.num_shifts

    def advance(self, end_bucket: int, *, first_bucket: int, replicas_of: Callable[[int], tuple[str, ...]],
                completions_of: Callable[[int], LengthHistogram]) -> None:
        """Feed every bucket up to end_bucket not fed yet (from first_bucket on the first call).

        replicas_of(bucket): the replicas holding the bucket, sorted (() when none); completions_of(bucket): their
        completions merged. The newest REWIND_BUCKETS buckets fed whose replicas changed since are fed again
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
                self._feed(bucket_id, completions_of(bucket_id))
        self._fed_through = target

    def _feed(self, bucket_id: int, completions: LengthHistogram) -> None:
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
        if event is not None:
            start_bucket = self._bucket_of_sample(event.start_index)
            state.rebase_bucket = start_bucket if state.rebase_bucket is None else max(state.rebase_bucket,
                                                                                      start_bucket)
            state.last_shift = PoolShift(start_bucket=start_bucket, detected_bucket=bucket_id,
                                         direction=event.direction, mean_ratio=event.mean_ratio)
            state.num_shifts += 1
        while len(state.spans) > 1 and state.spans[1][0] <= detector.num_samples - _SPAN_SAMPLES:
            state.spans.popleft()

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
