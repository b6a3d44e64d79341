"""A completion window of bucketed length histograms that can be re-based at a detected shift.

`AdaptiveLengthWindow` keeps, per bucket (a time slice or a decision interval, identified by an integer that
grows with time), the histogram of completed output lengths, the count and sum of their prompt lengths, and
the histogram of the lengths of the requests still running when the bucket closed. `window()` merges the
newest buckets into the window the hazard fit reads: the completions, the prompts, the requests running at
the window's close (right-censored) and those running at its opening (left-truncated); see
`controlplane.core.survival` for why both ends are needed.

`rebase(from_bucket_id)` drops every bucket before the given one. After a detected shift
(`controlplane.core.change_detection`) the window then holds only completions since the change point, and the
running requests at both ends keep the fit honest while it refills (the first completions after a shift to
longer outputs are the short ones). `bucket_of_sample` maps a `ShiftDetector` sample index (valid completions
in the order they were added) to its bucket. Every later detection re-bases again: while the requests that
were in flight at the shift drain, the completion stream keeps drifting, and each re-basing drops more of
their completions (measured: better than refusing re-bases during the drain, see docs/ARCHITECTURE.md).

While a re-based window holds fewer than TRANSIENT_FACTOR × (requests in flight at its opening)
completions, those requests' completions are a large share of it and the view is marked `transient`: the fit
then keeps only the young requests' hazard (`fit_hazard_histogram(shift_transient=True)`).

Running snapshots are used only when the window's opening is known too: censoring without the matching
truncation would count the requests already in flight at the opening twice, and bias the hazard low (by about
running/window, 6% for 256 running requests over a 4,096-completion window). The opening of a window that
starts with the first bucket ever added is known (nothing ran before).

Pure: no I/O, no clock. Memory: at most `max_buckets` buckets, pruned to what `retain_samples` needs.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from controlplane.core.hazard import HazardFit, fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram, sum_of, valid_length_mask

# A re-based window is transient while it holds fewer completions than this many times the requests in
# flight at its opening: by then each of them has had about as many completions' time to finish as there
# were requests, and their share of the window is small.
TRANSIENT_FACTOR = 2


@dataclass(frozen=True, eq=False, slots=True)
class WindowView:
    """The merged observations of a window of buckets.

    completed: output lengths of the completions. prompt_count / prompt_sum_tokens: their prompts.
    censored: running requests' lengths when the newest bucket closed; truncated: when the window opened
    (both None when the opening is not known, see the module docstring). first_bucket_id / last_bucket_id:
    the buckets merged. rebased: the window starts at a rebase point. transient: rebased, and the requests in
    flight at the opening still weigh on it (see the module docstring).
    """

    completed: LengthHistogram
    prompt_count: int
    prompt_sum_tokens: float
    censored: LengthHistogram | None
    truncated: LengthHistogram | None
    first_bucket_id: int
    last_bucket_id: int
    rebased: bool
    transient: bool

    @property
    def num_samples(self) -> int:
        return self.completed.count


@dataclass(slots=True)
class _Bucket:
    bucket_id: int
    outputs: list[LengthHistogram] = field(default_factory=list)
    num_outputs: int = 0
    prompt_count: int = 0
    prompt_sum_tokens: float = 0.0
    running: LengthHistogram | None = None

    def merged_outputs(self) -> LengthHistogram:
        if len(self.outputs) > 1:
            self.outputs = [sum_of(self.outputs)]
        return self.outputs[0] if self.outputs else LengthHistogram.empty()


_EMPTY_RUNNING = LengthHistogram.empty()


class AdaptiveLengthWindow:
    """Bucketed completion histograms with re-basing (see the module docstring).

    Args:
        retain_samples: completions the window keeps at least (older buckets are pruned once the newer ones
            hold this many); window(max_samples=...) can ask for at most this many.
        max_buckets: hard cap on the number of buckets kept (the oldest go first).
    Raises:
        ValueError: retain_samples < 1 or max_buckets < 1.
    """

    def __init__(self, *, retain_samples: int = 4096, max_buckets: int = 4096) -> None:
        if retain_samples < 1 or max_buckets < 1:
            raise ValueError(f"need retain_samples ≥ 1 and max_buckets ≥ 1, got {retain_samples} and {max_buckets}")
        self._retain = retain_samples
        self._max_buckets = max_buckets
        self._ids: list[int] = []
        self._buckets: dict[int, _Bucket] = {}
        # Running snapshot when the oldest kept bucket opened; None: unknown. Known-empty at the very start.
        self._opening: LengthHistogram | None = _EMPTY_RUNNING
        self._floor_id: int | None = None  # buckets below this id are refused (pruned or before a rebase)
        self._opens_at_rebase = False  # the oldest kept bucket is a rebase point (not pruned since)
        self._spans: deque[tuple[int, int]] = deque()  # (first sample index, bucket id), in add order
        self._num_samples = 0
        self.num_dropped = 0
        self.num_rebases = 0

    # ------------------------------------------------------------------------------------------- input

    @property
    def num_samples(self) -> int:
        """Valid completions added so far (the sample index the next one gets)."""
        return self._num_samples

    def add(self, bucket_id: int, outputs: LengthHistogram, *, prompt_count: int = 0,
            prompt_sum_tokens: float = 0.0) -> bool:
        """Add completions (their output-length histogram and their prompts' count and sum) to a bucket.

        Buckets may be added out of order. Returns False, counting the completions in num_dropped, when the
        bucket is below the floor (before a rebase point or already pruned).

        Raises:
            ValueError: prompt_count < 0 or a prompt sum that is not finite or below prompt_count.
        """
        if prompt_count < 0 or not (math.isfinite(prompt_sum_tokens) and prompt_sum_tokens >= prompt_count):
            raise ValueError(f"prompt statistics must have count ≥ 0 and a finite sum ≥ count, got count="
                             f"{prompt_count} sum={prompt_sum_tokens!r}")
        bucket = self._bucket(bucket_id)
        if bucket is None:
            self.num_dropped += outputs.count
            return False
        if outputs.count:
            bucket.outputs.append(outputs)
            bucket.num_outputs += outputs.count
            self._spans.append((self._num_samples, bucket_id))
            self._num_samples += outputs.count
        bucket.prompt_count += prompt_count
        bucket.prompt_sum_tokens += prompt_sum_tokens
        self._prune()
        return True

    def add_samples(self, bucket_id: int, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> int:
        """Add (prompt, output) length pairs; a pair is kept only when both are valid.

        Returns how many pairs were rejected (arrays of different sizes are rejected whole, as
        `LengthWindow.add_completions` does), including pairs refused because the bucket is below the floor.
        """
        prompts = np.asarray(prompt_tokens, dtype=np.float64).ravel()
        outputs = np.asarray(output_tokens, dtype=np.float64).ravel()
        if prompts.size != outputs.size:
            return max(prompts.size, outputs.size)
        keep = valid_length_mask(prompts) & valid_length_mask(outputs)
        num_kept = int(np.count_nonzero(keep))
        accepted = self.add(bucket_id, LengthHistogram.from_samples(outputs[keep]), prompt_count=num_kept,
                            prompt_sum_tokens=float(prompts[keep].sum()))
        return int(prompts.size - (num_kept if accepted else 0))

    def record_running(self, bucket_id: int, running: LengthHistogram) -> bool:
        """Set the output lengths of the requests running when the bucket closes (the latest call wins).

        Returns False when the bucket is below the floor.
        """
        bucket = self._bucket(bucket_id)
        if bucket is None:
            return False
        bucket.running = running
        return True

    # ------------------------------------------------------------------------------------------ rebase

    def rebase(self, from_bucket_id: int) -> None:
        """Drop every bucket before `from_bucket_id`; later adds to them are refused.

        The window then opens when `from_bucket_id` opened: the running snapshot of the last dropped bucket
        (or unknown, when it had none) becomes the opening's. With no bucket before it, only the floor moves.
        """
        position = bisect.bisect_left(self._ids, from_bucket_id)
        if position > 0:
            # (With nothing kept before it, the oldest kept bucket's opening is already the window's.)
            self._opening = self._buckets[self._ids[position - 1]].running
            self._drop_before(position)
        self._floor_id = from_bucket_id if self._floor_id is None else max(self._floor_id, from_bucket_id)
        self._opens_at_rebase = True
        self.num_rebases += 1

    def bucket_of_sample(self, sample_index: int) -> int | None:
        """The bucket that received the sample with this index (see num_samples); None when pruned or unknown."""
        if not self._spans or sample_index < self._spans[0][0] or sample_index >= self._num_samples:
            return None
        starts = [start for start, _ in self._spans]
        position = bisect.bisect_right(starts, sample_index) - 1
        return self._spans[position][1]

    # ------------------------------------------------------------------------------------------ output

    def window(self, *, max_samples: int, min_samples: int = 1) -> WindowView | None:
        """The newest buckets whose completions first reach max_samples (all kept buckets when fewer).

        Whole buckets are merged, so the count can exceed max_samples by less than one bucket. Returns None
        when the kept buckets hold fewer than min_samples completions (right after a rebase: the caller holds
        its previous decision).

        Raises:
            ValueError: max_samples < 1 or above retain_samples, or min_samples > max_samples.
        """
        if not 1 <= max_samples <= self._retain or min_samples > max_samples:
            raise ValueError(f"need 1 ≤ max_samples ≤ retain_samples ({self._retain}) and min_samples ≤ "
                             f"max_samples, got max_samples={max_samples} min_samples={min_samples}")
        chosen: list[_Bucket] = []
        total = 0
        for bucket_id in reversed(self._ids):
            bucket = self._buckets[bucket_id]
            chosen.append(bucket)
            total += bucket.num_outputs
            if total >= max_samples:
                break
        if total < max(min_samples, 1):
            return None
        chosen.reverse()
        first_position = len(self._ids) - len(chosen)
        opening = self._opening if first_position == 0 else self._buckets[self._ids[first_position - 1]].running
        closing = chosen[-1].running
        censored = truncated = None
        if opening is not None and closing is not None:
            censored, truncated = closing, opening
        rebased = self._opens_at_rebase and first_position == 0
        return WindowView(
            completed=sum_of(b.merged_outputs() for b in chosen),
            prompt_count=sum(b.prompt_count for b in chosen),
            prompt_sum_tokens=float(sum(b.prompt_sum_tokens for b in chosen)),
            censored=censored,
            truncated=truncated,
            first_bucket_id=chosen[0].bucket_id,
            last_bucket_id=chosen[-1].bucket_id,
            rebased=rebased,
            transient=rebased and truncated is not None and total < TRANSIENT_FACTOR * truncated.count,
        )

    # ---------------------------------------------------------------------------------------- internal

    def _bucket(self, bucket_id: int) -> _Bucket | None:
        if self._floor_id is not None and bucket_id < self._floor_id:
            return None
        bucket = self._buckets.get(bucket_id)
        if bucket is None:
            bucket = _Bucket(bucket_id=bucket_id)
            position = bisect.bisect_left(self._ids, bucket_id)
            if position == 0 and self._ids and bucket_id != self._floor_id:
                # A new oldest bucket: what ran when it opened is not known (a rebase point's opening is).
                self._opening = None
            self._ids.insert(position, bucket_id)
            self._buckets[bucket_id] = bucket
        return bucket

    def _prune(self) -> None:
        # Keep the newest buckets that reach retain_samples, and at most max_buckets.
        total = 0
        keep_from = 0
        for position in range(len(self._ids) - 1, -1, -1):
            total += self._buckets[self._ids[position]].num_outputs
            if total >= self._retain:
                keep_from = position
                break
        keep_from = max(keep_from, len(self._ids) - self._max_buckets)
        if keep_from > 0:
            self._opening = self._buckets[self._ids[keep_from - 1]].running
            self._drop_before(keep_from)
            self._floor_id = self._ids[0]
            self._opens_at_rebase = False

    def _drop_before(self, position: int) -> None:
        for bucket_id in self._ids[:position]:
            del self._buckets[bucket_id]
        del self._ids[:position]
        kept = set(self._ids)
        while self._spans and self._spans[0][1] not in kept:
            self._spans.popleft()


def fit_window(view: WindowView) -> HazardFit | None:
    """`fit_hazard_histogram` of a window view: completions, prompts, censored and truncated requests, and
    the transient mark."""
    return fit_hazard_histogram(
        view.completed, prompt_count=view.prompt_count, prompt_sum_tokens=view.prompt_sum_tokens,
        censored=view.censored, truncated=view.truncated, shift_transient=view.transient,
    )
