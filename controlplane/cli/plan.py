"""`controlplane plan`: evaluate the decision core for given inputs (the what-if planner).

Prints every term of the formulas as a table, or as JSON with --json. Costs come from the four cost
flags or from one or more eb-vllm calibration files (--calibration); flags given explicitly win.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from controlplane.core.calibration import CalibrationError, CalibrationProfile, parse_calibration
from controlplane.core.policy import evaluate
from controlplane.core.types import CostModel, EngineLimits, PolicyConfig, WorkloadStats

_DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384


def _mb_coeffs(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--mb-coeffs needs three comma-separated numbers C0,C1,C2, got {text!r}")
    try:
        c0, c1, c2 = (float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mb-coeffs: not a number in {text!r}") from None
    return c0, c1, c2


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("plan", help="evaluate the formulas for given inputs (what-if planner)",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    costs = parser.add_argument_group("costs (seconds), or --calibration")
    costs.add_argument("--alpha-p", type=float, help="fixed cost of a prefill step, s")
    costs.add_argument("--beta-p", type=float, help="cost per prefill token, s/token")
    costs.add_argument("--alpha-d", type=float, help="fixed cost of a decode step, s")
    costs.add_argument("--beta-d", type=float, help="cost per decoding request, s/request")
    costs.add_argument("--alpha-mb", type=float, help="fixed cost of a mixed step, s (default: alpha-p)")
    costs.add_argument("--mb-coeffs", type=_mb_coeffs, metavar="C0,C1,C2",
                       help="beta_MB^e(r) = C0 + C1·r + C2·r², s/token (default 0,0,0)")
    costs.add_argument("--calibration", type=Path, action="append", default=[], metavar="FILE",
                       help="eb-vllm calibration JSON (pd_calibration or beta_mb); may repeat")
    workload = parser.add_argument_group("workload")
    workload.add_argument("--p0", type=float, help="hazard intercept, per token (default 1/mu-o)")
    workload.add_argument("--eta", type=float, default=0.0, help="hazard slope, per token² (default 0)")
    workload.add_argument("--mu-l", type=float, required=True, help="mean prompt length, tokens")
    workload.add_argument("--mu-o", type=float, required=True, help="mean output length, tokens")
    engine = parser.add_argument_group("engine")
    engine.add_argument("--kv-capacity-tokens", type=int, required=True, help="KV cache capacity C, tokens")
    engine.add_argument("--oom-tolerance", type=float, default=0.01, help="epsilon, P(KV overflow) (0.01)")
    engine.add_argument("--max-num-seqs", type=int, default=1024, help="engine slot count (1024)")
    engine.add_argument("--n-prev", type=int, default=0, help="previous N* for the IFR correction (0: none)")
    engine.add_argument("--n-obs", type=float, default=0.0, help="observed occupancy N_obs (0: use N*)")
    engine.add_argument("--delta", type=float, default=0.0, help="operator margin delta, s/token (0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)


def _cost_model(args: argparse.Namespace, parser: argparse.ArgumentParser) -> CostModel:
    profile = CalibrationProfile()
    for path in args.calibration:
        try:
            document = json.loads(path.read_text())
            profile = profile.merged(parse_calibration(document))
        except OSError as exc:
            parser.error(f"--calibration {path}: cannot read: {exc.strerror}")
        except json.JSONDecodeError as exc:
            parser.error(f"--calibration {path}: not JSON: {exc}")
        except CalibrationError as exc:
            parser.error(f"--calibration {path}: {exc}")
    flags = {"alpha_p_s": args.alpha_p, "beta_p_s_per_token": args.beta_p, "alpha_d_s": args.alpha_d,
             "beta_d_s_per_request": args.beta_d, "alpha_mb_s": args.alpha_mb,
             "mb_coeffs_s_per_token": args.mb_coeffs}
    profile = profile.merged(CalibrationProfile(**{k: v for k, v in flags.items() if v is not None}))
    costs = profile.to_cost_model()
    if costs is None:
        parser.error("costs missing: give --alpha-p --beta-p --alpha-d --beta-d or --calibration FILE")
    return costs


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    costs = _cost_model(args, parser)
    for name in ("mu_l", "mu_o"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {value}")
    if args.max_num_seqs < 1:
        parser.error(f"--max-num-seqs must be ≥ 1, got {args.max_num_seqs}")
    if args.kv_capacity_tokens < 0:
        parser.error(f"--kv-capacity-tokens must be ≥ 0, got {args.kv_capacity_tokens}")
    try:
        config = PolicyConfig(oom_tolerance=args.oom_tolerance)
    except ValueError as exc:
        parser.error(f"--oom-tolerance: {exc}")
    p0 = args.p0 if args.p0 is not None else 1.0 / args.mu_o
    workload = WorkloadStats(p0=p0, eta=args.eta, mu_l_tokens=args.mu_l, mu_o_tokens=args.mu_o)
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
        "n_star": result.n_star,
        "k_star": result.k_star,
        "lhs": result.lhs_s_per_token,
        "rhs": result.rhs_s_per_token,
        "delta": result.delta_s_per_token,
        "mode": result.mode_instant.value,
        "decode_ratio": result.decode_ratio,
        "beta_eb_w": result.beta_eb_w_s_per_token,
        "beta_mb_e": result.beta_mb_e_s_per_token,
        "n_obs": result.n_obs,
        "p0": min(p0, 1.0) if math.isfinite(p0) and p0 > 0 else 0.0,
        "eta": args.eta,
        "gamma": (p0 * costs.alpha_p_s / costs.alpha_d_s) if costs.alpha_d_s > 0 else 0.0,
        "flags": [f.value for f in result.flags],
    }
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


_LABELS: dict[str, str] = {
    "p0": "p0 (hazard intercept, 1/token)",
    "eta": "eta (hazard slope, 1/token²)",
    "gamma": "gamma = p0·α_p/α_d",
    "theta0": "θ0 (CFR threshold)",
    "delta_theta": "Δθ (IFR correction)",
    "theta_star": "θ* (clipped)",
    "n_star": "N* (memory-safe batch, requests)",
    "k_star": "k* (phase-switch threshold, requests)",
    "decode_ratio": "r = μ_O/(μ_L+μ_O)",
    "beta_mb_e": "β_MB^e(r) (s/token)",
    "beta_eb_w": "β_EB^w (s/token)",
    "n_obs": "N_obs (requests)",
    "lhs": "LHS = β_MB^e − β_EB^w (s/token)",
    "rhs": "RHS (s/token)",
    "delta": "δ (s/token)",
    "mode": "mode (MB if LHS < RHS + δ)",
}


def _table(report: dict[str, Any]) -> str:
    width = max(len(label) for label in _LABELS.values())
    lines = []
    for key, label in _LABELS.items():
        value = report[key]
        text = f"{value:.6g}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<{width}}  {text}")
    lines.append(f"{'flags':<{width}}  {', '.join(report['flags']) or '-'}")
    return "\n".join(lines)
