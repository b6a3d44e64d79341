"""`controlplane plan`: the what-if planner prints exactly what evaluate() computes."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.cli.main import main
from controlplane.cli.plan import FLAG_MEANINGS
from controlplane.core.calibration import parse_calibration
from controlplane.core.policy import evaluate
from controlplane.core.threshold import solve_theta0
from controlplane.core.types import CostModel, EngineLimits, Flag, Mode, PolicyConfig, WorkloadStats
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B

ROOT = Path(__file__).resolve().parents[2]
PLANNER_FLAGS = {"p0_from_mu_o", "n_obs_from_n_star", "alpha_mb_from_alpha_p", "mb_coeffs_zero"}

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


# The planner report's keys that show an attribute of the core's evaluation as it is.
REPORT_FIELDS = {
    "theta0": "theta0", "delta_theta": "delta_theta", "theta_star": "theta_star", "n_star_requests": "n_star",
    "k_star_requests": "k_star", "lhs_s_per_token": "lhs_s_per_token", "rhs_s_per_token": "rhs_s_per_token",
    "delta_s_per_token": "delta_s_per_token", "decode_ratio": "decode_ratio",
    "beta_eb_w_s_per_token": "beta_eb_w_s_per_token", "beta_mb_e_s_per_token": "beta_mb_e_s_per_token",
    "n_obs_requests": "n_obs", "p0_per_token": "p0", "eta_per_token2": "eta", "gamma": "gamma",
}


def assert_report_matches(report: dict, expected) -> None:
    for key, attribute in REPORT_FIELDS.items():
        assert report[key] == getattr(expected, attribute), key
    assert report["mode"] == expected.mode_instant.value
    assert report["delta_flip_s_per_token"] == expected.lhs_s_per_token - expected.rhs_s_per_token
    core = [f.value for f in expected.flags]
    assert report["flags"][:len(core)] == core
    assert set(report["flags"][len(core):]) <= PLANNER_FLAGS


def planner_flags(*, p0: float | None = None, n_obs: float = 0.0, alpha_mb: float | None = None,
                  mb_coeffs: bool = True) -> list[str]:
    """The flags the planner adds for the defaults it takes, in its order."""
    flags = []
    if p0 is None:
        flags.append("p0_from_mu_o")
    if alpha_mb is None:
        flags.append("alpha_mb_from_alpha_p")
    if not mb_coeffs:
        flags.append("mb_coeffs_zero")
    if n_obs == 0.0:
        flags.append("n_obs_from_n_star")
    return flags


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
    assert report["p0_per_token"] == inputs.get("p0", 1.0 / inputs.get("mu_o", 256.0))
    assert report["gamma"] == report["p0_per_token"] * values["alpha_p"] / values["alpha_d"]
    assert report["eta_per_token2"] == inputs.get("eta", 0.0)
    assert report["flags"] == [f.value for f in expected.flags] + planner_flags(p0=inputs.get("p0"),
                                                                               n_obs=inputs.get("n_obs", 0.0))


def test_ifr_inputs_produce_a_correction(capsys) -> None:
    inputs = {"eta": 1e-6, "p0": 1.0 / 512.0, "n_prev": 800}
    report = run_plan([*cost_flags(RTX), *workload_flags(**inputs)], capsys)
    assert report["delta_theta"] > 0.0
    assert report["theta_star"] < 0.8  # not clipped
    assert report["theta_star"] == pytest.approx(report["theta0"] + report["delta_theta"], rel=1e-15)
    assert report["k_star_requests"] == int(report["theta_star"] * report["n_star_requests"])


def test_alpha_mb_flag(capsys) -> None:
    report = run_plan([*cost_flags(H200, alpha_mb=0.004), *workload_flags(n_obs=64.0)], capsys)
    assert_report_matches(report, reference(H200, n_obs=64.0, alpha_mb=0.004))


def test_out_of_range_delta_is_clipped_and_flagged(capsys) -> None:
    report = run_plan([*cost_flags(H200), *workload_flags(delta=0.5)], capsys)
    assert report["delta_s_per_token"] == 0.01
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
    sources = from_files["inputs"].pop("cost_sources")
    assert from_flags["inputs"].pop("cost_sources")["alpha_p_s"] == "--alpha-p"
    assert sources["alpha_p_s"] == f"--calibration {tmp_path / 'pd_calibration_Qwen3-8B_RTX.json'}"
    assert sources["mb_coeffs_s_per_token"] == f"--calibration {tmp_path / 'beta_mb_Qwen3-8B_RTX.json'}"
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
    lines = {line.split("  ")[0].strip(): line.split("  ")[-1].strip() for line in table.splitlines()
             if not line.startswith("  ")}
    assert lines["θ0 (CFR threshold)"] == f"{expected.theta0:.6g}"
    assert lines["N* (memory-safe batch, requests)"] == str(expected.n_star)
    assert lines["k* (phase-switch threshold, requests)"] == str(expected.k_star)
    assert lines["LHS = β_MB^e − β_EB^w (s/token)"] == f"{expected.lhs_s_per_token:.6g}"
    assert lines["RHS (s/token)"] == f"{expected.rhs_s_per_token:.6g}"
    assert lines["mode (MB if LHS < RHS + δ)"] == "eb"
    flags = [f.value for f in expected.flags] + planner_flags(n_obs=512.0)
    assert lines["flags"] == ", ".join(flags)
    assert lines["γ = p0·α_p/α_d (θ0 solved with it)"] == f"{expected.gamma:.6g}"
    # Every flag is explained on its own line.
    explained = [line.strip().split(":")[0] for line in table.splitlines() if line.startswith("  ")]
    assert explained == flags
    assert lines["α_MB (s)"] == "(α_p (default))"


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


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--alpha-d", "1e-320", "subnormal"),  # γ = p0·α_p/α_d would be inf
        ("--alpha-p", "0", "must be > 0"),
        ("--beta-d", "-1e-4", "must be > 0"),  # a negative number in exponent form parses, then is refused
        ("--beta-p", "-.5", "must be > 0"),
        ("--alpha-mb", "-1E-3", "must be > 0"),
        ("--p0", "0", "must be > 0"),
        ("--p0", "-0.1", "must be > 0"),
        ("--mu-o", "0", "must be > 0"),
        ("--mu-l", "inf", "finite"),
        ("--eta", "nan", "finite"),
        ("--delta", "-inf", "finite"),
        ("--max-num-seqs", "1000000000000", "between 1 and 1048576"),
        ("--max-num-seqs", "1e12", "between 1 and 1048576"),
        ("--max-num-seqs", "2.5", "not an integer"),
        ("--n-prev", "-1", "between 0 and 1048576"),
        ("--kv-capacity-tokens", "0", "between 1 and"),
        ("--kv-capacity-tokens", "1e17", "between 1 and"),
    ],
)
def test_out_of_domain_inputs_are_errors_naming_the_flag(flag: str, value: str, message: str, capsys) -> None:
    argv = [*cost_flags(H200), *workload_flags()]
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    err = expect_usage_error(argv, capsys)
    assert f"argument {flag}: " in err and message in err, err
    assert "expected one argument" not in err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--n-obs", "0.5"], "--n-obs must be 0 (unobserved) or between 1 and 1048576"),
        (["--n-obs", "-2e3"], "--n-obs must be 0"),
        (["--n-obs", "1e7"], "--n-obs must be 0"),
        # Each cost alone is a normal number, but their ratio γ = p0·α_p/α_d overflows.
        (["--alpha-p", "1e300", "--alpha-d", "1e-300"], "γ = p0·α_p/α_d = inf is out of range"),
    ],
)
def test_out_of_domain_combinations_are_errors(extra: list[str], message: str, capsys) -> None:
    argv = [*cost_flags(H200), *workload_flags()]
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    assert message in expect_usage_error(argv, capsys)


def test_negative_calibration_cost_is_an_error_naming_the_file(tmp_path: Path, capsys) -> None:
    path = tmp_path / "pd.json"
    path.write_text(json.dumps({"alpha_p": 0.001, "beta_p": 1e-5, "alpha_d": 0.01, "beta_d": -1e-4}))
    err = expect_usage_error(["--calibration", str(path), *workload_flags()], capsys)
    assert f"beta_d_s_per_request from --calibration {path} must be > 0" in err


def test_p0_above_one_is_clipped_flagged_and_gamma_is_the_one_used(capsys) -> None:
    report = run_plan([*cost_flags(RTX), *workload_flags(p0=5.0, n_obs=64.0)], capsys)
    assert report["p0_per_token"] == 1.0 and report["inputs"]["p0_per_token"] == 5.0
    assert "hazard_intercept_clipped" in report["flags"]
    assert report["gamma"] == 1.0 * RTX["alpha_p"] / RTX["alpha_d"]
    assert report["theta0"] == solve_theta0(report["gamma"])
    assert_report_matches(report, reference(RTX, p0=5.0, n_obs=64.0))


def test_negative_numbers_in_exponent_form_parse(capsys) -> None:
    report = run_plan([*cost_flags(H200), *workload_flags(n_obs=64.0), "--eta", "-1e-6", "--delta", "-2E-3"],
                      capsys)
    assert report["inputs"]["eta_per_token2"] == -1e-6 and report["eta_per_token2"] == 0.0
    assert "hazard_dfr_clipped" in report["flags"]
    assert report["delta_s_per_token"] == -2e-3 and report["inputs"]["delta_s_per_token"] == -2e-3


def test_defaults_taken_are_flagged(capsys) -> None:
    argv = ["--alpha-p", "0.001", "--beta-p", "1e-5", "--alpha-d", "0.01", "--beta-d", "1e-4",
            "--mu-l", "512", "--mu-o", "256", "--kv-capacity-tokens", "1000000"]
    report = run_plan(argv, capsys)
    assert report["flags"][-4:] == ["p0_from_mu_o", "alpha_mb_from_alpha_p", "mb_coeffs_zero", "n_obs_from_n_star"]
    assert report["inputs"]["alpha_mb_s"] == 0.001 and report["inputs"]["mb_coeffs_s_per_token"] == [0.0, 0.0, 0.0]
    assert report["n_obs_requests"] == report["n_star_requests"]


def test_every_flag_has_a_meaning() -> None:
    assert {f.value for f in Flag} | PLANNER_FLAGS <= set(FLAG_MEANINGS)


def test_example_calibrations_are_the_published_profiles() -> None:
    for gpu, costs in (("H200", H200_QWEN3_8B), ("RTX_PRO_6000", RTX_PRO_6000_QWEN3_8B)):
        directory = ROOT / "examples" / "calibrations"
        pd = json.loads((directory / f"pd_calibration_Qwen3-8B_{gpu}.json").read_text())
        mb = json.loads((directory / f"beta_mb_Qwen3-8B_{gpu}.json").read_text())
        profile = parse_calibration(pd).merged(parse_calibration(mb))
        assert profile.to_cost_model() == costs
        assert profile.model == "Qwen/Qwen3-8B"
        # The same coefficients under the engine's environment variable names (strings, as eb-vllm writes).
        env = mb["env_vars_for_pd_auto"]
        assert tuple(float(env[f"VLLM_PD_MB_COST_{x}"]) for x in "ABC") == costs.mb_coeffs_s_per_token
        # Nothing is made up: the measurement details that were not published are null.
        for key in ("dtype", "timestamp", "prefill_r2", "decode_r2", "prefill_sizes", "decode_counts",
                    "num_iterations"):
            assert pd[key] is None


def readme_commands(program: str) -> list[list[str]]:
    """The README's `.venv/bin/controlplane PROGRAM ...` commands (continuation lines joined), as argv."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(f".venv/bin/controlplane {program} "):
            argv = shlex.split(line, comments=True)
            commands.append(argv[1:])
    return commands


def test_readme_plan_commands_run(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(ROOT)
    commands = readme_commands("plan")
    assert len(commands) == 2 and any("examples/calibrations/pd_calibration_Qwen3-8B_H200.json" in c
                                      for c in commands[0])
    for argv in commands:
        assert main(argv) == 0
        assert capsys.readouterr().out
    assert main([*commands[0], "--json"]) == 0
    from_files = json.loads(capsys.readouterr().out)
    expected = reference(H200, mu_l=512.0, mu_o=256.0, kv=1_500_000, max_num_seqs=2048, n_obs=512.0)
    assert_report_matches(from_files, expected)
    assert from_files["inputs"]["cost_sources"]["alpha_p_s"].endswith("pd_calibration_Qwen3-8B_H200.json")


def test_sigma_o_lets_the_moment_bound_lift_a_collapsed_n_star(capsys) -> None:
    """NuminaMath's shape on 217k KV tokens: Prop. 3.3 alone leaves one request (flagged); with σ_O the planner
    prints the N̂* the controller would use, flagged, and the σ_O it used."""
    base = [*cost_flags(RTX), "--mu-l", "122", "--mu-o", "2400", "--kv-capacity-tokens", "217042", "--json"]
    alone = run_plan(base, capsys)
    assert alone["n_star_requests"] == 1 and "kv_below_one_request" in alone["flags"]
    lifted = run_plan([*base, "--sigma-o", "924"], capsys)
    assert 100 <= lifted["n_star_requests"] <= 145 and "memory_bound_from_occupancy" in lifted["flags"]
    assert lifted["inputs"]["sigma_o_tokens"] == 924.0 and alone["inputs"]["sigma_o_tokens"] is None
    expected = evaluate(WorkloadStats(p0=1 / 2400, eta=0.0, mu_l_tokens=122.0, mu_o_tokens=2400.0,
                                      sigma_o_tokens=924.0),
                        CostModel(alpha_p_s=RTX["alpha_p"], beta_p_s_per_token=RTX["beta_p"], alpha_d_s=RTX["alpha_d"],
                                  beta_d_s_per_request=RTX["beta_d"], alpha_mb_s=RTX["alpha_p"],
                                  mb_coeffs_s_per_token=RTX["abc"]),
                        EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=217042))
    assert lifted["n_star_requests"] == expected.n_star
