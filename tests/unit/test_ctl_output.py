"""`ctl` output without a controller: the data schema of protobuf messages, the explain view's rule, the
report's escaping, negative numbers on the command line, the tables of changes, calibrations and the audit,
`--strict`, the planner's table and JSON keys, and the usage line of an error found after parsing."""

from __future__ import annotations

import argparse
import asyncio
import json

import pytest
import yaml

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.ctl import Ctl, UnknownScopeError, audit_dict, audit_summary, calibration_fields
from controlplane.cli.explain import TERMS, explain, explain_rows
from controlplane.cli.main import build_parser, main
from controlplane.cli.output import cell_text, iso_utc, message_to_dict, print_data, print_fields
from controlplane.cli.report import render_report
from controlplane.loop.estimate import FIT_HELD_FLAG
from controlplane.store.records import record_json


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
    assert rule["cold_start_point"] == {"mu_l_tokens": 7.5, "mu_o_tokens": 2.5, "p0_per_token": 0.4}
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
        "num_truncated": 0, "num_shifts": 0, "num_unconfirmed_shifts": 0, "data_age_s": 0.0, "fit_held": False,
        "last_shift": None, "text": "no pool window"}
    diag.window_rebased, diag.data_age_s = True, 1.75
    rebased.decision.flags.append(FIT_HELD_FLAG)
    assert explain(rebased)["window"]["text"] == (
        "240 completions, buckets 111–130, running 256 at close / 250 at opening; newest data 1.8 s old when decided; "
        "re-based at bucket 111 after outputs got 2.04× (longer, detected at bucket 114), transient; its fit is held "
        "(too few completions since the shift, or a mean on the wrong side of it): the terms are the previous fit's; "
        "2 length alarm(s) not confirmed by the hazard (length-biased completions of one law)")


def test_report_escapes_what_it_is_given() -> None:
    engine_id = '<script>alert("x")</script>'
    page = render_report(
        generated_at_s=1_800_000_100.0, address="127.0.0.1:1", engines=[],
        history=[{"engine_id": engine_id, "pool": {"model": "m", "accelerator": "a&b"}, "decided_at_s": 1_800_000_000.0,
                  "decision": {"mode": "eb", "k": 3, "n": 9, "version": 4, "reason": "<b>"}}],
        overrides=[], explains=[], audit=[])
    assert "<script>" not in page and "&lt;script&gt;" in page and "m|a&amp;b" in page
    assert page.count('class="decision"') == 1 and 'data-version="4"' in page


def test_report_keeps_a_prefill_and_a_decode_pool_of_one_model_apart() -> None:
    def entry(engine_id: str, role: str | None) -> dict:
        pool = {"model": "m", "accelerator": "a", **({"kv_role": role} if role else {})}
        return {"engine_id": engine_id, "pool": pool, "decided_at_s": 1_800_000_000.0,
                "decision": {"mode": "mb", "k": 1, "n": 9, "version": 1, "reason": "kv_consumer"}}

    page = render_report(generated_at_s=1_800_000_100.0, address="127.0.0.1:1", engines=[],
                         history=[entry("d", "consumer"), entry("p", "producer"), entry("w", None)], overrides=[],
                         explains=[], audit=[])
    assert [s.split('"')[0] for s in page.split('<section class="pool" data-pool="')[1:]] == [
        "m|a", "m|a|consumer", "m|a|producer"]


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


def test_table_cells_escape_control_characters() -> None:
    """A reason stored with escapes or newlines (by an older release) is shown escaped: it can neither colour
    the terminal nor forge a table row."""
    from controlplane.cli.output import cell_text

    assert cell_text("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert cell_text("line\nfake row") == "line\\nfake row"
    assert cell_text("nul\x00") == "nul\\x00"
    assert cell_text("ünïcode — fine") == "ünïcode — fine"


# ---- the operator's first hour: what the tables show, and the errors' usage lines

PLAN_COSTS = ["--alpha-p", "0.00469", "--beta-p", "5.0e-5", "--alpha-d", "0.01038", "--beta-d", "1.04e-4"]
PLAN_WORKLOAD = ["--mu-l", "512", "--mu-o", "256", "--kv-capacity-tokens", "2000000", "--max-num-seqs", "2048"]
POOL_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=common_pb2.Pool(model="m", accelerator="a"))


def table_fields(text: str) -> dict[str, str]:
    """A FIELD / VALUE table as printed (piped), by field."""
    rows = [line.split(None, 1) for line in text.splitlines()[1:]]
    return {row[0]: row[1] if len(row) > 1 else "" for row in rows}


class FakeStub:
    """The OperatorService calls a change makes, answered from memory; records what was asked."""

    def __init__(self, engines: list[operator_pb2.EngineInfo]) -> None:
        self.engines = engines
        self.calls: list[str] = []

    async def ListEngines(self, request, **kw) -> operator_pb2.ListEnginesResponse:  # noqa: N802
        self.calls.append("ListEngines")
        return operator_pb2.ListEnginesResponse(engines=self.engines)

    async def SetDelta(self, request, **kw) -> operator_pb2.OverrideRecord:  # noqa: N802
        self.calls.append("SetDelta")
        return operator_pb2.OverrideRecord(scope=request.scope, kind=operator_pb2.OVERRIDE_KIND_DELTA,
                                           delta_s_per_token=request.delta_s_per_token, set_by="alice",
                                           set_at_s=1_800_000_000.0, reason=request.reason)

    async def ClearOverride(self, request, **kw) -> operator_pb2.OverrideRecord:  # noqa: N802
        self.calls.append("ClearOverride")
        return operator_pb2.OverrideRecord(scope=request.scope, kind=request.kind, set_by="alice",
                                           set_at_s=1_800_000_000.0, cleared=True)


def fake_ctl(stub: FakeStub, fmt: str = "table") -> Ctl:
    return Ctl(stub, metadata=(), timeout_s=0.0, fmt=fmt, address="127.0.0.1:1")


def test_set_delta_and_clear_tables_show_only_their_fields(capsys: pytest.CaptureFixture[str]) -> None:
    stub = FakeStub([])
    ctl = fake_ctl(stub)
    args = argparse.Namespace(scope=POOL_SCOPE, delta=2e-5, expires_in_s=0.0, reason="ttft", strict=False)
    assert asyncio.run(ctl.set_delta(args)) == 0
    shown = table_fields(capsys.readouterr().out)
    assert list(shown) == ["scope", "kind", "delta_s_per_token", "expires_at", "expires_at_s", "set_by", "set_at",
                           "set_at_s", "reason"]
    assert shown["kind"] == "delta" and shown["delta_s_per_token"] == "2e-05"
    args = argparse.Namespace(scope=POOL_SCOPE, kind="delta", reason="", strict=False)
    assert asyncio.run(ctl.clear(args)) == 0
    shown = table_fields(capsys.readouterr().out)
    assert list(shown) == ["scope", "kind", "cleared", "set_by", "set_at", "set_at_s", "reason"]
    assert shown["cleared"] == "yes"
    # The data keeps every field.
    assert asyncio.run(fake_ctl(stub, "json").clear(args)) == 0
    assert {"mode", "k", "n", "delta_s_per_token", "warnings"} <= set(json.loads(capsys.readouterr().out))


def test_strict_refuses_a_scope_no_engine_reported_before_changing_anything() -> None:
    engines = [operator_pb2.EngineInfo(engine_id="e1", pool=common_pb2.Pool(model="m", accelerator="b"))]
    stub = FakeStub(engines)
    args = argparse.Namespace(scope=POOL_SCOPE, delta=2e-5, expires_in_s=0.0, reason="", strict=True)
    with pytest.raises(UnknownScopeError, match=r"pool 'm\|a' has no engine .* known pools: 'm\|b'\)$"):
        asyncio.run(fake_ctl(stub).set_delta(args))
    assert stub.calls == ["ListEngines"]
    stub.engines.append(operator_pb2.EngineInfo(engine_id="e2", pool=POOL_SCOPE.pool))
    assert asyncio.run(fake_ctl(stub, "json").set_delta(args)) == 0
    assert stub.calls == ["ListEngines", "ListEngines", "SetDelta"]
    fleet = argparse.Namespace(scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET), kind="pin", reason="",
                               strict=True)
    assert asyncio.run(fake_ctl(stub, "json").clear(fleet)) == 0  # the fleet is always known: no ListEngines
    assert stub.calls[-1] == "ClearOverride" and stub.calls.count("ListEngines") == 2


def test_calibration_table_writes_the_pool_as_the_cli_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    data = message_to_dict(operator_pb2.Calibration(pool=common_pb2.Pool(model="Qwen/Qwen3-8B",
                                                                         accelerator="NVIDIA H200"),
                                                    alpha_p_s=0.00128, source="pd.json"))
    print_fields(calibration_fields(data))
    shown = table_fields(capsys.readouterr().out)
    assert shown["pool"] == "Qwen/Qwen3-8B|NVIDIA H200" and shown["source"] == "pd.json"
    # The data keeps the object, every field present (an engine without a KV-transfer role: unspecified).
    assert data["pool"] == {"model": "Qwen/Qwen3-8B", "accelerator": "NVIDIA H200", "kv_role": "unspecified"}
    data["pool"]["kv_role"] = "consumer"  # a decode instance's pool: the role is part of the key the CLI takes
    assert dict(calibration_fields(data))["pool"] == "Qwen/Qwen3-8B|NVIDIA H200|consumer"


def test_audit_shows_kinds_and_modes_as_the_cli_writes_them() -> None:
    pin = operator_pb2.OverrideRecord(scope=POOL_SCOPE, kind=operator_pb2.OVERRIDE_KIND_PIN,
                                      mode=operator_pb2.PINNED_MODE_EB, k=8, n=32, set_by="alice")
    delta = operator_pb2.OverrideRecord(scope=POOL_SCOPE, kind=operator_pb2.OVERRIDE_KIND_DELTA,
                                        delta_s_per_token=2e-5)
    entry = audit_dict(operator_pb2.AuditEntry(action="set", kind="pin", target="pool:m|a", old_json="",
                                               new_json=record_json(pin)))
    assert entry["old"] is None
    assert entry["new"]["kind"] == "pin" and entry["new"]["mode"] == "eb" and entry["new"]["scope"] == "pool:m|a"
    assert audit_summary(entry["new"]) == "eb k=8 n=32"
    entry = audit_dict(operator_pb2.AuditEntry(action="clear", kind="delta", old_json=record_json(delta)))
    assert entry["old"]["kind"] == "delta" and audit_summary(entry["old"]) == "δ=2e-05 s/token"
    calibration = operator_pb2.Calibration(pool=common_pb2.Pool(model="m", accelerator="a"), alpha_p_s=0.001,
                                           alpha_d_s=0.01)
    entry = audit_dict(operator_pb2.AuditEntry(kind="calibration", new_json=record_json(calibration)))
    assert entry["new"]["pool"] == {"model": "m", "accelerator": "a", "kv_role": "unspecified"}
    assert audit_summary(entry["new"]) == "α_p=0.001 α_d=0.01"
    text = json.dumps([audit_dict(operator_pb2.AuditEntry(kind="pin", new_json=record_json(pin)))])
    assert "PINNED_MODE" not in text and "OVERRIDE_KIND" not in text and "SCOPE_KIND" not in text
    # Not a record (another release's entry, or not JSON): as stored, or null.
    assert audit_dict(operator_pb2.AuditEntry(kind="other", new_json='{"x": 1}'))["new"] == {"x": 1}
    assert audit_dict(operator_pb2.AuditEntry(kind="pin", new_json="{"))["new"] is None


def test_plan_table_shows_a_dash_for_an_input_not_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *PLAN_COSTS, *PLAN_WORKLOAD]) == 0
    table = capsys.readouterr().out
    assert "None" not in table
    (sigma,) = [line for line in table.splitlines() if line.startswith("σ_O")]
    assert sigma.split()[-1] == "-"


def test_plan_json_keys_carry_their_units_as_the_explain_terms_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *PLAN_COSTS, *PLAN_WORKLOAD, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for old in ("lhs", "rhs", "delta", "delta_flip", "beta_eb_w", "beta_mb_e", "n_star", "k_star", "n_obs", "p0",
                "eta"):
        assert old not in report
    unitless = {"theta0", "delta_theta", "theta_star", "decode_ratio", "gamma", "mode", "flags", "inputs"}
    assert {key for key in report if key not in unitless} == {
        "n_star_requests", "k_star_requests", "lhs_s_per_token", "rhs_s_per_token", "delta_s_per_token",
        "delta_flip_s_per_token", "beta_eb_w_s_per_token", "beta_mb_e_s_per_token", "n_obs_requests",
        "p0_per_token", "eta_per_token2"}
    shared = {key for key, *_ in TERMS} & set(report)
    assert shared >= {"lhs_s_per_token", "rhs_s_per_token", "delta_s_per_token", "n_star_requests", "p0_per_token"}


@pytest.mark.parametrize(("argv", "usage"), [
    (["plan", *PLAN_WORKLOAD], "usage: controlplane plan "),  # costs missing: found after parsing
    (["plan", *PLAN_COSTS, *PLAN_WORKLOAD, "--n-obs", "0.5"], "usage: controlplane plan "),
    (["sim", "run", "--scenario", "closed:balanced:c=8", "--scheduler", "v1", "--seeds", "0"],
     "usage: controlplane sim run "),
    (["sim", "run", "--scenario", "closed:balanced:c=8", "--scenario", "closed:balanced:c=16", "--scheduler", "v1"],
     "usage: controlplane sim run "),
])
def test_errors_after_parsing_show_their_own_subcommands_usage(argv: list[str], usage: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert f"\ncontrolplane {usage.split()[2]}" in err and "usage: controlplane [-h]" not in err
