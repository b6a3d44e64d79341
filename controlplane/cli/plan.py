"""`controlplane plan`: evaluate the decision core for given inputs (the what-if planner).

Prints every term of the formulas as a table, or as JSON with --json, whose keys carry their units as the
explain view's terms do (`lhs_s_per_token`, `n_star_requests`, `p0_per_token`; ratios and fractions have
none). Costs come from the four cost flags or from one or more eb-vllm calibration files (--calibration);
flags given explicitly win.

What it prints is what was used: p0, η and γ = p0·α_p/α_d are the values θ0 was solved with (after any
clipping), and every clip, floor, fallback or default the evaluation took is listed under "flags"
(e.g. `--p0 5` is clipped to 1 and flagged hazard_intercept_clipped). Inputs outside their domain are
errors naming the flag: costs must be normal positive numbers (≥ 2.2e-308, so γ cannot overflow),
lengths positive, --max-num-seqs and --n-prev at most 2^20 requests, --kv-capacity-tokens between 1 and
2^53, --n-obs 0 (unobserved) or between 1 and 2^20, and no input may be NaN or infinite.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from controlplane.cli.args import (
    MAX_REQUESTS,
    MAX_TOKENS,
    bounded_int,
    finite_float,
    positive_float,
)
from controlplane.core.calibration import CalibrationError, CalibrationProfile, parse_calibration
from controlplane.core.policy import evaluate
from controlplane.core.types import CostModel, EngineLimits, PolicyConfig, WorkloadStats

_DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384

# Flags the planner adds for the defaults it fills in (the core's flags come from evaluate()).
P0_FROM_MU_O = "p0_from_mu_o"
N_OBS_FROM_N_STAR = "n_obs_from_n_star"
ALPHA_MB_FROM_ALPHA_P = "alpha_mb_from_alpha_p"
MB_COEFFS_ZERO = "mb_coeffs_zero"

FLAG_MEANINGS: dict[str, str] = {
    "nonfinite_input": "an input was not finite and was replaced",
    "hazard_intercept_nonpositive": "p0 ≤ 0: replaced by 1/μ_O",
    "hazard_intercept_clipped": "p0 above 1 per token: clipped to 1",
    "gamma_nonfinite": "γ = p0·α_p/α_d overflowed: θ0 taken at its limit",
    "hazard_dfr_clipped": "η < 0 (decreasing hazard): clipped to 0",
    "alpha_d_nonpositive": "α_d ≤ 0: no usable cost model",
    "cost_nonpositive": "a cost ≤ 0: no usable cost model",
    "crossover_not_evaluated": "LHS/RHS not computable: the rule reads MB (stock behaviour)",
    "theta_clipped_low": "θ0 + Δθ below θ_min: clipped to θ_min",
    "theta_clipped_high": "θ0 + Δθ above θ_max: clipped to θ_max",
    "ifr_correction_bounded": "η/p0² > 1 and Δθ > θ0: Δθ cut to max(θ0, its value at η/p0² = 1)",
    "hazard_shift_transient": "window re-based at a detected shift, old requests still in it: η = 0, μ_O = 1/p0",
    "hazard_lognormal_tail": "μ_O, σ_O continue the length curve past its oldest ages by a fitted log-normal law, "
                             "and p0, η are that law's hazard line",
    "hazard_slope_unconfirmed": "a hazard slope the window a bucket earlier did not show: η = 0 until two windows "
                                "in a row show it",
    "kv_below_one_request": "the KV capacity minus the OOM reserve holds less than one request: N̂* floored at 1",
    "n_capped_by_max_num_seqs": "N̂* capped at --max-num-seqs",
    "memory_rate_from_mean": "N̂* uses max(p0, 1/μ_O) as the memory rate (p0 is far below 1/μ_O)",
    "memory_bound_from_occupancy": "the OOM reserve takes over 10% of the KV cache and σ_O ≤ μ_O: N̂* lifted "
                                   "towards the length-moment bound (μ_L, μ_O, σ_O; same ε), fully from 40%",
    "n_obs_invalid": "N_obs invalid: N̂* used",
    "delta_out_of_range": "δ beyond ±0.01 s/token: clipped to the limit",
    # Flags of online decisions only (decide()), listed so that every code has a meaning here.
    "samples_rejected": "out-of-range telemetry samples were dropped",
    "pin_invalid": "a pinned k or N outside the engine's limits was ignored",
    "budget_clamped": "the token budget was clamped to the engine's limits",
    "memory_guard": "N cut below N̂* after preemptions (memory guard)",
    "budget_cap_from_objective": "B_cap scaled by a latency objective's loop, within its budget bounds",
    "budget_max_from_objective": "MB's B_max scaled down with B_cap by a latency objective's loop (a TPOT target)",
    "eb_moot": "a prefill or decode instance (KV-transfer role): EB's phase switch acts on nothing there, MB",
    P0_FROM_MU_O: "--p0 not given: p0 = 1/μ_O (geometric outputs)",
    N_OBS_FROM_N_STAR: "--n-obs not given (0): N_obs = N̂*",
    ALPHA_MB_FROM_ALPHA_P: "α_MB not given: α_MB = α_p",
    MB_COEFFS_ZERO: "no β_MB coefficients given: β_MB^e(r) = 0",
}

_COST_FLAGS = {"alpha_p_s": "--alpha-p", "beta_p_s_per_token": "--beta-p", "alpha_d_s": "--alpha-d",
               "beta_d_s_per_request": "--beta-d", "alpha_mb_s": "--alpha-mb"}


def _mb_coeffs(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"needs three comma-separated numbers C0,C1,C2, got {text[:64]!r}")
    try:
        c0, c1, c2 = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number in {text[:64]!r}") from None
    if not all(math.isfinite(c) for c in (c0, c1, c2)):
        raise argparse.ArgumentTypeError(f"coefficients must be finite, got {text[:64]!r}")
    return c0, c1, c2


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plan", help="evaluate the formulas for given inputs (what-if planner)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    costs = parser.add_argument_group("costs (seconds), or --calibration")
    costs.add_argument("--alpha-p", type=positive_float, help="fixed cost of a prefill step, s (> 0)")
    costs.add_argument("--beta-p", type=positive_float, help="cost per prefill token, s/token (> 0)")
    costs.add_argument("--alpha-d", type=positive_float, help="fixed cost of a decode step, s (> 0)")
    costs.add_argument("--beta-d", type=positive_float, help="cost per decoding request, s/request (> 0)")
    costs.add_argument("--alpha-mb", type=positive_float,
                       help="fixed cost of a mixed step, s (> 0; default: alpha-p, flagged)")
    costs.add_argument("--mb-coeffs", type=_mb_coeffs, metavar="C0,C1,C2",
                       help="beta_MB^e(r) = C0 + C1·r + C2·r², s/token (default 0,0,0, flagged)")
    costs.add_argument("--calibration", type=Path, action="append", default=[], metavar="FILE",
                       help="eb-vllm calibration JSON (pd_calibration or beta_mb); may repeat")
    workload = parser.add_argument_group("workload")
    workload.add_argument("--p0", type=positive_float,
                          help="hazard intercept, per token (> 0; above 1 is clipped to 1, flagged; "
                               "default 1/mu-o, flagged)")
    workload.add_argument("--eta", type=finite_float, default=0.0,
                          help="hazard slope, per token² (default 0; below 0 is clipped to 0, flagged)")
    workload.add_argument("--mu-l", type=positive_float, required=True, help="mean prompt length, tokens (> 0)")
    workload.add_argument("--mu-o", type=positive_float, required=True, help="mean output length, tokens (> 0)")
    workload.add_argument("--sigma-o", type=positive_float,
                          help="standard deviation of output lengths, tokens (> 0); when ≤ μ_O and the OOM reserve is "
                               "large, N̂* also considers the length-moment bound (flag memory_bound_from_occupancy); "
                               "not given: [EB] Prop. 3.3 alone")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--kv-capacity-tokens", type=bounded_int(low=1, high=MAX_TOKENS), required=True,
                        help="KV cache capacity C, tokens (1 to 2^53)")
    engine.add_argument("--oom-tolerance", type=finite_float, default=0.01,
                        help="epsilon, P(KV overflow), in (0, 1) (default 0.01)")
    engine.add_argument("--max-num-seqs", type=bounded_int(low=1, high=MAX_REQUESTS), default=1024,
                        help="engine slot count, requests (1 to 2^20; default 1024)")
    engine.add_argument("--n-prev", type=bounded_int(low=0, high=MAX_REQUESTS), default=0,
                        help="previous N* for the IFR correction, requests (0 to 2^20; default 0: none)")
    engine.add_argument("--n-obs", type=finite_float, default=0.0,
                        help="observed running requests N_obs (1 to 2^20; default 0: use N*, flagged)")
    engine.add_argument("--delta", type=finite_float, default=0.0,
                        help="operator margin delta, s/token (default 0; beyond ±0.01 clipped, flagged)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def _cost_model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[CostModel, dict[str, str],
                                                                                      list[str]]:
    """The cost model, where each cost came from, and the planner flags of the defaults it took."""
    profile = CalibrationProfile()
    sources: dict[str, str] = {}
    for path in args.calibration:
        try:
            document = json.loads(path.read_text())
            parsed = parse_calibration(document)
        except OSError as exc:
            parser.error(f"--calibration {path}: cannot read: {exc.strerror}")
        except json.JSONDecodeError as exc:
            parser.error(f"--calibration {path}: not JSON: {exc}")
        except CalibrationError as exc:
            parser.error(f"--calibration {path}: {exc}")
        for name in (*_COST_FLAGS, "mb_coeffs_s_per_token"):
            if getattr(parsed, name) is not None:
                sources[name] = f"--calibration {path}"
        profile = profile.merged(parsed)
    flags = {"alpha_p_s": args.alpha_p, "beta_p_s_per_token": args.beta_p, "alpha_d_s": args.alpha_d,
             "beta_d_s_per_request": args.beta_d, "alpha_mb_s": args.alpha_mb,
             "mb_coeffs_s_per_token": args.mb_coeffs}
    for name, value in flags.items():
        if value is not None:
            sources[name] = _COST_FLAGS.get(name, "--mb-coeffs")
    profile = profile.merged(CalibrationProfile(**{k: v for k, v in flags.items() if v is not None}))
    costs = profile.to_cost_model()
    if costs is None:
        parser.error("costs missing: give --alpha-p --beta-p --alpha-d --beta-d or --calibration FILE")
    for name in _COST_FLAGS:
        value = getattr(costs, name)
        if name in sources and not (math.isfinite(value) and value >= sys.float_info.min):
            where = sources[name] if sources[name] == _COST_FLAGS[name] else f"{name} from {sources[name]}"
            parser.error(f"{where} must be > 0 (a normal number ≥ {sys.float_info.min:.3g}), got {value}")
    planner_flags = []
    if "alpha_mb_s" not in sources:
        planner_flags.append(ALPHA_MB_FROM_ALPHA_P)
        sources["alpha_mb_s"] = "α_p (default)"
    if "mb_coeffs_s_per_token" not in sources:
        planner_flags.append(MB_COEFFS_ZERO)
        sources["mb_coeffs_s_per_token"] = "default 0,0,0"
    return costs, sources, planner_flags


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    costs, sources, planner_flags = _cost_model(args, parser)
    try:
        config = PolicyConfig(oom_tolerance=args.oom_tolerance)
    except ValueError as exc:
        parser.error(f"--oom-tolerance: {exc}")
    if args.n_obs != 0.0 and not 1.0 <= args.n_obs <= MAX_REQUESTS:
        parser.error(f"--n-obs must be 0 (unobserved) or between 1 and {MAX_REQUESTS} requests, got {args.n_obs}")
    if args.p0 is None:
        p0 = 1.0 / args.mu_o
        planner_flags.insert(0, P0_FROM_MU_O)
    else:
        p0 = args.p0
    gamma = min(p0, 1.0) * costs.alpha_p_s / costs.alpha_d_s
    if not (math.isfinite(gamma) and gamma >= sys.float_info.min):
        parser.error(f"γ = p0·α_p/α_d = {gamma} is out of range (p0 {p0}, --alpha-p {costs.alpha_p_s}, "
                     f"--alpha-d {costs.alpha_d_s}): the ratio of the costs must be a normal number")
    if args.n_obs == 0.0:
        planner_flags.append(N_OBS_FROM_N_STAR)
    workload = WorkloadStats(p0=p0, eta=args.eta, mu_l_tokens=args.mu_l, mu_o_tokens=args.mu_o,
                             sigma_o_tokens=args.sigma_o or 0.0)
    limits = EngineLimits(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=_DEFAULT_MAX_NUM_BATCHED_TOKENS,
        kv_capacity_tokens=args.kv_capacity_tokens,
    )
    result = evaluate(workload, costs, limits, n_prev=args.n_prev, n_obs=args.n_obs,
                      delta_s_per_token=args.delta, config=config)
    report = {
        "theta0": result.theta0,
        "delta_theta": result.delta_theta,
        "theta_star": result.theta_star,
        "n_star_requests": result.n_star,
        "k_star_requests": result.k_star,
        "lhs_s_per_token": result.lhs_s_per_token,
        "rhs_s_per_token": result.rhs_s_per_token,
        "delta_s_per_token": result.delta_s_per_token,
        "delta_flip_s_per_token": result.lhs_s_per_token - result.rhs_s_per_token,
        "mode": result.mode_instant.value,
        "decode_ratio": result.decode_ratio,
        "beta_eb_w_s_per_token": result.beta_eb_w_s_per_token,
        "beta_mb_e_s_per_token": result.beta_mb_e_s_per_token,
        "n_obs_requests": result.n_obs,
        "p0_per_token": result.p0,
        "eta_per_token2": result.eta,
        "gamma": result.gamma,
        "flags": [f.value for f in result.flags] + planner_flags,
        "inputs": {
            "alpha_p_s": costs.alpha_p_s, "beta_p_s_per_token": costs.beta_p_s_per_token,
            "alpha_d_s": costs.alpha_d_s, "beta_d_s_per_request": costs.beta_d_s_per_request,
            "alpha_mb_s": costs.alpha_mb_s, "mb_coeffs_s_per_token": list(costs.mb_coeffs_s_per_token),
            "cost_sources": sources,
            "p0_per_token": p0, "eta_per_token2": args.eta, "mu_l_tokens": args.mu_l, "mu_o_tokens": args.mu_o,
            "sigma_o_tokens": args.sigma_o, "kv_capacity_tokens": args.kv_capacity_tokens,
            "oom_tolerance": args.oom_tolerance,
            "max_num_seqs": args.max_num_seqs, "n_prev": args.n_prev, "n_obs": args.n_obs,
            "delta_s_per_token": args.delta, "theta_min": config.theta_min, "theta_max": config.theta_max,
        },
    }
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


# The report's keys in table order, with their labels; the keys carry their unit as the explain view's terms
# do (`controlplane.cli.explain.TERMS`): ratios and fractions have none.
_LABELS: dict[str, str] = {
    "p0_per_token": "p0 used (hazard intercept, 1/token)",
    "eta_per_token2": "η used (hazard slope, 1/token²)",
    "gamma": "γ = p0·α_p/α_d (θ0 solved with it)",
    "theta0": "θ0 (CFR threshold)",
    "delta_theta": "Δθ (IFR correction)",
    "theta_star": "θ* (clipped)",
    "n_star_requests": "N* (memory-safe batch, requests)",
    "k_star_requests": "k* (phase-switch threshold, requests)",
    "decode_ratio": "r = μ_O/(μ_L+μ_O)",
    "beta_mb_e_s_per_token": "β_MB^e(r) (s/token)",
    "beta_eb_w_s_per_token": "β_EB^w (s/token)",
    "n_obs_requests": "N_obs (requests)",
    "lhs_s_per_token": "LHS = β_MB^e − β_EB^w (s/token)",
    "rhs_s_per_token": "RHS (s/token)",
    "delta_s_per_token": "δ (s/token)",
    "delta_flip_s_per_token": "δ_flip = LHS − RHS (s/token)",
    "mode": "mode (MB if LHS < RHS + δ)",
}

_INPUT_LABELS: dict[str, str] = {
    "alpha_p_s": "α_p (s)",
    "beta_p_s_per_token": "β_p (s/token)",
    "alpha_d_s": "α_d (s)",
    "beta_d_s_per_request": "β_d (s/request)",
    "alpha_mb_s": "α_MB (s)",
    "mb_coeffs_s_per_token": "β_MB coefficients C0,C1,C2 (s/token)",
    "mu_l_tokens": "μ_L (tokens)",
    "mu_o_tokens": "μ_O (tokens)",
    "sigma_o_tokens": "σ_O (tokens; not given: [EB] Prop. 3.3 alone)",
    "kv_capacity_tokens": "C (KV capacity, tokens)",
    "oom_tolerance": "ε (OOM tolerance)",
    "max_num_seqs": "max_num_seqs (requests)",
}


def _text(value: Any) -> str:
    """A value as table text: "-" for None (an input not given), 6 significant digits for floats, lists
    comma-joined."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    return str(value)


def _table(report: dict[str, Any]) -> str:
    inputs = report["inputs"]
    sources = inputs["cost_sources"]
    rows = []
    for key, label in _INPUT_LABELS.items():
        source = sources.get(key)
        rows.append((label, _text(inputs[key]) + (f"  ({source})" if source else "")))
    rows += [(label, _text(report[key])) for key, label in _LABELS.items()]
    width = max(len(label) for label, _ in [*rows, ("flags", "")])
    lines = [f"{label:<{width}}  {text}" for label, text in rows]
    lines.append(f"{'flags':<{width}}  {', '.join(report['flags']) or '-'}")
    lines += [f"  {flag}: {FLAG_MEANINGS.get(flag, '')}" for flag in report["flags"]]
    return "\n".join(lines)
