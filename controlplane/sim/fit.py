"""Fit a twin profile from recorded step telemetry, with the controller's own estimator.

Input: JSON lines, one engine step per line, in the controller-side format
    {"prefill_tokens": int, "decode_tokens": int, "decode_requests": int, "duration_s": float,
     "decode_context_tokens": int (optional), "prefill_attention_pairs": int (optional)}
(what the controller ingests from TelemetryBatch; `controlplane sim run --steps-out` writes the same format
from a twin run), or the agent's report (CP_AGENT_REPORT with CP_STEP_TRACE=1), whose step trace carries
all six per step.

The shared terms, γ per KV context token of the decodes and λ per prefill attention pair, are fitted first over
all the steps together (`_fit_shared_terms`) and taken out of the durations; the per-phase α/β are then
`controlplane.core.cost_model.CostModelEstimator`'s fits (prefill-only, decode-only and mixed, each with one
round of MAD outlier rejection). Parsing is pure (`parse_steps`); `read_steps` reads the file it is given.
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
# Optional per step: Σ KV context of the decoding requests (tokens) and the causal query-key pairs of the
# prefill chunks; with them the context term γ and the prefix-attention term λ are fitted.
CONTEXT_KEY = "decode_context_tokens"
ATTENTION_KEY = "prefill_attention_pairs"


@dataclass(frozen=True, eq=False)
class StepColumns:
    """Columnar steps: prefill tokens, decode tokens, decode requests, duration (s)."""

    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    decode_requests: np.ndarray
    duration_s: np.ndarray
    decode_context_tokens: np.ndarray | None = None
    prefill_attention_pairs: np.ndarray | None = None

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
            lines = [json.dumps({k: step.get(k) for k in (*STEP_KEYS, CONTEXT_KEY, ATTENTION_KEY) if k in step})
                     for step in timed]
    rows: list[tuple[float, ...]] = []
    contexts: list[float] = []
    pairs: list[float] = []
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
            pairs.append(float(item.get(ATTENTION_KEY, math.nan)))
        except (TypeError, ValueError):
            raise ValueError(f"{source}:{number}: {', '.join((*STEP_KEYS, CONTEXT_KEY, ATTENTION_KEY))} must be "
                             "numbers") from None
    if not rows:
        raise ValueError(f"{source}: no steps")
    data = np.asarray(rows, dtype=np.float64)
    optional = [np.asarray(values, dtype=np.float64) for values in (contexts, pairs)]
    context, attention = (None if np.isnan(column).any() else column for column in optional)
    return StepColumns(data[:, 0], data[:, 1], data[:, 2], data[:, 3], context, attention)


def read_steps(path: Path) -> StepColumns:
    """Read and parse a JSON-lines step file. Raises OSError or ValueError."""
    return parse_steps(path.read_text(), source=str(path))


def steps_to_jsonl(steps: dict[str, np.ndarray]) -> str:
    """A twin run's step log (`RunResult.steps`) in the controller-side JSON-lines format, with the decode
    context and prefill attention pairs of every step."""
    columns = [steps[name].tolist() for name in ("prefill_tokens", "num_decodes", "decode_context_tokens",
                                                  "prefill_attention_pairs", "duration_s")]
    lines = []
    for prefill, decodes, context, pairs, duration in zip(*columns, strict=True):
        lines.append(json.dumps({"prefill_tokens": prefill, "decode_tokens": decodes, "decode_requests": decodes,
                                 CONTEXT_KEY: context, ATTENTION_KEY: pairs, "duration_s": duration}))
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
    context_s_per_token, attention_s_per_pair = _fit_shared_terms(steps)
    duration_s = steps.duration_s
    if context_s_per_token > 0.0:
        duration_s = duration_s - context_s_per_token * steps.decode_context_tokens
    if attention_s_per_pair > 0.0:
        duration_s = duration_s - attention_s_per_pair * steps.prefill_attention_pairs
    estimator = CostModelEstimator(window=max(8, steps.num_steps))
    rejected = estimator.add_steps(prefill_tokens=steps.prefill_tokens, decode_tokens=steps.decode_tokens,
                                   decode_requests=steps.decode_requests, duration_s=duration_s)
    fit = estimator.fit()
    costs = fit.to_cost_model()
    profile = None
    if costs is not None and all(math.isfinite(x) for x in (costs.alpha_p_s, costs.alpha_d_s)):
        profile = SimProfile(name=name, costs=costs, shape=shape, decode_context_s_per_token=context_s_per_token,
                             prefill_attention_s_per_pair=attention_s_per_pair,
                             source=source or f"fitted from {steps.num_steps} recorded steps")
    return ProfileFit(profile=profile, fit=fit, num_steps=steps.num_steps, num_rejected=rejected)


def _fit_shared_terms(steps: StepColumns) -> tuple[float, float]:
    """(γ, λ): seconds per KV context token of the decoding requests and per prefill attention pair.

    One robust least-squares fit over every step, with the twin's per-phase forms (α_p + β_p·prefill tokens,
    α_d + β_d·decodes, α_MB + (c0 + c1·r + c2·r²)·tokens) plus γ·Σ decode context and λ·attention pairs
    shared by the phases. Both terms vary within each phase, so they are told apart from the per-phase slopes
    by all the steps together; fitted on decode-only steps alone, γ absorbs whatever correlates with the
    context there (more requests, longer contexts) and then overshoots the mixed steps. When the mixed steps
    cover too narrow a range of r for the quadratic term (a singular design), the mixed form is additive
    (α_MB + β'_p·prefill tokens + β'_d·decodes). A term whose column is absent or all zero stays 0.0; a term
    that comes out negative is dropped and the fit redone.
    """
    valid = (steps.duration_s > 0.0) & ((steps.prefill_tokens + steps.decode_tokens) > 0.0)
    prefill, decodes = steps.prefill_tokens[valid], steps.decode_tokens[valid]
    is_prefill = decodes == 0.0
    is_decode = prefill == 0.0
    is_mixed = ~is_prefill & ~is_decode
    tokens = np.where(is_mixed, prefill + decodes, 1.0)
    additive = [is_decode, is_mixed, prefill * is_prefill, steps.decode_requests[valid] * is_decode,
                prefill * is_mixed, decodes * is_mixed]
    quadratic = [*additive, decodes * decodes / tokens * is_mixed]
    shared = {name: column[valid] for name, column in (("context", steps.decode_context_tokens),
                                                      ("attention", steps.prefill_attention_pairs))
              if column is not None and np.any(column[valid])}
    while shared:
        fit = None
        for phase_columns in (quadratic, additive):
            columns = [c.astype(np.float64) for c in phase_columns if np.any(c)] + list(shared.values())
            fit = robust_linear_fit(np.column_stack(columns), steps.duration_s[valid])
            if fit is not None:
                break
        if fit is None:
            return 0.0, 0.0
        terms = dict(zip(shared, fit.coefficients[-len(shared):], strict=True))
        if all(math.isfinite(v) and v >= 0.0 for v in terms.values()):
            return terms.get("context", 0.0), terms.get("attention", 0.0)
        del shared[min(terms, key=lambda name: terms[name] if math.isfinite(terms[name]) else -math.inf)]
    return 0.0, 0.0
