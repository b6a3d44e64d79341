"""How well a fitted profile explains the steps it was fitted on, and whether the twin can use it.

`check_profile_fit` replays every recorded step through the twin's own cost formula
(`controlplane.sim.costs.StepCosts`, with the step's decode context and prefill attention pairs) and compares
the predicted duration with the measured one, per phase: R² on the raw durations (not on the residual left
after the shared terms, which would flatter the fit) and the median absolute relative error. It also lists
what would make the profile unusable: no profile, a mixed fit without a positive fixed cost (the quadratic
and the additive mixed models both traded α_MB against their slopes, so EB+ would get a meaningless
interference term), or any step the formula predicts at or below zero. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.sim.costs import StepCosts
from controlplane.sim.fit import ProfileFit, StepColumns

PHASES = ("prefill", "decode", "mixed")


@dataclass(frozen=True, slots=True)
class PhaseAccuracy:
    """The twin's formula against the measured durations of one phase's steps."""

    phase: str
    num_steps: int
    r2: float
    median_abs_rel_error: float


@dataclass(frozen=True, slots=True)
class FitCheck:
    """Per-phase accuracy (phases without steps are left out) and the reasons the profile is not usable
    (empty when it is)."""

    accuracy: tuple[PhaseAccuracy, ...]
    problems: tuple[str, ...]


def check_profile_fit(result: ProfileFit, steps: StepColumns) -> FitCheck:
    """Replay `steps` through `result.profile`'s cost formula; see the module docstring."""
    problems: list[str] = []
    if result.profile is None:
        return FitCheck((), ("no profile: the prefill-only or decode-only fit is missing or not positive",))
    mixed = result.fit.mixed
    if mixed is not None and mixed.coefficients[0] <= 0.0:
        problems.append(f"the mixed-step fit has no positive fixed cost (α_MB = {mixed.coefficients[0]:.4g} s): "
                        "the mixed steps do not tell α_MB apart from the per-token slopes (record mixed steps "
                        "over a range of decode counts)")
    costs = StepCosts(result.profile)
    context = steps.decode_context_tokens
    pairs = steps.prefill_attention_pairs
    predicted = np.array([
        costs.duration_s(int(p), int(d), int(context[i]) if context is not None else 0,
                         int(pairs[i]) if pairs is not None else 0)
        for i, (p, d) in enumerate(zip(steps.prefill_tokens.tolist(), steps.decode_requests.tolist(), strict=True))
    ])
    measured = steps.duration_s
    timed = (measured > 0.0) & ((steps.prefill_tokens + steps.decode_tokens) > 0.0)
    nonpositive = int(np.count_nonzero(timed & (predicted <= 0.0)))
    if nonpositive:
        problems.append(f"the formula predicts a duration ≤ 0 for {nonpositive} recorded steps")
    is_prefill = steps.decode_requests == 0.0
    is_decode = steps.prefill_tokens == 0.0
    masks = {"prefill": timed & is_prefill, "decode": timed & is_decode, "mixed": timed & ~is_prefill & ~is_decode}
    accuracy = []
    for phase in PHASES:
        mask = masks[phase]
        if not mask.any():
            continue
        observed, fitted = measured[mask], predicted[mask]
        total = float(((observed - observed.mean()) ** 2).sum())
        r2 = 1.0 if total <= 0.0 else 1.0 - float(((observed - fitted) ** 2).sum()) / total
        error = float(np.median(np.abs(fitted - observed) / observed))
        accuracy.append(PhaseAccuracy(phase, int(np.count_nonzero(mask)), r2, error))
    return FitCheck(tuple(accuracy), tuple(problems))


def describe_fit(result: ProfileFit, check: FitCheck) -> list[str]:
    """Printable lines: the estimator's coefficients per phase, the shared terms, the replay accuracy and the
    problems (each line starts with 'problem:')."""
    lines = []
    for phase in PHASES:
        fit = getattr(result.fit, phase)
        if fit is None:
            lines.append(f"{phase:<8} too few steps")
            continue
        coefficients = ", ".join(f"{c:.4g}" for c in fit.coefficients)
        lines.append(f"{phase:<8} coefficients [{coefficients}]  samples {fit.num_samples}  outliers "
                     f"{fit.num_outliers}")
    if result.profile is not None:
        lines.append(f"shared   γ = {result.profile.decode_context_s_per_token:.4g} s per KV context token of "
                     f"the decodes, λ = {result.profile.prefill_attention_s_per_pair:.4g} s per prefill "
                     "attention pair")
    for item in check.accuracy:
        lines.append(f"replay   {item.phase:<8} {item.num_steps:>6} steps  R² {item.r2:.3f}  median |error| "
                     f"{item.median_abs_rel_error * 100:.1f}%")
    lines.extend(f"problem: {problem}" for problem in check.problems)
    return lines
