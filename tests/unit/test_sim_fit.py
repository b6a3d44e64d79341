"""Fitting a profile from step telemetry, profile JSON, and the `controlplane sim` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from controlplane.cli.main import main
from controlplane.sim.arrivals import closed_loop
from controlplane.sim.costs import StepCosts, attention_pairs
from controlplane.sim.fit import fit_profile, parse_steps, steps_to_jsonl
from controlplane.sim.fit_check import check_profile_fit
from controlplane.sim.lengths import FixedLengths, LengthShape, synthetic_shape
from controlplane.sim.profiles import (
    PROFILES,
    EngineShape,
    SimProfile,
    get_profile,
    load_profile,
    profile_from_json,
    profile_to_json,
)
from controlplane.sim.runner import run_scenario
from controlplane.sim.schedulers import parse_scheduler

# The fit recovers a linear cost model from the twin's telemetry: run the twin on the published lines themselves.
H200 = get_profile("h200-qwen3-8b-linear")


def test_fit_recovers_the_profile_from_twin_telemetry() -> None:
    workload = closed_loop(synthetic_shape(300, 100), concurrency=128, num_requests=800)
    lines = "".join(steps_to_jsonl(run_scenario(workload, parse_scheduler(s), H200, seed=0).steps)
                    for s in ("v1", "eb:16"))
    result = fit_profile(parse_steps(lines), name="refit", shape=H200.shape)
    assert result.profile is not None
    fitted, truth = result.profile.costs, H200.costs
    for name in ("alpha_p_s", "beta_p_s_per_token", "alpha_d_s", "beta_d_s_per_request"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3)
    assert fitted.beta_mb_e(0.5) == pytest.approx(truth.beta_mb_e(0.5), rel=1e-2)


def test_fit_recovers_the_cpu_profile_with_its_attention_term_from_twin_telemetry() -> None:
    """The twin's per-step pair count and the fit's λ agree: a twin run on the CPU profile refits to it."""
    cpu = get_profile("cpu-tiny-qwen2")
    workload = closed_loop(synthetic_shape(400, 60), concurrency=96, num_requests=400)
    lines = "".join(steps_to_jsonl(run_scenario(workload, parse_scheduler(s), cpu, seed=0).steps)
                    for s in ("v1@n=32", "v1", "eb:8:48"))
    steps = parse_steps(lines)
    result = fit_profile(steps, name="refit", shape=cpu.shape)
    assert result.profile is not None
    assert result.profile.prefill_attention_s_per_pair == pytest.approx(cpu.prefill_attention_s_per_pair, rel=1e-3)
    assert result.profile.decode_context_s_per_token == pytest.approx(0.0, abs=1e-12)
    for name in ("alpha_p_s", "beta_p_s_per_token", "alpha_d_s", "beta_d_s_per_request", "alpha_mb_s"):
        assert getattr(result.profile.costs, name) == pytest.approx(getattr(cpu.costs, name), rel=1e-3)
    check = check_profile_fit(result, steps)
    assert check.problems == () and all(a.r2 > 0.9999 for a in check.accuracy)


def test_agent_reports_with_durations_are_read_and_others_refused_with_a_reason() -> None:
    report = {"engine_id": "e", "steps": [
        {"prefill_tokens": 512, "decode_tokens": 0, "decode_requests": 0, "duration_s": 0.02, "total_tokens": 512},
        {"prefill_tokens": 0, "decode_tokens": 8, "decode_requests": 8, "duration_s": 0.004, "total_tokens": 8},
        {"prefill_tokens": 0, "decode_tokens": 0, "decode_requests": 0, "duration_s": 0.001, "total_tokens": 0},
    ]}
    steps = parse_steps(json.dumps(report))
    assert steps.num_steps == 2  # the empty step carries no cost information
    with pytest.raises(ValueError, match="no step with a duration_s"):
        parse_steps(json.dumps({"engine_id": "e", "steps": [{"prefill_tokens": 1}]}))
    with pytest.raises(ValueError, match=":2: missing duration_s"):
        parse_steps('{"prefill_tokens": 1, "decode_tokens": 0, "decode_requests": 0, "duration_s": 0.1}\n'
                    '{"prefill_tokens": 1, "decode_tokens": 0, "decode_requests": 0}')
    with pytest.raises(ValueError, match="no steps"):
        parse_steps("\n")


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_json_round_trips(name: str) -> None:
    profile = PROFILES[name]
    assert profile_from_json(json.loads(json.dumps(profile_to_json(profile)))) == profile


def test_sim_cli_runs_writes_plots_and_fits(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    steps = tmp_path / "steps.jsonl"
    assert main(["sim", "run", "--scenario", "closed:uniform-200-60:c=64:n=300", "--scheduler", "v1",
                 "--scheduler", "eb+", "--profile", "h200-qwen3-8b", "--out", str(out),
                 "--steps-out", str(steps)]) == 0
    printed = capsys.readouterr().out
    assert "eb+" in printed and "tok/s" in printed
    names = sorted(p.name for p in out.iterdir())
    assert "throughput_latency.png" in names and "table.csv" in names
    assert sum(n.startswith("timeline_") for n in names) == 2
    profile_path = tmp_path / "p.json"
    assert main(["sim", "fit-profile", "--steps", str(steps), "--name", "x", "--out", str(profile_path)]) in (0, 1)
    assert main(["sim", "sweep", "--scenario", "closed:uniform-100-20:c=16:n=60",
                 "--scenario", "poisson:uniform-100-20:rate=5:for=5", "--scheduler", "eb:2", "--seeds", "2",
                 "--no-plots", "--out", str(tmp_path / "sweep")]) == 0
    assert len((tmp_path / "sweep" / "table.csv").read_text().splitlines()) == 1 + 4


def test_loaded_profile_file_is_used(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_to_json(H200)))
    assert load_profile(path) == H200


def test_context_term_is_fitted_when_steps_carry_decode_context() -> None:
    rng = np.random.default_rng(5)
    alpha_p, beta_p, alpha_d, beta_d, gamma = 0.01, 3e-5, 0.004, 1e-4, 2e-7
    lines = []
    for _ in range(300):  # prefill-only
        tokens = int(rng.integers(64, 2048))
        lines.append({"prefill_tokens": tokens, "decode_tokens": 0, "decode_requests": 0, "decode_context_tokens": 0,
                      "duration_s": alpha_p + beta_p * tokens + rng.normal(0, 1e-4)})
    for _ in range(600):  # decode-only, contexts independent of the request count
        requests = int(rng.integers(8, 128))
        context = int(requests * rng.integers(100, 900))
        lines.append({"prefill_tokens": 0, "decode_tokens": requests, "decode_requests": requests,
                      "decode_context_tokens": context,
                      "duration_s": alpha_d + beta_d * requests + gamma * context + rng.normal(0, 1e-4)})
    steps = parse_steps("\n".join(json.dumps(line) for line in lines))
    result = fit_profile(steps, name="ctx", shape=EngineShape())
    assert result.profile is not None
    assert result.profile.decode_context_s_per_token == pytest.approx(gamma, rel=0.05)
    assert result.profile.costs.alpha_d_s == pytest.approx(alpha_d, rel=0.1)
    assert result.profile.costs.beta_d_s_per_request == pytest.approx(beta_d, rel=0.05)
    # Without the context column, no context term is invented.
    plain = parse_steps("\n".join(json.dumps({k: v for k, v in line.items() if k != "decode_context_tokens"})
                                  for line in lines))
    assert plain.decode_context_tokens is None
    assert fit_profile(plain, name="plain", shape=EngineShape()).profile.decode_context_s_per_token == 0.0


def _synthetic_cpu_steps(rng: np.random.Generator, *, decode_counts: tuple[int, int]) -> list[dict]:
    """Steps of a known cost model with a prefix-attention term λ: prefill-only, decode-only and mixed."""
    def prefill_pairs(chunks: list[tuple[int, int]]) -> int:
        return sum(attention_pairs(c, p) for c, p in chunks)

    lines = []
    for _ in range(300):
        chunks = [(int(rng.integers(32, 1024)), int(rng.integers(0, 2048))) for _ in range(int(rng.integers(1, 4)))]
        tokens, pairs = sum(c for c, _ in chunks), prefill_pairs(chunks)
        lines.append({"prefill_tokens": tokens, "decode_tokens": 0, "decode_requests": 0, "decode_context_tokens": 0,
                      "prefill_attention_pairs": pairs,
                      "duration_s": CPU.alpha_p_s + CPU.beta_p_s_per_token * tokens + LAMBDA * pairs
                      + rng.normal(0, 2e-4)})
    for _ in range(600):
        requests = int(rng.integers(4, 128))
        lines.append({"prefill_tokens": 0, "decode_tokens": requests, "decode_requests": requests,
                      "decode_context_tokens": int(requests * rng.integers(50, 900)), "prefill_attention_pairs": 0,
                      "duration_s": CPU.alpha_d_s + CPU.beta_d_s_per_request * requests + rng.normal(0, 2e-4)})
    for _ in range(600):
        decodes = int(rng.integers(*decode_counts))
        chunk, prefix = int(rng.integers(16, 2048)), int(rng.integers(0, 1024))
        tokens = chunk + decodes
        r = decodes / tokens
        c0, c1, c2 = CPU.mb_coeffs_s_per_token
        lines.append({"prefill_tokens": chunk, "decode_tokens": decodes, "decode_requests": decodes,
                      "decode_context_tokens": int(decodes * rng.integers(50, 900)),
                      "prefill_attention_pairs": attention_pairs(chunk, prefix),
                      "duration_s": CPU.alpha_mb_s + (c0 + c1 * r + c2 * r * r) * tokens
                      + LAMBDA * attention_pairs(chunk, prefix) + rng.normal(0, 2e-4)})
    return lines


CPU = get_profile("cpu-tiny-qwen2").costs
LAMBDA = 4e-8


def test_prefix_attention_term_is_fitted_jointly_and_the_replay_checks_it() -> None:
    lines = _synthetic_cpu_steps(np.random.default_rng(11), decode_counts=(4, 128))
    steps = parse_steps("\n".join(json.dumps(line) for line in lines))
    assert steps.prefill_attention_pairs is not None
    result = fit_profile(steps, name="cpu", shape=EngineShape())
    profile = result.profile
    assert profile is not None
    assert profile.prefill_attention_s_per_pair == pytest.approx(LAMBDA, rel=0.05)
    assert profile.decode_context_s_per_token == pytest.approx(0.0, abs=2e-9)  # no context cost in the data
    assert profile.costs.alpha_p_s == pytest.approx(CPU.alpha_p_s, rel=0.1)
    assert profile.costs.beta_p_s_per_token == pytest.approx(CPU.beta_p_s_per_token, rel=0.05)
    assert profile.costs.alpha_mb_s == pytest.approx(CPU.alpha_mb_s, rel=0.15)
    check = check_profile_fit(result, steps)
    assert check.problems == ()
    assert {a.phase for a in check.accuracy} == {"prefill", "decode", "mixed"}
    assert all(a.r2 > 0.95 and a.median_abs_rel_error < 0.05 for a in check.accuracy)
    # Without the attention term the same steps are explained worse: the term is what the data needs.
    plain = fit_profile(parse_steps("\n".join(json.dumps({k: v for k, v in line.items()
                                                          if k != "prefill_attention_pairs"}) for line in lines)),
                        name="plain", shape=EngineShape())
    assert plain.profile.prefill_attention_s_per_pair == 0.0
    plain_prefill = next(a for a in check_profile_fit(plain, steps).accuracy if a.phase == "prefill")
    prefill = next(a for a in check.accuracy if a.phase == "prefill")
    assert plain_prefill.median_abs_rel_error > 2 * prefill.median_abs_rel_error


def test_mixed_steps_at_one_decode_count_are_reported_as_unusable() -> None:
    """All mixed steps at ≈ N decodes: α_MB and the decode slope trade off. The check must not pass it on."""
    lines = _synthetic_cpu_steps(np.random.default_rng(3), decode_counts=(126, 128))
    for line in lines:  # the real engine's mixed steps also got slower with more running requests
        if line["prefill_tokens"] and line["decode_tokens"]:
            line["duration_s"] += 3e-4 * (line["decode_tokens"] - 127) + float(np.random.default_rng(
                line["prefill_tokens"]).normal(0, 3e-3))
    steps = parse_steps("\n".join(json.dumps(line) for line in lines))
    result = fit_profile(steps, name="cpu", shape=EngineShape())
    check = check_profile_fit(result, steps)
    assert result.fit.mixed.coefficients[0] < 0.0  # what the single-N recording of the CPU engine gave
    assert any("no positive fixed cost" in p for p in check.problems)


def test_twin_charges_the_prefix_attention_of_each_chunk() -> None:
    """A prompt longer than the budget is prefilled in chunks; each later chunk attends over a longer prefix
    and costs λ·pairs more, exactly per the formula."""
    base = get_profile("cpu-tiny-qwen2")
    profile = SimProfile(name="attn", costs=base.costs, shape=base.shape, prefill_attention_s_per_pair=LAMBDA)
    shape = LengthShape("one-long", FixedLengths(900), FixedLengths(2), "test")
    workload = closed_loop(shape, concurrency=1, num_requests=1)
    result = run_scenario(workload, parse_scheduler("mbt:256"), profile, seed=0)
    steps = result.steps
    prefill = [int(p) for p in steps["prefill_tokens"].tolist() if p]
    assert prefill == [256, 256, 256, 132]
    expected, prefix = [], 0
    for chunk in prefill:
        expected.append(StepCosts(profile).duration_s(chunk, 0, 0, attention_pairs(chunk, prefix)))
        prefix += chunk
    measured = [d for d, p in zip(steps["duration_s"].tolist(), steps["prefill_tokens"].tolist(), strict=True) if p]
    assert measured == pytest.approx(expected, rel=1e-12)
    assert measured[2] > measured[1] > measured[0]
