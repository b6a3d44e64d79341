"""Per-pool mergeable statistics in time buckets, and the pool estimate fitted from them.

Every completion and step an engine of a pool reports goes into the pool's open bucket (bucket id =
⌊now_s / bucket_s⌋ on the controller's clock). A closed bucket is immutable: a sparse histogram of output
lengths, the count and sum of prompt lengths, the normal-equation sums of the step costs
(`core.cost_sums.CostSums`) and the histogram of the output lengths so far of the requests running when it
closed (the sum of each engine's latest report; `forget_engine` drops an engine that left), and both by the
bucket each request was first scheduled in when the engines report it (`core.admitted_counts`). Replicas publish
their closed buckets and add each other's, so every replica holds the same buckets for one pool; a window is
a sum of buckets, and a fit costs O(distinct lengths), not O(samples).

The estimate used at time t is the one for the window ending at bucket `estimate_bucket(t)`
= ⌊(t − settle_s)/bucket_s⌋ − 1: replicas publish a bucket as soon as it closes and read each other's
`settle_s` later, so two replicas compute an estimate for the same end bucket from the same data.

The window: the newest buckets up to the end bucket until they hold the configured number of completions,
prompts and steps, never older than max_window_s. Its completions are fitted with the requests running at its
close (right-censored) and at its opening (left-truncated), when both are known (`core.survival`), those of the
engines that left or entered the pool inside it with them (`loop.turnover`); a window that would start at a
bucket whose opening is unknown (the pool's first) starts one bucket later.

Shifts: each refresh first feeds the settled buckets to a `loop.shift_tracker.ShiftTracker`; after a confirmed
shift the completions and prompts of the window never reach back before the change point's bucket (re-based;
costs are not, a workload shift is not a hardware one). An alarm of the length detector is confirmed by a log-
rank test of the hazard between the buckets before its change point and those since, each with its running
requests at both ends (`_compare_at_shift`): a length-biased completion stream of one law does not re-base the
window. A re-based window is fitted once it holds shift_min_samples completions, and only when its μ̂_O lies on
the shift's side of the one in force at the shift (`estimate.contradicts_shift`); the previous fit stands until
then. While the requests in flight at its opening still weigh on it, it is fitted as transient
(`core.survival.is_shift_transient`). After a shift, when every bucket read knows its requests' admissions, the
window holds only the requests admitted since the new law began (`_cohort`, `_cohort_start`): the change point's
bucket after a shift towards shorter outputs, where the admissions changed after one towards longer outputs
(`core.admission_change`); the old law's requests, in flight for an old lifetime after the shift, are not part
of it. A re-based or cohort window keeps a hazard slope only at `core.hazard.shift_slope_z` standard errors, any
other only once the window a bucket earlier shows it too (`Window.fit`). A shift is not a cold
start: a decision from a re-based window is made whatever its size (`core.policy.decide(established=True)`, passed
by `loop.engine`), and every count shown is the one fitted.

Pure: no I/O, no clock (times are arguments). A bucket and its wire format: `loop.buckets`.
"""

from __future__ import annotations

import math

import numpy as np

from controlplane.core.admission_change import admission_change_point
from controlplane.core.admitted_counts import AdmittedCounts
from controlplane.core.change_detection import ShiftDetector
from controlplane.core.cost_sums import CostSums, StepColumns
from controlplane.core.hazard import MEAN_LOWER_BOUND_Z
from controlplane.core.length_histogram import LengthHistogram, sum_of
from controlplane.core.survival import (
    HazardComparison,
    WindowObservations,
    compare_hazards,
    running_mean_lower_bound,
)
from controlplane.core.types import CostModel
from controlplane.loop.buckets import (
    MAX_ADMISSION_LAG_BUCKETS,
    MAX_STEPS_PER_BATCH,
    SNAPSHOT_REPLICA,
    BucketStats,
    OpenBucket,
    evenly_spaced,
)
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.estimate import Cohort, PoolEstimate, Window, contradicts_shift, episode_reference
from controlplane.loop.ingest import Latencies
from controlplane.loop.outcomes import OUTCOME_WINDOW_S, OutcomeWindow
from controlplane.loop.running_reports import RunningReports
from controlplane.loop.shift_tracker import PRE_BUCKETS, REWIND_BUCKETS, PoolShift, ShiftTracker

# The most admission buckets before a shift's latest change point that `_cohort_start` scans.
MAX_SCAN_BUCKETS = 4 * PRE_BUCKETS
# A change point in admission time found by `_cohort_start` is one of the data through a multiple of this many
# buckets.
COHORT_RESCAN_BUCKETS = 8


class PoolStatistics:
    """The buckets of one pool on one replica: its own (open and closed) and other replicas' (closed)."""

    def __init__(self, pool_key: str, config: DecisionLoopConfig, *, replica_id: str, settle_s: float = 0.5) -> None:
        self.pool_key = pool_key
        self._config = config
        self.replica_id = replica_id
        self.settle_s = settle_s
        self._open: OpenBucket | None = None
        self._buckets: dict[int, dict[str, BucketStats]] = {}
        # Each engine's latest running-requests histogram, summed when a bucket closes, and the turnover.
        self._running = RunningReports()
        self._shifts = ShiftTracker(ShiftDetector()) if config.shift_detection else None
        self.estimate: PoolEstimate | None = None
        self.last_window: BucketStats | None = None
        self._keep_from: int | None = None  # set by refresh: older buckets can enter no later window
        # The latest change point `_cohort_start` found, with what it was found from.
        self._change_point: tuple[tuple, int] | None = None
        # The latest shift episode's first bucket and μ̂_O of the fit in force when it was confirmed.
        self._before_episode: tuple[int, float] | None = None
        # (end bucket, an ordinary window, `HazardFit.slope_sign` or None without a fit) of the latest fit.
        self._last_slope: tuple[int, bool, int | None] | None = None
        # The latencies of the last OUTCOME_WINDOW_S of closed buckets, every replica's.
        self.outcomes = OutcomeWindow(max(1, math.ceil(OUTCOME_WINDOW_S / config.bucket_s)), config.bucket_s)

    # ---- time ----

    def bucket_of(self, now_s: float) -> int:
        return math.floor(now_s / self._config.bucket_s)

    def estimate_bucket(self, now_s: float) -> int:
        """The end bucket of the estimate in force at now_s (closed and settled on every replica)."""
        return math.floor((now_s - self.settle_s) / self._config.bucket_s) - 1

    def oldest_bucket(self, end_bucket: int) -> int:
        return end_bucket - max(0, math.ceil(self._config.max_window_s / self._config.bucket_s) - 1)

    # ---- ingest ----

    def add(self, now_s: float, *, prompts: np.ndarray, outputs: np.ndarray, steps: StepColumns | None,
            engine_id: str = "", running_lengths: np.ndarray | None = None,
            running_counts: np.ndarray | None = None, admitted_age_s: np.ndarray | None = None,
            running_admitted_age_s: np.ndarray | None = None,
            latencies: Latencies | None = None) -> tuple[BucketStats, int] | None:
        """Add one engine's validated completions and steps at now_s (O(1): the arrays are kept).

        running_lengths / running_counts: the engine's running requests as a histogram of their output
        lengths so far (`ValidatedBatch.running_lengths / running_counts`; empty: none running); they replace
        the engine's previous report and count in every bucket that closes until the next one (None: keep
        the previous report).
        admitted_age_s: per output, how long before now_s the engine first scheduled it (NaN or a size other
        than the outputs': not known, and the bucket's admissions are then unknown).
        running_admitted_age_s: the same per running entry, with running_lengths (a size other than the
        entries', or empty with entries: not known).
        latencies: the batch's finished requests' latencies (None: the engine reports no latency stamps); on
        probation too (an engine's latencies are outcomes of the pool whatever its lengths are judged to be).

        Returns the bucket this call closed (with its id) when now_s is past the open bucket, for publishing.
        Steps whose duration is far from the current estimate's cost model are kept out of the cost sums
        when the bucket closes (`core.cost_sums`).
        """
        closed = self.close_due(now_s)
        if running_lengths is not None and running_counts is not None:
            ages = running_admitted_age_s
            known = ages is not None and ages.size == running_lengths.size and bool(np.isfinite(ages).all())
            if self._running.report(engine_id, (running_lengths, running_counts),
                                    self._admission_buckets(now_s, ages) if known else None):
                # The engine enters: its requests that finished since it was last seen were in flight unseen,
                # and they are no observation of a window (`loop.turnover`).
                outputs = outputs[:0]
        bucket = self._open
        if bucket is None:
            bucket = self._open = OpenBucket(bucket_id=self.bucket_of(now_s))
        if outputs.size:
            if admitted_age_s is not None and admitted_age_s.size == outputs.size:
                admitted = self._admission_buckets(now_s, admitted_age_s)
                bucket.admission_known &= bool(np.isfinite(admitted).all())
            else:
                bucket.admission_known = False
                admitted = np.zeros(outputs.size)
            bucket.add_completions(engine_id, prompts, outputs, admitted)
        if latencies is not None:
            bucket.add_latencies(engine_id, latencies.ttft_s, latencies.tpot_s, latencies.queue_s)
        if steps is not None and steps.duration_s.size:
            size = steps.duration_s.size
            if size > MAX_STEPS_PER_BATCH:
                # A systematic subsample: a pool's cost fit needs thousands of steps, not the millions per
                # second a large fleet reports (1,000 engines × 1,000 steps/s).
                keep = evenly_spaced(size, MAX_STEPS_PER_BATCH)
                steps = StepColumns(steps.prefill_tokens[keep], steps.decode_tokens[keep],
                                    steps.decode_requests[keep], steps.duration_s[keep])
            bucket.steps.append(steps.prefill_tokens, steps.decode_tokens, steps.decode_requests, steps.duration_s)
        return closed

    def _admission_buckets(self, now_s: float, ages_s: np.ndarray) -> np.ndarray:
        """The bucket ids (as float64, NaN where unknown) of admissions ages_s seconds before now_s."""
        return np.floor((now_s - np.asarray(ages_s, dtype=np.float64)) / self._config.bucket_s)

    def forget_engine(self, engine_id: str) -> None:
        """Stop counting an engine's running requests (it disconnected, left the pool or was kept out of it):
        they leave the pool at the next bucket close, right-censored there (`loop.turnover`)."""
        self._running.forget(engine_id)

    def close_due(self, now_s: float) -> tuple[BucketStats, int] | None:
        """Close the open bucket when now_s is past its end; returns (stats, bucket id) or None."""
        bucket = self._open
        if bucket is None or self.bucket_of(now_s) <= bucket.bucket_id:
            return None
        self._open = None
        running, admitted, turnover = self._running.close(bucket.bucket_id)
        stats = bucket.close(self.estimate.costs if self.estimate is not None else None, running, admitted,
                             turnover)
        self._buckets.setdefault(bucket.bucket_id, {})[self.replica_id] = stats
        self._note_completions(stats)
        if stats.latencies is not None:
            self.outcomes.put(bucket.bucket_id, self.replica_id, stats.latencies)
        return stats, bucket.bucket_id

    def _note_completions(self, stats: BucketStats) -> None:
        if stats.outputs.count > 0:
            self._running.first_reports = None

    def put_remote(self, bucket_id: int, replica_id: str, stats: BucketStats) -> None:
        """Another replica's closed bucket (its own replica id is ignored: local data wins)."""
        if replica_id != self.replica_id:
            self._buckets.setdefault(bucket_id, {})[replica_id] = stats
            self._note_completions(stats)
            if stats.latencies is not None:
                self.outcomes.put(bucket_id, replica_id, stats.latencies)

    def seed(self, stats: BucketStats, *, now_s: float) -> None:
        """Warm start: a persisted window of this pool (`last_window` of an earlier run) stands in as the
        oldest bucket in force, under replica id SNAPSHOT_REPLICA. Newer buckets take precedence as they
        fill the window, and it ages out after max_window_s like any bucket. Its running requests are
        unknown (a window's ends are not a bucket's close)."""
        self._buckets.setdefault(self.estimate_bucket(now_s), {})[SNAPSHOT_REPLICA] = BucketStats(
            outputs=stats.outputs, prompt_count=stats.prompt_count, prompt_sum_tokens=stats.prompt_sum_tokens,
            costs=stats.costs, running=None)
        self._note_completions(stats)

    @property
    def num_buckets_held(self) -> int:
        """Closed buckets held (each with one entry per replica that sent it)."""
        return len(self._buckets)

    def has_bucket(self, bucket_id: int, replica_id: str) -> bool:
        return replica_id in self._buckets.get(bucket_id, {})

    def prune(self, now_s: float) -> None:
        """Forget buckets no later window can read (a later window reads no older bucket than the latest one:
        buckets only gain data and the change point only moves forward): older than max_window_s or than what
        the latest refresh read (`Window.keep_from`: what the window would read without its change point's
        floor and the bucket before, for its opening; what a shift confirmation may read, the last PRE_BUCKETS +
        2 · REWIND_BUCKETS + 1 and those of a pending one). A busy pool holds a few buckets."""
        oldest = self.oldest_bucket(self.estimate_bucket(now_s))
        if self._keep_from is not None:
            oldest = max(oldest, self._keep_from)
        for bucket_id in [b for b in self._buckets if b < oldest]:
            del self._buckets[bucket_id]

    # ---- estimate ----

    def _replicas_of(self, bucket_id: int) -> tuple[str, ...]:
        return tuple(sorted(self._buckets.get(bucket_id, ())))

    def _completions_of(self, bucket_id: int) -> LengthHistogram:
        by_replica = self._buckets.get(bucket_id, {})
        return sum_of(by_replica[replica].outputs for replica in sorted(by_replica))

    def _running_at(self, bucket_id: int, *, admitted_since: int | None = None) -> LengthHistogram | None:
        """The pool's running requests when the bucket closed: the sum over the replicas holding it (a
        persisted window counts for none); None when one of them does not know its own. With admitted_since,
        only those admitted in that bucket or later (None also when one does not know their admissions)."""
        if admitted_since is not None:
            admitted = self._admitted_running(bucket_id)
            return sum_of(a.since(admitted_since) for a in admitted) if admitted else None
        parts = self._per_replica(bucket_id, "running")
        return sum_of(parts) if parts else None

    def _admitted_running(self, bucket_id: int) -> list[AdmittedCounts] | None:
        """Each replica's running requests by admission bucket when the bucket closed (a persisted window counts
        for none); None when one of them does not know their admissions."""
        return self._per_replica(bucket_id, "admitted_running")

    def _per_replica(self, bucket_id: int, name: str) -> list | None:
        """Attribute `name` of each replica's bucket (a persisted window counts for none); None when one is."""
        parts = [getattr(stats, name) for replica, stats in sorted(self._buckets.get(bucket_id, {}).items())
                 if replica != SNAPSHOT_REPLICA]
        return None if any(part is None for part in parts) else parts

    def _running_only_floor(self, end_bucket: int) -> float:
        """What the running requests at end_bucket prove about μ_O before any completion
        (`running_mean_lower_bound`). Requests count at risk only past their lengths when first seen: this
        replica's engines' first reports, and for another replica's the running requests of the first of its
        buckets held (what it saw of them before is not known here). 1 when a running report is unknown."""
        running = self._running_at(end_bucket)
        if running is None or self._running.first_reports is None:
            return 1.0
        first_of: dict[str, int] = {}
        for bucket_id in sorted(b for b in self._buckets if b <= end_bucket):
            for replica in self._buckets[bucket_id]:
                if replica not in (self.replica_id, SNAPSHOT_REPLICA):
                    first_of.setdefault(replica, bucket_id)
        entered = list(self._running.first_reports.values())
        for replica, bucket_id in first_of.items():
            first = self._buckets[bucket_id][replica].running
            if first is None:
                return 1.0
            entered.append(first)
        return running_mean_lower_bound(running, z=MEAN_LOWER_BOUND_Z,
                                        entered=sum_of(entered) if entered else None)

    def _segment(self, first: int, last: int) -> tuple[LengthHistogram, LengthHistogram | None,
                                                         LengthHistogram | None]:
        """(completions, censored, truncated) of the buckets [first, last]: the running requests at the close
        of `last` and of first − 1, with the turnover between (`_ends`); None when unknown."""
        completed = sum_of(self._completions_of(b) for b in range(first, last + 1) if b in self._buckets)
        return (completed, *self._ends(self._running_at(last), self._running_at(first - 1), first, last))

    def _ends(self, closing: LengthHistogram | None, opening: LengthHistogram | None, first: int, last: int, *,
              admitted_since: int | None = None) -> tuple[LengthHistogram | None, LengthHistogram | None]:
        """(censored, truncated) of the buckets [first, last], from the running requests at their close and
        opening with the turnover between (`loop.turnover`; admitted_since: only the requests admitted in that
        bucket or later); (None, None) when an end, or an admission asked for, is unknown."""
        if closing is None or opening is None:
            return None, None
        left, entered = [closing], [opening]
        for bucket_id in range(first, last + 1):
            for stats in self._buckets.get(bucket_id, {}).values():
                turnover = stats.turnover
                if turnover is None:
                    continue
                if admitted_since is None:
                    left.append(turnover.left)
                    entered.append(turnover.entered)
                elif turnover.left_admitted is None or turnover.entered_admitted is None:
                    return None, None
                else:
                    left.append(turnover.left_admitted.since(admitted_since))
                    entered.append(turnover.entered_admitted.since(admitted_since))
        return sum_of(left), sum_of(entered)

    def _compare_at_shift(self, pre_first: int, start_bucket: int, through_bucket: int) -> HazardComparison | None:
        """The shift tracker's confirmation test (`loop.shift_tracker.Compare`): the hazards of the buckets
        [pre_first, start_bucket) against [start_bucket, through_bucket], each with its running requests at
        both ends when all four are known (else completions only, for both). None when the buckets before
        hold no completion."""
        before = self._before_shift(pre_first, start_bucket, through_bucket)
        after = self._segment(start_bucket, through_bucket)
        if not before[0].count:
            return None
        if any(part is None for part in (*before[1:], *after[1:])):
            return compare_hazards(WindowObservations(completed=before[0]), WindowObservations(completed=after[0]))
        return compare_hazards(WindowObservations(*before), WindowObservations(*after))

    def _before_shift(self, pre_first: int, start_bucket: int, through_bucket: int) -> tuple[
            LengthHistogram, LengthHistogram | None, LengthHistogram | None]:
        """`_segment` of the buckets [pre_first, start_bucket), starting after the first bucket whose opening is
        known, when one is (a pool's first bucket has none), and never before the oldest a window ending at
        through_bucket may read."""
        pre_first = max(pre_first, self.oldest_bucket(through_bucket))
        pre_first = next((b for b in range(pre_first, start_bucket) if self._running_at(b - 1) is not None),
                         pre_first)
        return self._segment(pre_first, start_bucket - 1)

    def _window(self, end_bucket: int, *, opens_after: int | None = None) -> Window:
        """Sum the newest buckets ≤ end_bucket until they hold the configured window (never beyond
        max_window_s; completions and prompts never before the re-base bucket, nor before opens_after + 1).

        A window whose requests running at its close are known but whose opening is not (it starts at the
        pool's first bucket: the requests then running had started before it, unseen) would be fitted on its
        completions alone, length-biased; it starts one bucket later instead, whose opening is that first
        bucket's close (not for a warm-start snapshot, which has no running requests to know)."""
        config = self._config
        oldest = self.oldest_bucket(end_bucket)
        rebase = self._shifts.rebase_bucket if self._shifts is not None else None
        floor = rebase if rebase is not None and rebase > oldest else oldest
        output_floor = floor if opens_after is None else max(floor, opens_after + 1)
        hists: list[LengthHistogram] = []
        prompt_count, prompt_sum = 0, 0.0
        costs = CostSums()
        num_outputs = 0
        used = 0
        replicas: set[str] = set()
        first_output = last_output = None
        # What the window would read from without the change point's floor (kept by `prune`).
        needed_from: int | None = None
        unfloored_outputs = unfloored_prompts = 0
        in_range = sorted(b for b in self._buckets if oldest <= b <= end_bucket)
        for bucket_id in reversed(in_range):
            in_floor = bucket_id >= output_floor
            take_outputs = in_floor and num_outputs < config.output_window
            take_prompts = in_floor and prompt_count < config.prompt_window
            take_costs = costs.num_steps < 3 * config.step_window
            unfloored = unfloored_outputs < config.output_window or unfloored_prompts < config.prompt_window
            if not (take_outputs or take_prompts or take_costs or unfloored):
                break
            by_replica = self._buckets[bucket_id]
            needed_from = bucket_id
            for stats in by_replica.values():
                unfloored_outputs += stats.outputs.count
                unfloored_prompts += stats.prompt_count
            if not (take_outputs or take_prompts or take_costs):
                continue
            used += 1
            if take_outputs:
                first_output = bucket_id
                last_output = bucket_id if last_output is None else last_output
            for replica, stats in sorted(by_replica.items()):
                replicas.add(replica)
                if take_outputs:
                    hists.append(stats.outputs)
                    num_outputs += stats.outputs.count
                if take_prompts:
                    prompt_count += stats.prompt_count
                    prompt_sum += stats.prompt_sum_tokens
                if take_costs and (stats.costs.num_steps or stats.costs.num_rejected):
                    costs.add_sums(stats.costs)
        merged = sum_of(hists) if hists else LengthHistogram.empty()
        censored = truncated = None
        if first_output is not None and last_output is not None:
            # The opening: the running requests at the close of the newest bucket held before the window's
            # first (none held: no batch reached the pool in between, or the opening is out of reach).
            opening = next((b for b in range(first_output - 1, oldest - 2, -1) if b in self._buckets), None)
            censored = self._running_at(last_output)
            truncated = self._running_at(opening) if opening is not None else None
            if (truncated is None and censored is not None and censored.count and opens_after is None
                    and first_output < last_output and SNAPSHOT_REPLICA not in self._buckets[first_output]
                    and self._running_at(first_output) is not None):
                return self._window(end_bucket, opens_after=first_output)
            if opening is not None:
                censored, truncated = self._ends(censored, truncated, opening + 1, last_output)
            if censored is None or truncated is None or (censored.count == 0 and truncated.count == 0):
                censored = truncated = None
        cohort = None
        cohort_reads_from = None
        if (opens_after is None and last_output is not None and rebase is not None and floor == rebase
                and end_bucket - rebase < MAX_ADMISSION_LAG_BUCKETS):
            cohort = self._cohort(rebase, last_output)
            last_shift = self._shifts.last_shift if self._shifts is not None else None
            reports_admissions = all(stats.admitted_outputs is not None
                                     for stats in self._buckets.get(last_output, {}).values())
            if last_shift is not None and reports_admissions:
                # `_cohort_start`'s scan, and the opening of a cohort starting there
                cohort_reads_from = self._cohort_scan_first(last_shift, rebase) - 1
        if cohort is not None:
            merged, censored, truncated = cohort.completed, cohort.censored, cohort.truncated
            first_output = cohort.first_bucket
        stats = BucketStats(outputs=merged, prompt_count=prompt_count, prompt_sum_tokens=prompt_sum, costs=costs)
        keep_from = None
        if needed_from is not None:  # and the bucket before it, the opening of a window that starts there
            position = in_range.index(needed_from)
            keep_from = in_range[position - 1] if position > 0 else needed_from
        if cohort_reads_from is not None:  # a later cohort window reads no earlier while the shift stands
            keep_from = cohort_reads_from if keep_from is None else min(keep_from, cohort_reads_from)
        return Window(stats=stats, num_buckets=used, contributors=tuple(sorted(replicas)),
                       first_output_bucket=first_output, censored=censored,
                       truncated=truncated, rebased=floor > oldest and num_outputs < config.output_window,
                       keep_from=keep_from, cohort=cohort is not None)

    def _cohort(self, rebase: int, last_bucket: int) -> Cohort | None:
        """The window ending at last_bucket of the requests admitted since the latest shift (`_cohort_start`):
        the newest buckets until their completions of such requests reach output_window (never before that
        start), those running at its close and at its opening. None when the start is not found, is more than
        MAX_ADMISSION_LAG_BUCKETS back, or a bucket read does not know its completions' admissions, or either
        end its running requests'.

        Why: after a shift to shorter outputs the old law's requests in flight at the change point (and those
        still queued) finish over a whole old lifetime and dominate the re-based window; the requests admitted
        since are the new law's alone. Measured in the twin (H200, Qwen3-8B, c = 2,048, geometric 1,024 →
        256, 5 seeds): k̂*·N̂* and N̂* settle within 10% / 5% after a median 187 / 262 new-law completions
        instead of 546 / 1,303. After a shift to longer outputs the old law's short requests still finishing
        weigh on the re-based window the same way, but the change point in the completion stream lags the new
        law's first admissions (its requests finish only after their lifetimes), so the cohort starts where the
        admissions changed."""
        since = self._cohort_start(rebase, last_bucket)
        if since is None or last_bucket - since >= MAX_ADMISSION_LAG_BUCKETS:
            return None
        parts: list[LengthHistogram] = []
        num_completed = 0
        first = last_bucket
        for bucket_id in range(last_bucket, since - 1, -1):
            if num_completed >= self._config.output_window:
                break
            first = bucket_id
            for replica, stats in self._buckets.get(bucket_id, {}).items():
                if replica == SNAPSHOT_REPLICA or stats.admitted_outputs is None:
                    return None
                part = stats.admitted_outputs.since(since)
                parts.append(part)
                num_completed += part.count
        censored, truncated = self._ends(self._running_at(last_bucket, admitted_since=since),
                                         self._running_at(first - 1, admitted_since=since) if first > since
                                         else LengthHistogram.empty(), first, last_bucket, admitted_since=since)
        if censored is None or truncated is None:
            return None
        return Cohort(sum_of(parts) if parts else LengthHistogram.empty(), censored, truncated, first)

    def _cohort_start(self, rebase: int, last_bucket: int) -> int | None:
        """The first admission bucket of the latest shift's law: after a shift to shorter outputs its change
        point's bucket (the new law's short requests finish soon after they start); after a shift to longer
        ones where the admissions changed (`core.admission_change`), scanning the requests admitted since
        `_cohort_scan_first` with candidates up to the change point. None when that is not found, or a bucket
        scanned does not know its completions' admissions or its running requests'.

        A change point found is one of the data through the latest multiple of COHORT_RESCAN_BUCKETS at or
        after the re-base, kept until that bucket, the scan's first or a bucket of it changes: the scan read
        every bucket since the episode at every refresh, 22% of the refresh CPU in the twin (H200, c = 2,048,
        128 → 1,024 tokens, 20 seeds: 116 s of 525). Until one is found, the scan reads all of them."""
        last_shift = self._shifts.last_shift if self._shifts is not None else None
        if last_shift is None:
            return None
        if last_shift.direction < 0:
            return rebase
        first = self._cohort_scan_first(last_shift, rebase)
        through = last_bucket - last_bucket % COHORT_RESCAN_BUCKETS
        if through > rebase:
            key = (first, rebase, through, tuple((b, self._replicas_of(b)) for b in range(first, through + 1)))
            if self._change_point is not None and self._change_point[0] == key:
                return self._change_point[1]
            found = self._scan_admissions(first, rebase, through, last_shift.direction)
            if found is not None:
                self._change_point = (key, found)
                return found
        return self._scan_admissions(first, rebase, last_bucket, last_shift.direction)

    def _scan_admissions(self, first: int, rebase: int, through: int, direction: int) -> int | None:
        """`core.admission_change.admission_change_point` of the requests admitted since `first`, seen
        through bucket `through` (completions and those running at its close); None also when a bucket read
        does not know its requests' admissions."""
        admitted: list[AdmittedCounts] = []
        for bucket_id in range(first, through + 1):
            for replica, stats in self._buckets.get(bucket_id, {}).items():
                if replica == SNAPSHOT_REPLICA or stats.admitted_outputs is None:
                    return None
                admitted.append(stats.admitted_outputs)
        running = self._admitted_running(through)
        if running is None:
            return None
        return admission_change_point(admitted, running, first_bucket=first, last_candidate=rebase,
                                      direction=direction)

    def _cohort_scan_first(self, last_shift: PoolShift, rebase: int) -> int:
        """The oldest admission bucket `_cohort_start` scans: PRE_BUCKETS + REWIND_BUCKETS before the first
        change point of the shift's episode (`PoolShift.episode_start_bucket`; the buckets its confirmation
        kept), never more than MAX_SCAN_BUCKETS before the latest, nor before the oldest bucket held."""
        first = max(last_shift.episode_start_bucket - PRE_BUCKETS - REWIND_BUCKETS, rebase - MAX_SCAN_BUCKETS)
        return max(first, min(self._buckets, default=first))

    def _slope_sign_before(self, end_bucket: int, rebase: int | None) -> int | None:
        """The `HazardFit.slope_sign` of the window ending a bucket before end_bucket (None: no fit): the latest
        fit's when it was that window and an ordinary one, else fitted again, so that replicas agree whatever
        refreshes each made, and a replica whose re-base was undone agrees with one that never had it."""
        if self._last_slope is not None and self._last_slope[0] == end_bucket - 1 and self._last_slope[1]:
            return self._last_slope[2]
        window = self._window(end_bucket - 1)
        fit = window.fit(after_shift=window.after_shift(rebase), slope_sign_before=None)
        return fit.slope_sign if fit is not None else None

    def refresh(self, now_s: float, *, calibration: CostModel | None) -> PoolEstimate:
        """Feed the settled buckets to the shift tracker, then fit the estimate for estimate_bucket(now_s)
        (kept as `self.estimate`)."""
        end_bucket = self.estimate_bucket(now_s)
        self.close_due(now_s)
        self.outcomes.advance(end_bucket)
        shifts = self._shifts
        if shifts is not None:
            shifts.advance(end_bucket, first_bucket=self.oldest_bucket(end_bucket), replicas_of=self._replicas_of,
                           completions_of=self._completions_of, compare=self._compare_at_shift)
        window = self._window(end_bucket)
        # The shift tracker may feed the last REWIND_BUCKETS again, and a confirmation started in one of them
        # reads PRE_BUCKETS + REWIND_BUCKETS before it and the opening of those (`shift_tracker._Pending`).
        recent = end_bucket - PRE_BUCKETS - 2 * REWIND_BUCKETS - 1
        if shifts is not None and shifts.keep_from is not None:
            recent = min(recent, shifts.keep_from - 1)
        self._keep_from = recent if window.keep_from is None else min(window.keep_from, recent)
        stats = window.stats
        previous = self.estimate
        last_shift = shifts.last_shift if shifts is not None else None
        self._before_episode = episode_reference(self._before_episode, last_shift, previous)
        rebase = shifts.rebase_bucket if shifts is not None else None
        after_shift = window.after_shift(rebase)
        held = ((window.rebased or window.cohort) and stats.outputs.count < self._config.shift_min_samples
                and previous is not None and previous.fit is not None)
        if held:
            fit = previous.fit
        else:
            self.last_window = stats
            fit = window.fit(after_shift=after_shift,
                             slope_sign_before=None if after_shift else self._slope_sign_before(end_bucket, rebase))
            self._last_slope = (end_bucket, not after_shift, fit.slope_sign if fit is not None else None)
            if ((window.rebased or window.cohort) and previous is not None and previous.fit is not None
                    and contradicts_shift(fit, last_shift, self._before_episode)):
                fit, held = previous.fit, True
        cost_fit = stats.costs.fit()
        costs, source = calibration, "calibration"
        if costs is None:
            costs, source = cost_fit.to_cost_model(), "online"
            if costs is None:
                source = "none"
        lower = fit.mu_o_lower_tokens if fit is not None else 1.0
        if fit is None and self._running.first_reports is not None:
            lower = self._running_only_floor(end_bucket)
        self.estimate = PoolEstimate(
            pool_key=self.pool_key, end_bucket=end_bucket, fit=fit, mu_o_lower_tokens=lower,
            num_samples=fit.stats.num_samples if held and fit is not None else int(stats.outputs.count),
            cost_fit=cost_fit, costs=costs, cost_source=source, num_buckets=window.num_buckets,
            contributors=window.contributors, num_rejected_steps=stats.costs.num_rejected,
            window_first_bucket=window.first_output_bucket, window_rebased=window.rebased,
            window_cohort=window.cohort and not held,
            window_transient=window.transient and not held, fit_held=held,
            num_censored=window.censored.count if window.censored is not None and not held else 0,
            num_truncated=window.truncated.count if window.truncated is not None and not held else 0,
            last_shift=last_shift,
            num_shifts=shifts.num_shifts if shifts is not None else 0,
            num_unconfirmed_shifts=shifts.num_unconfirmed if shifts is not None else 0,
        )
        return self.estimate
