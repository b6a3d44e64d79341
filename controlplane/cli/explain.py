"""The explain view of one engine's decision: every term of the formulas, the crossover rule and its margin.

Built from a `DecisionView`: its `latest` computation when present (the controller computes more often than
it pushes), else the pushed `decision`. The rule ([EB] eq. (8) with the operator margin δ) is
"mixed batching (MB) when LHS < RHS + δ, else exclusive batching (EB)"; δ_flip = LHS − RHS is the margin at
which the rule's verdict changes (MB for every δ > δ_flip). The mode in force can differ from the rule's
verdict (hysteresis, cooldown, a pin, cold start); `reason` says why. An engine in a disaggregated
prefill/decode role (the pool's kv_role) keeps only the rules its role leaves (`controlplane.core.kv_role`):
`ROLE_TEXT` says which, and the rule is moot on a prefill or a decode instance. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.output import enum_name, iso_utc, message_to_dict, pool_text
from controlplane.loop.estimate import FIT_HELD_FLAG

# (key in the terms dict, symbol, unit, meaning), in the order of the derivation.
TERMS: tuple[tuple[str, str, str, str], ...] = (
    ("p0_per_token", "p0", "1/token", "hazard intercept (probability a request ends at each token)"),
    ("eta_per_token2", "η", "1/token²", "hazard slope (IFR when > 0)"),
    ("mu_l_tokens", "μ_L", "tokens", "mean prompt length"),
    ("mu_o_tokens", "μ_O", "tokens", "mean output length"),
    ("mu_o_lower_tokens", "μ_O ≥", "tokens", "lower bound on μ_O the completions and running requests prove"),
    ("num_samples", "samples", "completions", "completions in the fitted window"),
    ("theta0", "θ0", "fraction", "CFR threshold: θ/(1−θ) + ln(1−θ) = p0·α_p/α_d"),
    ("delta_theta", "Δθ", "fraction", "IFR correction"),
    ("theta_star", "θ̂*", "fraction", "threshold used (θ0 + Δθ, clipped)"),
    ("n_star_requests", "N̂*", "requests", "memory-safe batch size"),
    ("k_star_requests", "k̂*", "requests", "phase-switch threshold ⌊θ̂*·N̂*⌋"),
    ("n_obs_requests", "N_obs", "requests", "observed running requests (EMA)"),
    ("lhs_s_per_token", "LHS", "s/token", "β_MB^e − β_EB^w"),
    ("rhs_s_per_token", "RHS", "s/token", "right-hand side of the crossover rule"),
    ("delta_s_per_token", "δ", "s/token", "operator margin in force (> 0 favours MB, < 0 EB)"),
    ("delta_flip_s_per_token", "δ_flip", "s/token", "δ at which the rule flips: LHS − RHS (MB when δ > δ_flip)"),
)
# What each KV-transfer role leaves of the rules (controlplane.core.kv_role), by the pool's kv_role.
ROLE_TEXT = {
    "consumer": "decode instance (kv_consumer): EB's phase switch is moot (MB, flag eb_moot, k unused); N still "
                "caps admission, at the moment bound on μ_L, μ_O, σ_O (decodes grow KV, and a preempted request "
                "recomputes its whole prompt here); the budget still caps the prefills recomputed locally while "
                "decodes run",
    "producer": "prefill instance (kv_producer): EB's phase switch and k are moot (MB, flag eb_moot); the budget "
                "under prefill pressure is B_max in every step (B_cap = B_max: no decodes to protect), the tokens "
                "each prefill step computes; N = max_num_seqs (a request's KV does not grow after its prefill)",
    "both": "kv_both: sends and receives KV and runs whole requests: every rule applies, in the role's own pool",
}


def explain(view: operator_pb2.DecisionView) -> dict[str, Any]:
    """The explain view of `view` as plain data (the `ctl explain -o json` schema).

    Returns a dict with engine_id, pool (model, accelerator, kv_role), pool_key (as the CLI writes it), role (None
    without a KV-transfer role, else its kv_role and `ROLE_TEXT`'s text), source ("latest" or "decision"),
    computed_at(_s), the decision's
    version, mode, k, n, reason, flags, delta_source, a "terms" dict (keys of TERMS) and a "rule" dict:
    evaluated (False before the formulas ran: cold start or no cost model), cold_start (the cold-start rule ran
    at the lengths least favourable to EB: its verdict and terms are that point's), verdict ("mb" | "eb" | None),
    lhs_s_per_token, rhs_plus_delta_s_per_token, delta_flip_s_per_token, cold_start_point (at cold start the
    least favourable workload's mu_l_tokens, mu_o_tokens and p0_per_token, else None) and a one-line text; a
    "window" dict: the pool window the terms were fitted on (buckets, samples, running requests censored at its
    close and truncated at its opening, whether it was re-based at a detected shift, the last shift) and its
    text.
    """
    use_latest = view.HasField("latest")
    decision = view.latest if use_latest else view.decision
    diag = decision.diagnostics
    computed_at_s = view.computed_at_s if use_latest else decision.decided_at_s
    lhs, rhs, delta = diag.lhs_s_per_token, diag.rhs_s_per_token, decision.delta_s_per_token
    evaluated = diag.theta0 > 0.0
    # Cold start: the rule ran at the lengths least favourable to EB (controlplane.core.cold_start), not
    # on a fit; its LHS and RHS are that point's.
    cold_start = not evaluated and (lhs != 0.0 or rhs != 0.0)
    terms = {
        "p0_per_token": diag.p0, "eta_per_token2": diag.eta, "mu_l_tokens": diag.mu_l_tokens,
        "mu_o_tokens": diag.mu_o_tokens, "mu_o_lower_tokens": diag.mu_o_lower_tokens,
        "num_samples": diag.num_samples, "theta0": diag.theta0,
        "delta_theta": diag.delta_theta, "theta_star": diag.theta_star, "n_star_requests": diag.n_star,
        "k_star_requests": diag.k_star, "n_obs_requests": diag.n_obs, "lhs_s_per_token": lhs,
        "rhs_s_per_token": rhs, "delta_s_per_token": delta,
        "delta_flip_s_per_token": lhs - rhs if evaluated or cold_start else None,
    }
    point = None
    if cold_start:
        point = {"mu_l_tokens": diag.cold_start_mu_l_tokens, "mu_o_tokens": diag.cold_start_mu_o_tokens,
                 "p0_per_token": diag.cold_start_p0}
    if evaluated or cold_start:
        verdict = "mb" if lhs < rhs + delta else "eb"
        relation = "<" if verdict == "mb" else "≥"
        text = (f"LHS {lhs:.4g} {relation} RHS + δ = {rhs + delta:.4g} s/token → {verdict.upper()} "
                f"(flips at δ = {lhs - rhs:.4g} s/token)")
        if point is not None:
            proven = (f"; μ_O ≥ {diag.mu_o_lower_tokens:.4g} proven by the data"
                      if diag.mu_o_lower_tokens > 1.0 else "")
            text = (f"cold start, at the lengths least favourable to EB (μ_L {point['mu_l_tokens']:.4g}, "
                    f"μ_O {point['mu_o_tokens']:.4g}, p0 {point['p0_per_token']:.4g}{proven}): {text}")
    else:
        verdict = None
        text = f"not evaluated ({decision.reason or 'no computation yet'})"
    role = enum_name(common_pb2.KvRole.DESCRIPTOR, view.pool.kv_role) if view.pool.kv_role else None
    if role in ("consumer", "producer") and not evaluated:
        text = f"moot on a {role}: EB's phase switch does nothing there (reason {decision.reason or 'none yet'})"
    shift = diag.last_shift if diag.HasField("last_shift") else None
    window = {
        "first_bucket": diag.window_first_bucket, "end_bucket": diag.pool_window_end_bucket,
        "num_samples": diag.num_samples, "rebased": diag.window_rebased, "transient": diag.window_transient,
        "num_censored": diag.num_censored, "num_truncated": diag.num_truncated, "num_shifts": diag.num_shifts,
        "num_unconfirmed_shifts": diag.num_unconfirmed_shifts, "data_age_s": diag.data_age_s,
        "fit_held": FIT_HELD_FLAG in decision.flags,
        "last_shift": None if shift is None else {
            "start_bucket": shift.start_bucket, "detected_bucket": shift.detected_bucket,
            "direction": "longer" if shift.direction > 0 else "shorter", "mean_ratio": shift.mean_ratio},
    }
    window["text"] = _window_text(window)
    return {
        "engine_id": view.engine_id,
        "pool": message_to_dict(view.pool),
        "pool_key": pool_text(message_to_dict(view.pool)),
        "role": None if role is None else {"kv_role": role, "text": ROLE_TEXT.get(role, role)},
        "source": "latest" if use_latest else "decision",
        "computed_at": iso_utc(computed_at_s),
        "computed_at_s": computed_at_s,
        "decision_version": decision.version,
        "acked_version": view.acked_version,
        "mode": enum_name(common_pb2.Mode.DESCRIPTOR, decision.mode),
        "k": decision.k,
        "n": decision.n,
        "reason": decision.reason,
        "flags": list(decision.flags),
        "delta_source": decision.delta_source,
        "advisory": decision.advisory,
        "terms": terms,
        "window": window,
        "outcomes": outcomes_dict(view.outcomes),
        "rule": {
            "evaluated": evaluated,
            "verdict": verdict,
            "lhs_s_per_token": lhs,
            "rhs_plus_delta_s_per_token": rhs + delta,
            "delta_flip_s_per_token": lhs - rhs if evaluated or cold_start else None,
            "cold_start": cold_start,
            "cold_start_point": point,
            "text": text,
        },
    }


def outcomes_dict(o: operator_pb2.PoolOutcomes) -> dict[str, Any]:
    """A pool's measured latencies (None for a latency not reported) and its objective's state (None: no
    objective), with a one-line text."""
    latencies = {}
    for name in ("ttft", "tpot", "queue"):
        q = getattr(o, name)
        latencies[name] = ({"num_requests": q.num_requests, "p50_s": q.p50_s, "p90_s": q.p90_s, "p99_s": q.p99_s,
                            "mean_s": q.mean_s} if o.HasField(name) else None)
    shown = [f"{name.upper()} p50 {q['p50_s']:.3g} s, p90 {q['p90_s']:.3g} s, p99 {q['p99_s']:.3g} s "
             f"({q['num_requests']} requests)" for name, q in latencies.items() if q is not None]
    text = (f"last {o.window_s:.0f} s: " + "; ".join(shown)) if shown else "no latency data (the agents send no stamps)"
    objective = None
    if o.HasField("objective"):
        objective = {"state": enum_name(operator_pb2.ObjectiveState.DESCRIPTOR, o.objective_state),
                     "detail": o.objective_detail, **message_to_dict(o.objective)}
    return {"window_s": o.window_s, **latencies, "text": text, "objective": objective, "rollout": o.rollout or None}


def _window_text(window: dict[str, Any]) -> str:
    if not window["end_bucket"]:
        return "no pool window"
    text = (f"{window['num_samples']} completions, buckets {window['first_bucket']}–{window['end_bucket']}"
            if window["first_bucket"] else f"{window['num_samples']} completions up to bucket {window['end_bucket']}")
    if window["num_censored"] or window["num_truncated"]:
        text += f", running {window['num_censored']} at close / {window['num_truncated']} at opening"
    if window["data_age_s"]:
        text += f"; newest data {window['data_age_s']:.1f} s old when decided"
    shift = window["last_shift"]
    if window["rebased"] and shift is not None:
        text += (f"; re-based at bucket {shift['start_bucket']} after outputs got {shift['mean_ratio']:.2f}× "
                 f"({shift['direction']}, detected at bucket {shift['detected_bucket']})")
        if window["transient"]:
            text += ", transient"
        if window["fit_held"]:
            text += ("; its fit is held (too few completions since the shift, or a mean on the wrong side of it): "
                     "the terms are the previous fit's")
    elif shift is not None:
        text += f"; {window['num_shifts']} shift(s) detected, the last at bucket {shift['start_bucket']}"
    if window["num_unconfirmed_shifts"]:
        text += (f"; {window['num_unconfirmed_shifts']} length alarm(s) not confirmed by the hazard "
                 "(length-biased completions of one law)")
    return text


def explain_rows(data: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    """The explain view as (SYMBOL, VALUE, UNIT, MEANING) rows for a table."""
    terms = data["terms"]
    rows: list[tuple[str, Any, str, str]] = [
        (symbol, terms[key], unit, meaning) for key, symbol, unit, meaning in TERMS
    ]
    rows.append(("window", data["window"]["text"], "", "pool window the terms were fitted on"))
    rows.append(("rule", data["rule"]["text"], "", "MB when LHS < RHS + δ, else EB"))
    if data["role"] is not None:
        rows.append(("role", data["role"]["text"], "", "what the engine's KV-transfer role leaves of the rules"))
    rows.append(("mode", data["mode"], "", f"in force (k={data['k']}, N={data['n']}); reason {data['reason']}"))
    rows.append(("δ source", data["delta_source"], "", "scope the margin comes from"))
    rows.append(("flags", data["flags"], "", "degenerate inputs met (clipped, replaced, rejected)"))
    rows.append(("latency", data["outcomes"]["text"], "", "the pool's finished requests (relative error ≤ 1%)"))
    objective = data["outcomes"]["objective"]
    if objective is not None:
        rows.append(("objective", f"{objective['state']}: {objective['detail']}", "", "the pool's latency objective"))
    if data["outcomes"]["rollout"]:
        rows.append(("rollout", data["outcomes"]["rollout"], "", "a mode change under test on a canary subset"))
    return rows
