"""`controlplane plan`: the what-if planner prints exactly what evaluate() computes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli.main import main
from controlplane.core.policy import evaluate
from controlplane.core.types import CostModel, EngineLimits, Mode, PolicyConfig, WorkloadStats

RTX = {"alpha_p": 0.004691170692443847, "beta_p": 5.007938367705191e-05,
       "alpha_d": 0.010375998928844651, "beta_d": 0.00010388105329650523,
       "abc": (6.29342675989941e-05, 0.00019689261661008702, 9.8989734316548e-06)}
H200 = {"alpha_p": 0.0012785933415095027, "beta_p": 2.4852551825304505e-05,
        "alpha_d": 0.008921181622454422, "beta_d": 4.586467522217373e-05,
        "abc": (2.494e-05, 5.193e-05, 1.478e-05)}


def cost_flags(values: dict, *, alpha_mb: float | None = None) -> list[str]:
    flags = ["--alpha-p", repr(values["alpha_p"]), "--beta-p", repr(values["beta_p"]),
             "--alpha-d", repr(values["alpha_d"]), "--beta-d", repr(values["beta_d"]),
             "--mb-coeffs", ",".join(repr(c) for c in values["abc"])]
    if alpha_mb is not None:
        flags += ["--alpha-mb", repr(alpha_mb)]
    return flags


def workload_flags(*, p0: float | None = None, eta: float = 0.0, mu_l: float = 512.0, mu_o: float = 256.0,
                   kv: int = 2_000_000, eps: float = 0.01, max_num_seqs: int = 1024, n_prev: int = 0,
                   n_obs: float = 0.0, delta: float = 0.0) -> list[str]:
    flags = ["--eta", repr(eta), "--mu-l", repr(mu_l), "--mu-o", repr(mu_o), "--kv-capacity-tokens", str(kv),
             "--oom-tolerance", repr(eps), "--max-num-seqs", str(max_num_seqs), "--n-prev", str(n_prev),
             "--n-obs", repr(n_obs), "--delta", repr(delta)]
    if p0 is not None:
        flags += ["--p0", repr(p0)]
    return flags


def run_plan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def reference(values: dict, *, p0: float | None = None, eta: float = 0.0, mu_l: float = 512.0,
              mu_o: float = 256.0, kv: int = 2_000_000, eps: float = 0.01, max_num_seqs: int = 1024,
              n_prev: int = 0, n_obs: float = 0.0, delta: float = 0.0, alpha_mb: float | None = None):
    costs = CostModel(alpha_p_s=values["alpha_p"], beta_p_s_per_token=values["beta_p"],
                      alpha_d_s=values["alpha_d"], beta_d_s_per_request=values["beta_d"],
                      alpha_mb_s=values["alpha_p"] if alpha_mb is None else alpha_mb,
                      mb_coeffs_s_per_token=values["abc"])
    workload = WorkloadStats(p0=1.0 / mu_o if p0 is None else p0, eta=eta, mu_l_tokens=mu_l, mu_o_tokens=mu_o)
    limits = EngineLimits(max_num_seqs=max_num_seqs, max_num_batched_tokens=16384, kv_capacity_tokens=kv)
    return evaluate(workload, costs, limits, n_prev=n_prev, n_obs=n_obs, delta_s_per_token=delta,
                    config=PolicyConfig(oom_tolerance=eps))


def assert_report_matches(report: dict, expected) -> None:
    assert report["theta0"] == expected.theta0
    assert report["delta_theta"] == expected.delta_theta
    assert report["theta_star"] == expected.theta_star
    assert report["n_star"] == expected.n_star
    assert report["k_star"] == expected.k_star
    assert report["lhs"] == expected.lhs_s_per_token
    assert report["rhs"] == expected.rhs_s_per_token
    assert report["delta"] == expected.delta_s_per_token
    assert report["decode_ratio"] == expected.decode_ratio
    assert report["beta_eb_w"] == expected.beta_eb_w_s_per_token
    assert report["beta_mb_e"] == expected.beta_mb_e_s_per_token
    assert report["n_obs"] == expected.n_obs
    assert report["mode"] == expected.mode_instant.value
    assert report["flags"] == [f.value for f in expected.flags]


@pytest.mark.parametrize(
    ("values", "inputs", "mode"),
    [
        (RTX, {"n_obs": 512.0}, "eb"),  # heavy load on the bandwidth-constrained GPU
        (RTX, {"n_obs": 4.0}, "mb"),  # light load: the amortised fixed cost favours MB
        (H200, {"n_obs": 512.0}, None),
        (H200, {"n_obs": 8.0}, "mb"),
        (RTX, {"eta": 2e-5, "p0": 1.0 / 512.0, "n_prev": 800, "n_obs": 0.0, "mu_o": 300.0}, None),
        (H200, {"kv": 300_000, "eps": 1e-4, "max_num_seqs": 256, "delta": 1e-5, "mu_l": 2048.0}, None),
    ],
)
def test_json_equals_evaluate(values: dict, inputs: dict, mode: str | None, capsys) -> None:
    report = run_plan([*cost_flags(values), *workload_flags(**inputs)], capsys)
    expected = reference(values, **inputs)
    assert_report_matches(report, expected)
    if mode is not None:
        assert report["mode"] == mode
    assert report["p0"] == inputs.get("p0", 1.0 / inputs.get("mu_o", 256.0))
    assert report["gamma"] == pytest.approx(report["p0"] * values["alpha_p"] / values["alpha_d"], rel=1e-15)
    assert report["eta"] == inputs.get("eta", 0.0)


def test_ifr_inputs_produce_a_correction(capsys) -> None:
    inputs = {"eta": 1e-6, "p0": 1.0 / 512.0, "n_prev": 800}
    report = run_plan([*cost_flags(RTX), *workload_flags(**inputs)], capsys)
    assert report["delta_theta"] > 0.0
    assert report["theta_star"] < 0.8  # not clipped
    assert report["theta_star"] == pytest.approx(report["theta0"] + report["delta_theta"], rel=1e-15)
    assert report["k_star"] == int(report["theta_star"] * report["n_star"])


def test_alpha_mb_flag(capsys) -> None:
    report = run_plan([*cost_flags(H200, alpha_mb=0.004), *workload_flags(n_obs=64.0)], capsys)
    assert_report_matches(report, reference(H200, n_obs=64.0, alpha_mb=0.004))


def test_out_of_range_delta_is_clipped_and_flagged(capsys) -> None:
    report = run_plan([*cost_flags(H200), *workload_flags(delta=0.5)], capsys)
    assert report["delta"] == 0.01
    assert "delta_out_of_range" in report["flags"]
    assert report["mode"] == Mode.MB.value


def write_calibration(tmp_path: Path, values: dict, *, legacy: bool = True) -> list[str]:
    pd = {"model": "Qwen/Qwen3-8B", "device_name": "RTX PRO 6000", "dtype": "bfloat16",
          "timestamp": "2026-05-16T14:45:55", "alpha_p": values["alpha_p"], "beta_p": values["beta_p"],
          "alpha_d": values["alpha_d"], "beta_d": values["beta_d"], "prefill_r2": 0.9999, "decode_r2": 0.998,
          "prefill_sizes": [256, 1024, 4096], "decode_counts": [1, 64, 256], "num_iterations": 10}
    prefix = "VLLM_PD_CP_COST_" if legacy else "VLLM_PD_MB_COST_"
    beta_mb = {"model": "Qwen/Qwen3-8B", "device_name": "RTX PRO 6000",
               "beta_mb_coefficients": dict(zip(("a (s/tok)", "b (s/tok)", "c (s/tok)"), values["abc"], strict=True)),
               "env_vars_for_pd_auto": {f"{prefix}{x}": f"{v:.6e}" for x, v in zip("ABC", values["abc"], strict=True)}}
    pd_path, mb_path = tmp_path / "pd_calibration_Qwen3-8B_RTX.json", tmp_path / "beta_mb_Qwen3-8B_RTX.json"
    pd_path.write_text(json.dumps(pd))
    mb_path.write_text(json.dumps(beta_mb))
    return ["--calibration", str(pd_path), "--calibration", str(mb_path)]


@pytest.mark.parametrize("legacy", [True, False])
def test_calibration_files_equal_explicit_flags(tmp_path: Path, legacy: bool, capsys) -> None:
    from_files = run_plan([*write_calibration(tmp_path, RTX, legacy=legacy), *workload_flags(n_obs=128.0)], capsys)
    from_flags = run_plan([*cost_flags(RTX), *workload_flags(n_obs=128.0)], capsys)
    assert from_files == from_flags
    assert_report_matches(from_files, reference(RTX, n_obs=128.0))


def test_explicit_flags_win_over_calibration_files(tmp_path: Path, capsys) -> None:
    report = run_plan([*write_calibration(tmp_path, RTX), "--alpha-d", "0.02", *workload_flags(n_obs=128.0)],
                      capsys)
    assert_report_matches(report, reference(RTX | {"alpha_d": 0.02}, n_obs=128.0))


def test_table_without_json(capsys) -> None:
    assert main(["plan", *cost_flags(RTX), *workload_flags(n_obs=512.0)]) == 0
    table = capsys.readouterr().out
    expected = reference(RTX, n_obs=512.0)
    with pytest.raises(json.JSONDecodeError):
        json.loads(table)
    lines = {line.split("  ")[0].strip(): line.rsplit("  ", 1)[1].strip() for line in table.splitlines()}
    assert lines["θ0 (CFR threshold)"] == f"{expected.theta0:.6g}"
    assert lines["N* (memory-safe batch, requests)"] == str(expected.n_star)
    assert lines["k* (phase-switch threshold, requests)"] == str(expected.k_star)
    assert lines["LHS = β_MB^e − β_EB^w (s/token)"] == f"{expected.lhs_s_per_token:.6g}"
    assert lines["RHS (s/token)"] == f"{expected.rhs_s_per_token:.6g}"
    assert lines["mode (MB if LHS < RHS + δ)"] == "eb"
    assert lines["flags"] == (", ".join(f.value for f in expected.flags) or "-")


def expect_usage_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as raised:
        main(["plan", *argv])
    assert raised.value.code == 2
    return capsys.readouterr().err


def test_missing_costs_exit_2(capsys) -> None:
    err = expect_usage_error(workload_flags(), capsys)
    assert "costs missing" in err
    err = expect_usage_error(["--alpha-p", "0.001", "--beta-p", "1e-5", "--alpha-d", "0.01",
                              *workload_flags()], capsys)
    assert "costs missing" in err


def test_only_beta_mb_calibration_is_not_enough(tmp_path: Path, capsys) -> None:
    path = tmp_path / "beta_mb.json"
    path.write_text(json.dumps({"env_vars_for_pd_auto": {"VLLM_PD_MB_COST_A": "1e-5", "VLLM_PD_MB_COST_B": "2e-5",
                                                         "VLLM_PD_MB_COST_C": "3e-5"}}))
    assert "costs missing" in expect_usage_error(["--calibration", str(path), *workload_flags()], capsys)


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (json.dumps({"alpha_p": 0.001, "beta_p": 1e-5, "beta_d": 1e-5}), "'alpha_d'"),
        (json.dumps({"alpha_p": "slow", "beta_p": 1e-5, "alpha_d": 0.01, "beta_d": 1e-5}), "'alpha_p'"),
        (json.dumps({"beta_mb_coefficients": {"a (s/tok)": 1e-5}}), "'b (s/tok)'"),
        (json.dumps({"hello": "world"}), "unknown calibration format"),
        ("{not json", "not JSON"),
    ],
)
def test_malformed_calibration_exits_2_naming_the_problem(tmp_path: Path, content: str, named: str, capsys) -> None:
    path = tmp_path / "calibration.json"
    path.write_text(content)
    err = expect_usage_error(["--calibration", str(path), *workload_flags()], capsys)
    assert named in err
    assert str(path) in err


def test_unreadable_calibration_exits_2(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.json"
    err = expect_usage_error(["--calibration", str(missing), *cost_flags(H200), *workload_flags()], capsys)
    assert "cannot read" in err
    assert str(missing) in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ([*cost_flags(H200)[:-2], "--mb-coeffs", "1,2", *workload_flags()], "--mb-coeffs"),
        ([*cost_flags(H200)[:-2], "--mb-coeffs", "1,x,2", *workload_flags()], "--mb-coeffs"),
        ([*cost_flags(H200), *workload_flags(mu_o=0.0)], "--mu-o"),
        ([*cost_flags(H200), *workload_flags(mu_l=-3.0)], "--mu-l"),
        ([*cost_flags(H200), *workload_flags(eps=1.5)], "--oom-tolerance"),
        ([*cost_flags(H200), *workload_flags(max_num_seqs=0)], "--max-num-seqs"),
        ([*cost_flags(H200), *workload_flags(kv=-1)], "--kv-capacity-tokens"),
        ([*cost_flags(H200), "--mu-l", "512"], "--mu-o"),
    ],
)
def test_bad_flags_exit_2(argv: list[str], named: str, capsys) -> None:
    assert named in expect_usage_error(argv, capsys)


def test_module_entry_point_in_a_subprocess(tmp_path: Path, capsys) -> None:
    argv = ["plan", *cost_flags(RTX), *workload_flags(n_obs=512.0), "--json"]
    completed = subprocess.run([sys.executable, "-m", "controlplane", *argv], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60, check=False)
    assert completed.returncode == 0, completed.stderr
    assert main(argv) == 0
    assert json.loads(completed.stdout) == json.loads(capsys.readouterr().out)
    assert json.loads(completed.stdout)["mode"] == "eb"
