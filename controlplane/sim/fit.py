"""Fit a twin profile from recorded step telemetry, with the controller's own estimator.

Input: JSON lines, one engine step per line, in the controller-side format
    {"prefill_tokens": int, "decode_tokens": int, "decode_requests": int, "duration_s": float}
(what the controller ingests from TelemetryBatch; `controlplane sim run --steps-out` writes the same format
from a twin run). The agent's CP_AGENT_REPORT step trace is NOT accepted: it records each step's
composition but no duration, so no cost can be fitted from it.

The fit is `controlplane.core.cost_model.CostModelEstimator` over all the steps (prefill-only, decode-only and
mixed fits, each with one round of MAD outlier rejection). Parsing is pure (`parse_steps`); `read_steps`
reads the file it is given.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controlplane.core.cost_model import CostFit, CostModelEstimator, robust_linear_fit
from controlplane.sim.profiles import EngineShape, SimProfile

STEP_KEYS = ("prefill_tokens", "decode_tokens", "decode_requests", "duration_s")
# Optional per step: Σ KV context of the decoding requests (tokens); with it the context term γ is fitted.
CONTEXT_KEY = "decode_context_tokens"


@dataclass(frozen=True, eq=False)
class StepColumns:
    """Columnar steps: prefill tokens, decode tokens, decode requests, duration (s)."""

    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    decode_requests: np.ndarray
    duration_s: np.ndarray
    decode_context_tokens: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return int(self.duration_s.size)


def parse_steps(text: str, *, source: str = "steps") -> StepColumns:
    """Parse JSON-lines steps, or the agent's report (CP_AGENT_REPORT with CP_STEP_TRACE=1: a JSON object
    whose "steps" carry prefill_tokens, decode_tokens, decode_requests and duration_s). Raises ValueError
    naming the line and key that are wrong, and a dedicated message for a report without durations."""
    stripped = text.strip()
    if stripped.startswith("{") and "\n" not in stripped:
        lines = [stripped]
    else:
        lines = [line for line in stripped.splitlines() if line.strip()]
    if len(lines) == 1:
        try:
            whole = json.loads(lines[0])
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and isinstance(whole.get("steps"), list):
            timed = [step for step in whole["steps"]
                     if isinstance(step, dict) and isinstance(step.get("duration_s"), (int, float))
                     and step.get("total_tokens", 1) > 0]
            if not timed:
                raise ValueError(f"{source}: this agent report (CP_AGENT_REPORT) has no step with a duration_s; "
                                 "record it with CP_STEP_TRACE=1, or give JSON lines with "
                                 f"{', '.join(STEP_KEYS)}.")
            lines = [json.dumps({k: step.get(k) for k in (*STEP_KEYS, CONTEXT_KEY) if k in step}) for step in timed]
    rows: list[tuple[float, ...]] = []
    contexts: list[float] = []
    for number, line in enumerate(lines, start=1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise ValueError(f"{source}:{number}: expected a JSON object")
        missing = [k for k in STEP_KEYS if k not in item]
        if missing:
            raise ValueError(f"{source}:{number}: missing {', '.join(missing)}")
        try:
            rows.append(tuple(float(item[k]) for k in STEP_KEYS))  # type: ignore[arg-type]
            contexts.append(float(item.get(CONTEXT_KEY, math.nan)))
        except (TypeError, ValueError):
            raise ValueError(f"{source}:{number}: {', '.join(STEP_KEYS)} must be numbers") from None
    if not rows:
        raise ValueError(f"{source}: no steps")
    data = np.asarray(rows, dtype=np.float64)
    context = np.asarray(contexts, dtype=np.float64)
    return StepColumns(data[:, 0], data[:, 1], data[:, 2], data[:, 3],
                       None if np.isnan(context).any() else context)


def read_steps(path: Path) -> StepColumns:
    """Read and parse a JSON-lines step file. Raises OSError or ValueError."""
    return parse_steps(path.read_text(), source=str(path))


def steps_to_jsonl(steps: dict[str, np.ndarray]) -> str:
    """A twin run's step log (`RunResult.steps`) in the controller-side JSON-lines format."""
    lines = []
    for prefill, decodes, duration in zip(steps["prefill_tokens"].tolist(), steps["num_decodes"].tolist(),
                                          steps["duration_s"].tolist(), strict=True):
        lines.append(json.dumps({"prefill_tokens": prefill, "decode_tokens": decodes, "decode_requests": decodes,
                                 "duration_s": duration}))
    return "\n".join(lines) + ("\n" if lines else "")


@dataclass(frozen=True, eq=False)
class ProfileFit:
    """The fitted profile (None when a phase had too few steps) and the estimator's fits (R², samples)."""

    profile: SimProfile | None
    fit: CostFit
    num_steps: int
    num_rejected: int


def fit_profile(steps: StepColumns, *, name: str, shape: EngineShape, source: str = "") -> ProfileFit:
    """Fit α/β of prefill, decode and mixed steps. The profile is None unless both the prefill-only and the
    decode-only fits succeeded with positive coefficients; without mixed steps α_MB = α_p and the MB
    coefficients are 0 (say so to the user: EB+ then has no interference term)."""
    context_s_per_token, duration_s = 0.0, steps.duration_s
    if steps.decode_context_tokens is not None:
        context_s_per_token = _fit_context_term(steps)
        duration_s = steps.duration_s - context_s_per_token * steps.decode_context_tokens
    estimator = CostModelEstimator(window=max(8, steps.num_steps))
    rejected = estimator.add_steps(prefill_tokens=steps.prefill_tokens, decode_tokens=steps.decode_tokens,
                                   decode_requests=steps.decode_requests, duration_s=duration_s)
    fit = estimator.fit()
    costs = fit.to_cost_model()
    profile = None
    if costs is not None and all(math.isfinite(x) for x in (costs.alpha_p_s, costs.alpha_d_s)):
        profile = SimProfile(name=name, costs=costs, shape=shape, decode_context_s_per_token=context_s_per_token,
                             source=source or f"fitted from {steps.num_steps} recorded steps")
    return ProfileFit(profile=profile, fit=fit, num_steps=steps.num_steps, num_rejected=rejected)


def _fit_context_term(steps: StepColumns) -> float:
    """γ, seconds per KV context token of the decoding requests, from the decode-only steps:
    duration = α_d + β_d·requests + γ·Σ context (robust least squares). 0.0 when it cannot be fitted or
    comes out negative; the step durations the other fits see have γ·Σ context taken out."""
    context = steps.decode_context_tokens
    decode_only = (steps.prefill_tokens == 0) & (steps.decode_requests > 0) & (steps.duration_s > 0)
    if context is None or np.count_nonzero(decode_only) < 8:
        return 0.0
    fit = robust_linear_fit(np.column_stack((steps.decode_requests[decode_only], context[decode_only])),
                            steps.duration_s[decode_only])
    if fit is None or not math.isfinite(fit.coefficients[2]):
        return 0.0
    return max(0.0, fit.coefficients[2])
