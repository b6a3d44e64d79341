"""`PoolEstimate`: the pool terms every engine of a pool is decided from (`loop.pool_stats` fits it), and the
flags a decision carries about the window it stands on, and the windows it is fitted from with the slope test
each kind of window asks for (`Window.fit`). Pure."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.core.cost_model import CostFit
from controlplane.core.hazard import SLOPE_SIGNIFICANCE_Z, HazardFit, fit_hazard_histogram, shift_slope_z
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.survival import is_shift_transient
from controlplane.core.types import CostModel
from controlplane.loop.buckets import BucketStats
from controlplane.loop.shift_tracker import PoolShift

# The decision flag of an estimate whose window starts at a detected shift's change point.
WINDOW_REBASED_FLAG = "window_rebased_after_shift"
# The decision flag of an estimate fitted on the requests admitted since the latest shift's law began.
WINDOW_COHORT_FLAG = "window_admitted_since_shift"
# The decision flag of an estimate whose re-based window was not fitted: the previous fit stands (`fit_held`).
FIT_HELD_FLAG = "fit_held_after_shift"


@dataclass(frozen=True, slots=True)
class PoolEstimate:
    """The pool terms every engine of the pool is decided from.

    end_bucket: the newest bucket in the window. fit: the hazard fit (None without completions).
    costs: the cost model in use (the pool's calibration when set, else the online fit; None when neither is
    usable). cost_source: "calibration" | "online" | "none". contributors: replica ids whose buckets were summed.
    window_first_bucket: the oldest bucket whose completions are in the window (None: no completion).
    window_rebased: the window starts at the change point of a detected shift (it holds fewer completions
      than output_window). window_cohort: re-based at a shift and fitted on the
      requests admitted since its new law began alone (`PoolStatistics._cohort`). window_transient: re-based,
      and the requests in flight at its opening still weigh on it (the fit keeps p0, with η = 0 and
      μ_O = 1/p0). fit_held: the window was re-based (or is a cohort) but holds fewer than shift_min_samples
      completions, or its fit contradicts the shift's direction (`contradicts_shift`): `fit` is the previous
      estimate's (decisions carry FIT_HELD_FLAG).
    num_censored / num_truncated: requests running at the window's close / opening used by the fit (0 when
      either end is unknown). last_shift: the latest shift detected in the pool (None: none yet); num_shifts:
      how many were detected (and confirmed); num_unconfirmed_shifts: the detector's alarms the hazard test
      dropped (`loop.shift_tracker`). mu_o_lower_tokens: a lower confidence bound on μ_O: the fit's, or
      before the pool's first completion the one its running requests alone prove
      (`survival.running_mean_lower_bound`); 1 when nothing is proven.
    """

    pool_key: str
    end_bucket: int
    fit: HazardFit | None
    num_samples: int
    cost_fit: CostFit
    costs: CostModel | None
    cost_source: str
    num_buckets: int
    contributors: tuple[str, ...]
    num_rejected_steps: int = 0
    window_first_bucket: int | None = None
    window_rebased: bool = False
    window_cohort: bool = False
    window_transient: bool = False
    fit_held: bool = False
    num_censored: int = 0
    num_truncated: int = 0
    last_shift: PoolShift | None = None
    num_shifts: int = 0
    num_unconfirmed_shifts: int = 0
    mu_o_lower_tokens: float = 1.0


@dataclass(frozen=True, slots=True)
class Window:
    """A window of buckets: the summed stats (running None) and what the fit needs to know about its ends."""

    stats: BucketStats
    num_buckets: int
    contributors: tuple[str, ...]
    first_output_bucket: int | None
    censored: LengthHistogram | None
    truncated: LengthHistogram | None
    rebased: bool
    keep_from: int | None = None  # the oldest bucket a later window can read (`PoolStatistics.prune`)
    cohort: bool = False  # completions and censored requests are those admitted since the new law began

    def after_shift(self, rebase_bucket: int | None) -> bool:
        """Whether the window is a shift's own: re-based, a cohort, or a full window that starts at the change
        point (`rebase_bucket`) and still holds the old law's stragglers."""
        return self.rebased or self.cohort or (rebase_bucket is not None and self.first_output_bucket == rebase_bucket)

    @property
    def transient(self) -> bool:
        """Re-based and still holding the requests in flight at its opening (`core.survival.is_shift_transient`)."""
        return is_shift_transient(rebased=self.rebased, num_completed=self.stats.outputs.count,
                                  truncated=self.truncated)

    def fit(self, *, after_shift: bool, slope_sign_before: int | None) -> HazardFit | None:
        """The hazard fit of the window (None without a completion or a prompt). A shift's window keeps a slope
        only at `shift_slope_z` standard errors and at once; any other at SLOPE_SIGNIFICANCE_Z and only when its
        sign is slope_sign_before's, the previous window's (`fit_hazard_histogram(slope_sign_before=)`)."""
        stats = self.stats
        if not (stats.outputs.count and stats.prompt_count):
            return None
        return fit_hazard_histogram(stats.outputs, prompt_count=stats.prompt_count,
                                    prompt_sum_tokens=stats.prompt_sum_tokens, censored=self.censored,
                                    truncated=self.truncated, shift_transient=self.transient,
                                    slope_z=shift_slope_z(stats.outputs.count) if after_shift else SLOPE_SIGNIFICANCE_Z,
                                    slope_sign_before=None if after_shift else slope_sign_before)


@dataclass(frozen=True, slots=True)
class Cohort:
    """The window of the requests admitted since the latest shift's law began (`PoolStatistics._cohort`): their
    completions in the buckets [first_bucket, the window's last], those running at its close and at its opening."""

    completed: LengthHistogram
    censored: LengthHistogram
    truncated: LengthHistogram
    first_bucket: int


def moved_on_shift(previous: PoolEstimate | None, estimate: PoolEstimate) -> bool:
    """Whether a refreshed estimate must reach the pool's engines at once rather than at their next interval: a
    shift was confirmed since `previous`, or this is the first fit of the shift's own window (re-based or a
    cohort, no longer held). Later refreshes of that young window reach the engines at their usual cadence: at a
    few completions a second its fits are noisy, and deciding on each would show the engines every wobble."""
    if previous is None:
        return False
    if estimate.num_shifts > previous.num_shifts:
        return True
    young = estimate.window_rebased or estimate.window_cohort
    was_young_fit = (previous.window_rebased or previous.window_cohort) and not previous.fit_held
    return young and not estimate.fit_held and estimate.fit is not None and not was_young_fit


def episode_reference(before_episode: tuple[int, float] | None, shift: PoolShift | None,
                      previous: PoolEstimate | None) -> tuple[int, float] | None:
    """(first bucket of the latest shift's episode, μ̂_O of the fit in force when it was confirmed): kept while
    the episode lasts, taken from `previous` (the estimate before this refresh) when a new episode begins."""
    if shift is None or (before_episode is not None and before_episode[0] == shift.episode_start_bucket):
        return before_episode
    if previous is None or previous.fit is None:
        return None
    return shift.episode_start_bucket, previous.fit.stats.mu_o_tokens


def contradicts_shift(fit: HazardFit | None, shift: PoolShift | None,
                      before_episode: tuple[int, float] | None) -> bool:
    """Whether a fit of a window re-based at `shift` puts μ̂_O on the wrong side of the μ̂_O in force when the
    shift's episode was confirmed (`before_episode`: its first bucket and that μ̂_O): above it after a shift to
    shorter outputs, below it after one to longer outputs. The hazard test confirmed the direction; such a fit
    extrapolates its tail from a handful of completions and young survivors (after 1,024 → 256 tokens at
    1,000 completions/s on four engines the first one put μ̂_O at 2,446), and the previous fit stands instead."""
    if fit is None or shift is None or before_episode is None or before_episode[0] != shift.episode_start_bucket:
        return False
    return shift.direction * (fit.stats.mu_o_tokens - before_episode[1]) < 0
