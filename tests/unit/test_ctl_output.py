"""`ctl` output without a controller: the data schema of protobuf messages, the explain view's rule, the
report's escaping, and negative numbers on the command line."""

from __future__ import annotations

import json

import pytest
import yaml

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.explain import TERMS, explain, explain_rows
from controlplane.cli.main import build_parser
from controlplane.cli.output import cell_text, iso_utc, message_to_dict, print_data
from controlplane.cli.report import render_report


def view(*, lhs: float, rhs: float, delta: float, latest: bool) -> operator_pb2.DecisionView:
    decision = common_pb2.Decision(
        version=2**63 + 5, mode=common_pb2.MODE_EB, k=12, n=200, delta_s_per_token=delta, reason="crossover_eb",
        decided_at_s=1_800_000_000.25,
        diagnostics=common_pb2.Diagnostics(p0=0.004, theta0=0.06, theta_star=0.06, n_star=200, k_star=12,
                                           lhs_s_per_token=lhs, rhs_s_per_token=rhs, n_obs=150.0),
    )
    result = operator_pb2.DecisionView(engine_id="e1", pool=common_pb2.Pool(model="m", accelerator="a"),
                                       decision=decision)
    if latest:
        result.latest.CopyFrom(decision)
        result.latest.reason = "hysteresis_hold"
        result.computed_at_s = 1_800_000_001.5
    return result


def test_message_data_keeps_every_field_with_units_and_integers() -> None:
    data = message_to_dict(view(lhs=1e-5, rhs=2e-6, delta=0.0, latest=False))
    decision = data["decision"]
    assert decision["version"] == 2**63 + 5 and isinstance(decision["version"], int)
    assert decision["mode"] == "eb" and decision["flags"] == [] and decision["trace_id"] == ""
    assert decision["advisory"] is False and decision["ttl_s"] == 0.0 and decision["budget"] is None
    assert decision["decided_at"] == "2027-01-15T08:00:00.250Z" and decision["decided_at_s"] == 1_800_000_000.25
    assert list(decision).index("decided_at") + 1 == list(decision).index("decided_at_s")
    assert data["latest"] is None and data["computed_at"] is None and data["computed_at_s"] == 0.0
    assert decision["diagnostics"]["num_samples"] == 0
    record = message_to_dict(operator_pb2.OverrideRecord(
        scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=common_pb2.Pool(model="m", accelerator="a")),
        kind=operator_pb2.OVERRIDE_KIND_PIN, mode=operator_pb2.PINNED_MODE_PASSTHROUGH))
    assert record["scope"] == "pool:m|a" and record["kind"] == "pin" and record["mode"] == "passthrough"
    assert record["warnings"] == [] and record["expires_at"] is None
    entry = message_to_dict(operator_pb2.AuditEntry(at_s=1_800_000_000.0))
    assert entry["at"] == "2027-01-15T08:00:00.000Z"


def test_json_and_yaml_carry_the_same_data(capsys: pytest.CaptureFixture[str]) -> None:
    data = message_to_dict(view(lhs=1e-5, rhs=2e-6, delta=0.0, latest=True))
    print_data(data, "json")
    as_json = json.loads(capsys.readouterr().out)
    print_data(data, "yaml")
    assert yaml.safe_load(capsys.readouterr().out) == as_json == data


@pytest.mark.parametrize(("delta", "verdict"), [(0.0, "eb"), (7.9e-6, "eb"), (8.1e-6, "mb"), (-1e-3, "eb")])
def test_explain_rule_and_flip_margin(delta: float, verdict: str) -> None:
    data = explain(view(lhs=1e-5, rhs=2e-6, delta=delta, latest=True))
    assert data["source"] == "latest" and data["reason"] == "hysteresis_hold"
    assert data["computed_at_s"] == 1_800_000_001.5
    assert data["rule"]["verdict"] == verdict
    assert data["rule"]["delta_flip_s_per_token"] == data["terms"]["delta_flip_s_per_token"] == 1e-5 - 2e-6
    assert data["decision_version"] == 2**63 + 5


def test_explain_before_the_formulas_ran() -> None:
    cold = view(lhs=0.0, rhs=0.0, delta=0.0, latest=False)
    cold.decision.diagnostics.theta0 = 0.0
    cold.decision.reason = "insufficient_data"
    data = explain(cold)
    assert data["source"] == "decision" and data["rule"]["evaluated"] is False and data["rule"]["verdict"] is None
    assert data["rule"]["text"] == "not evaluated (insufficient_data)" and data["rule"]["cold_start"] is False
    assert data["terms"]["delta_flip_s_per_token"] is None


def test_explain_a_cold_start_verdict_at_the_least_favourable_lengths() -> None:
    cold = view(lhs=1e-5, rhs=2e-6, delta=0.0, latest=False)
    cold.decision.diagnostics.theta0 = 0.0
    cold.decision.reason = "cold_start_eb"
    diag = cold.decision.diagnostics
    diag.cold_start_mu_l_tokens, diag.cold_start_mu_o_tokens, diag.cold_start_p0 = 7.5, 2.5, 0.4
    diag.mu_o_lower_tokens = 1.0  # nothing proven yet
    data = explain(cold)
    rule = data["rule"]
    assert rule["evaluated"] is False and rule["cold_start"] is True and rule["verdict"] == "eb"
    assert rule["cold_start_point"] == {"mu_l_tokens": 7.5, "mu_o_tokens": 2.5, "p0": 0.4}
    assert rule["text"].startswith("cold start, at the lengths least favourable to EB (μ_L 7.5, μ_O 2.5, p0 0.4): "
                                   "LHS 1e-05 ≥ RHS + δ")
    assert rule["delta_flip_s_per_token"] == 1e-5 - 2e-6
    diag.mu_o_lower_tokens, diag.cold_start_mu_o_tokens = 96.25, 101.0  # the data rules out shorter outputs
    data = explain(cold)
    assert data["terms"]["mu_o_lower_tokens"] == 96.25
    assert "(μ_L 7.5, μ_O 101, p0 0.4; μ_O ≥ 96.25 proven by the data): LHS" in data["rule"]["text"]
    meaning = {key: meaning for key, _, _, meaning in TERMS}["mu_o_lower_tokens"]
    assert ("μ_O ≥", 96.25, "tokens", meaning) in explain_rows(data)


def test_explain_shows_the_pool_window_and_its_last_shift() -> None:
    rebased = view(lhs=1e-5, rhs=2e-6, delta=0.0, latest=False)
    diag = rebased.decision.diagnostics
    diag.num_samples, diag.pool_window_end_bucket, diag.window_first_bucket = 240, 130, 111
    diag.window_rebased = diag.window_transient = True
    diag.num_censored, diag.num_truncated, diag.num_shifts = 256, 250, 1
    diag.last_shift.CopyFrom(common_pb2.PoolShift(start_bucket=111, detected_bucket=114, direction=1,
                                                  mean_ratio=2.04))
    window = explain(rebased)["window"]
    assert window["rebased"] and window["last_shift"]["direction"] == "longer"
    assert window["text"] == ("240 completions, buckets 111–130, running 256 at close / 250 at opening; re-based at "
                              "bucket 111 after outputs got 2.04× (longer, detected at bucket 114), transient")
    diag.window_rebased = False
    assert explain(rebased)["window"]["text"].endswith("1 shift(s) detected, the last at bucket 111")
    diag.num_unconfirmed_shifts = 2
    assert explain(rebased)["window"]["num_unconfirmed_shifts"] == 2
    assert explain(rebased)["window"]["text"].endswith(
        "the last at bucket 111; 2 length alarm(s) not confirmed by the hazard (length-biased completions of one law)")
    assert explain(view(lhs=1e-5, rhs=2e-6, delta=0.0, latest=False))["window"] == {
        "first_bucket": 0, "end_bucket": 0, "num_samples": 0, "rebased": False, "transient": False, "num_censored": 0,
        "num_truncated": 0, "num_shifts": 0, "num_unconfirmed_shifts": 0, "last_shift": None,
        "text": "no pool window"}


def test_report_escapes_what_it_is_given() -> None:
    engine_id = '<script>alert("x")</script>'
    page = render_report(
        generated_at_s=1_800_000_100.0, address="127.0.0.1:1", engines=[],
        history=[{"engine_id": engine_id, "pool": {"model": "m", "accelerator": "a&b"}, "decided_at_s": 1_800_000_000.0,
                  "decision": {"mode": "eb", "k": 3, "n": 9, "version": 4, "reason": "<b>"}}],
        overrides=[], explains=[], audit=[])
    assert "<script>" not in page and "&lt;script&gt;" in page and "m|a&amp;b" in page
    assert page.count('class="decision"') == 1 and 'data-version="4"' in page


def test_cell_text() -> None:
    assert cell_text(None) == "-" and cell_text("") == "-" and cell_text([]) == "-"
    assert cell_text(True) == "yes" and cell_text(2.5e-5) == "2.5e-05"
    assert cell_text(1_800_000_000.123456) == "1800000000.123"
    assert iso_utc(0.0) is None and iso_utc(-5.0) is None


def test_negative_numbers_in_any_notation_are_values() -> None:
    parser = build_parser()
    assert parser.parse_args(["ctl", "set-delta", "-2e-5", "--scope", "fleet"]).delta == -2e-5
    assert parser.parse_args(["ctl", "set-delta", "-.001", "--scope", "fleet"]).delta == -0.001
    assert parser.parse_args(["plan", "--mu-l", "1", "--mu-o", "1", "--kv-capacity-tokens", "5",
                              "--eta", "-1E-6"]).eta == -1e-6
