"""Every script under benchmarks/ runs in its smoke mode and prints its table.

`--smoke` runs a benchmark's own code paths at tiny sizes (seconds; the figures mean nothing). Each script runs
as `python benchmarks/<script> --smoke` from the repository root, as a person would run it, and must exit 0
and print the lines its full run prints: the table's header and its ratio rows (the patterns below). The
scripts that start real vLLM CPU engines are e2e (about a minute of engine start-up each on 2 cores). Also
checked: every file under benchmarks/ is a script listed here or a helper module one of them imports, no file
there exceeds MAX_LINES, and neither the benchmarks nor testbench/ import `tests.*` or a private name.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
MAX_LINES = 600
NUMBER = r"[-+]?(?:\d[\d,]*\.?\d*|nan|inf)"


@dataclass(frozen=True)
class Smoke:
    """One benchmark script: the regular expressions (multi-line) its smoke output must match."""

    script: str
    patterns: tuple[str, ...]
    timeout_s: float = 180.0
    engines: bool = False  # starts real vLLM engines: e2e
    imports_vllm: bool = False  # imports vllm (the project's `vllm` extra) without starting an engine


SMOKES = (
    Smoke("agent_hook_micro.py", (
        r"^mode\s+B=16 µs\s+B=64 µs\s+B=128 µs\s+B=256 µs\s+µs/request\s+fixed µs\s+goal@256$",
        *(rf"^{mode}\s+(?:{NUMBER}\s+){{6}}30\.6$" for mode in ("passthrough", "mb", "eb")),
    ), imports_vllm=True),
    Smoke("agent_modes.py", (
        r"^4 requests, prompts 16,64, outputs 4,16, max_num_seqs 128, budget 4096, rounds 1$",
        r"^config\s+out tok/s\s+vs stock\s+TTFT s\s+TPOT ms\s+hook µs p50\s+mean\s+reqs/step\s+goal µs\s+link CPU"
        r"\s+decision$",
        rf"^stock\s+{NUMBER}\s+1\.000\s+.*stock vLLM$",
        *(rf"^{name}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+"
          rf"{NUMBER}%\s+" for name in ("eb_plus",)),
    ), timeout_s=900.0, engines=True),
    Smoke("attack_soak.py", (
        r"^attack\s+attackers\s+rate/s\s+max ΔN\s+max Δk\s+honest out\s+attackers out\s+goal\s+met$",
        rf"^7,000-token prompts, normal outputs\s+1/20\s+[\d,]+\s+{NUMBER}%\s+{NUMBER}%\s+0\s+1/1\s+5%\s+yes$",
        rf"^outputs 1\.9x, at 200,000/s\s+4/20\s+[\d,]+\s+{NUMBER}%\s+{NUMBER}%\s+0\s+4/4\s+10%\s+yes$",
        r"^heterogeneous pool, long-context \(5 engines\)\s+vs its workload alone: .*kept out 5/5",
        r"^ended by the controller\s+200 of 200 \(DEADLINE_EXCEEDED",
        rf"^probe streams \(own process\)\s+\d+ opened every 0\.1 s .*open p50 {NUMBER} s, p99 {NUMBER} s, longest",
        rf"^with 20 readers\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+\{{'answered': \d+",
        rf"^with δ changes\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+\{{'answered': 0",
        rf"^SetDelta round trip \(fleet scope, every engine re-decided\) p50/p99\s+{NUMBER}\s+{NUMBER} ms "
        r"over [1-9]\d* calls$",
    ), timeout_s=240.0),
    Smoke("controller_load.py", (
        r"^streams repl\s+events/s batches/s\s+p50 ms\s+p99 ms\s+max ms undecided untrig\s+ctl cores\s+RSS MiB "
        r"gen cores redis cmd/s\s+agree$",
        rf"^\s+20\s+2\s+(?:{NUMBER}\s+){{5}}\d+\s+\d+\s+{NUMBER}\+{NUMBER}\s",
        rf"^\s+20\s+1x2\s+{NUMBER}\s+",
        r"of which batch sent → decided at the controller",
    )),
    Smoke("decide_latency.py", (
        r"^W_O = 4096, 20 runs each$",
        rf"^baseline: decide\(\) on its own window\s+{NUMBER}\s+{NUMBER}$",
        rf"^engine decision from the pool estimate\s+{NUMBER}\s+{NUMBER}$",
        rf"^engine decision, δ from an objective\s+{NUMBER}\s+{NUMBER}$",
        rf"^\s+1000\s+{NUMBER}\s+{NUMBER}x\s+{NUMBER}$",
        r"^goal: ≤ 50 µs amortised per engine at 1,000 engines, with or without an objective -> (met|NOT met) "
        rf"\({NUMBER} µs; with an objective {NUMBER} µs\)$",
    )),
    Smoke("fit_cpu_profile.py", (
        r"^\d+ timed steps by mode: \{(?=.*'eb': \d+)(?=.*'mb': \d+).*\}; rejected \d+$",
        *(rf"^{phase}\s+(coefficients \[.*\]  samples \d+  outliers \d+|too few steps)$"
          for phase in ("prefill", "decode", "mixed")),
        r"^(wrote .*cpu-profile\.json|no profile written \(--smoke.*)$",
    ), timeout_s=900.0, engines=True),
    Smoke("fuzz_soak.py", (
        r"^streams sent \(soak\)\s+260 \(200 churning engines, 60 fuzz\)$",
        r"^controller exited\s+no$",
        r"^non-finite numbers\s+0$",
        r"^rejections no_hello\s+counted \d+ / sent \d+$",
        rf"^controller RSS\s+baseline {NUMBER} MiB, peak {NUMBER} MiB, after each round's eviction .*\(goal ≤ \+10%\)$",
        rf"^RSS added per round after the first\s+{NUMBER} MiB per 10,000 streams",
    ), timeout_s=240.0),
    Smoke("history_streams.py", (
        r"^2,000 other keys, 3 pools' history streams; medians of 3 calls$",
        rf"^history index \(every 5 s\)\s+{NUMBER}\s+{NUMBER}\s+3$",
        rf"^index \+ SCAN \(every 5 min; before: 5 s\)\s+{NUMBER}\s+{NUMBER}\s+3$",
        rf"^ratio index / SCAN: wall {NUMBER}, server CPU {NUMBER}$",
    )),
    Smoke("latency_model.py", (
        r"^latency model against the twin: pools of 2 engines pinned to each mode",
        r"^case\s+load/s\s+mode\s+TTFT p99 s\s+predicted\s+ratio\s+TPOT ms\s+predicted\s+ratio$",
        *(rf"^h200-qwen3-8b sharegpt\s+{NUMBER}\s+{mode}" + rf"\s+{NUMBER}" * 6 + "$" for mode in ("eb", "mb")),
        r"^  order TTFT p99: twin (EB|MB|tie) lower, model running (eb|mb): (EB|MB|tie) lower "
        r"-> (agree|too close|DISAGREE)$",
        rf"^orders agreed: \d+ of \d+ that both tell apart; \|log\(predicted / measured\)\| median {NUMBER}, largest",
    )),
    Smoke("lognormal_tail.py", (
        r"^cold windows of 512 slots, 2 seeds;",
        r"^law\s+cut\s+Ŝ\(τ\)\s+constant tail\s+log-normal tail\s+used\s+ms\s+base ms$",
        *(rf"^{re.escape(law)}\s+\d+\s+(?:{NUMBER}\s+){{5}}\d+\s+{NUMBER}\s+{NUMBER}$"
          for law in ("geometric 1,024", "log-normal σ 1.3", "uniform 512-1,536", "IFR 2e-5 + 1e-5·t")),
    )),
    Smoke("pool_second.py", (
        r"^one pool, 20 engines × \(64 completions \+ 1,000 steps\) per second; medians over 2 seconds, ms$",
        r"^what\s+ms\s+baseline ms\s+ratio$",
        rf"^bucket close \(one callback\)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$",
        rf"^refresh: shifts, window, fits \(one callback\)\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$",
        rf"^latency sketches in the close \(difference\)\s+{NUMBER}\s*$",
        rf"^latency stamps in the add \(difference\)\s+{NUMBER}\s*$",
        rf"^latency sketches alone: close \+ window merge\s+{NUMBER}\s*$",
        rf"^detector update, 1,024 samples\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}$",
    )),
    Smoke("redecide_stall.py", (
        r"^200 engines in one pool, 2 fleet δ changes each way",
        rf"^one pass\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+\d+\s+{NUMBER}$",
        rf"^in parts of \d+\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+\d+\s+{NUMBER}$",
        rf"^ratio in parts / one pass: longest loop lag {NUMBER}, set_override p50 {NUMBER}$",
    )),
    Smoke("shift_e2e.py", (
        r"^64 requests in flight per engine \(closed loop, paced in real time to the pool's rate\)",
        r"^== 20 completions/s: 2 pools \(2 engines\) at once",
        r"^streams 2: [\d,]+ batches, [\d,]+ decisions pushed and ACKed, .* errors 0$",
        rf"^geometric 256 @20/s ×1\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+256\.0\s+\d+\s+{NUMBER}%/{NUMBER}%$",
        r"^shift\s+rate→got\s+eng\s+first move: done/new, s\s+k̂\*/N̂\*/μ̂_O vs steady\s+10% for good: done/new, s\s+"
        r"5% for good: done/new, s\s+max μ̂_O/truth\s+spread k/N$",
        rf"^geometric 64→256\s+20→{NUMBER}\s+1 median\s+",
        rf"^\s+worst\s+.*\s{NUMBER}\s*$",
        *(rf"^  goal {re.escape(goal)}\s+(met|NOT met)\s+\(" for goal in (
            "within 10% after max(300, 3 s)", "within 5% after max(600, 6 s)", "first move within 25%",
            "μ̂_O ≤ 3× truth", "stationary spread ≤ 5%")),
        r"^timeline: geometric 64→256 @20/s ×1, seed 0",
        rf"^CPU in all: this process {NUMBER} s, controller {NUMBER} s, its redis {NUMBER} s over {NUMBER} s wall",
        r"^all goals (met|NOT met)$",
    )),
    Smoke("twin_objectives.py", (
        r"^TTFT p99 objectives on twin pools: 2 engines, open-loop Poisson arrivals, 1\.5 simulated minutes, "
        r"guarded rollouts on$",
        r"^static\s+TTFT p99 s\s+TPOT p99 ms\s+out tok/s\s+MB steps\s+TTFT p99 per minute, s$",
        *(rf"^{re.escape(row)}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}%\s+{NUMBER}" for row in (
            "MB ×1", "EB", "δ +0e+00 ×1")),
        rf"^TTFT p99: EB {NUMBER} s, MB {NUMBER} s \(MB/EB {NUMBER}\)",
        r"^objective\s+windows met\s+out tok/s\s+best static\s+ratio\s+TTFT p99 s\s+MB steps\s+goals",
        *(rf"^{p}% \({NUMBER} s\)\s+{NUMBER}%\s+{NUMBER}\s+.*\s+{NUMBER}\s+{NUMBER}%\s+windows (met|NOT met), "
          rf"throughput (met|NOT met|n/a)" for p in (25, 50, 75)),
        r"^infeasible target .*\(goal ≤ 2: (met|NOT met); first evaluated .*\); at the end δ ",
        r"^  runs the lowest-quantile configuration .*: (met|NOT met) \(",
        r"^goals met: \d+ of \d+ \(\d+ not applicable\) -> (all met|NOT all met)$",
    )),
    Smoke("twin_outcomes.py", (
        r"^2 engines × 64 in flight, 2 simulated minutes, profile h200-qwen3-8b; the stale calibration from 60 s, "
        r"throughput counted from then$",
        r"^calibration\s+MB tok/s\s+EB tok/s\s+EB\+ no guard\s+EB\+ guard\s+guard/best\s+no guard/best\s+rollouts$",
        rf"^prefill ×0\.5\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+\S",
        r"^rollbacks of a change the correct model asked for in 1 stationary runs: \d+; challenges of its mode "
        r"promoted: \d+$",
    )),
    Smoke("twin_fidelity.py", (
        r"^8 requests \(offline batch\), prompts 16,64, outputs 4,16, N 128, budget 4096; profile cpu-tiny-qwen2$",
        r"^config\s+real tok/s\s+twin tok/s\s+twin/real\s+real TTFT s\s+twin TTFT s\s+twin/real\s+real TPOT ms\s+"
        r"twin TPOT ms\s+twin/real$",
        rf"^stock / v1\s+(?:{NUMBER}\s+){{8}}{NUMBER}$",
        rf"^EB k=16 N=96\s+(?:{NUMBER}\s+){{8}}{NUMBER}$",
        rf"^EB / stock throughput: real {NUMBER}, twin {NUMBER}$",
    ), timeout_s=900.0, engines=True),
    Smoke("twin_shift_reaction.py", (
        r"^h200-qwen3-8b, c = 256, EB\+ with the product's loop defaults; medians over 1 seeds",
        r"^shift\s+steady k / N\s+10% after\s+5% after\s+err@300\s+err@600\s+new-law completions:",
        rf"^geometric 256 → 128\s+{NUMBER} / {NUMBER}\s+",
        rf"^uniform 128 → 256\s+{NUMBER} / {NUMBER}\s+",
        r"^\(wall time \d+ s\)$",
    )),
    Smoke("twin_vs_papers.py", (
        r"^The twin vs the papers \('diff': points for changes, relative % for absolute values\)$",
        *(rf"^\[{section}\] " for section in ("kernel", "table2", "table3", "oracle", "table4", "table6", "ppas")),
        rf"^   h200-qwen3-8b: average EB/v1 over the four\s+\+1\.5%\s+{NUMBER}%\s+{NUMBER}\s+(ok|OFF)\s",
        r"^summary: \d+ rows compared, \d+ within ±5 \(sign right where it matters\), \d+ off$",
    )),
)
# Modules under benchmarks/ that a script imports (no __main__ of their own): twin_vs_papers.py's.
HELPERS = ("papers_report.py", "papers_runs.py", "papers_tables.py")


def _param(smoke: Smoke):
    marks = [pytest.mark.timeout(smoke.timeout_s + 60.0)]
    if smoke.engines:
        marks.append(pytest.mark.e2e)
    return pytest.param(smoke, id=smoke.script.removesuffix(".py"), marks=marks)


@pytest.mark.parametrize("smoke", [_param(smoke) for smoke in SMOKES])
def test_benchmark_smoke(smoke: Smoke) -> None:
    if (smoke.engines or smoke.imports_vllm) and importlib.util.find_spec("vllm") is None:
        pytest.skip("needs the vllm extra (make test installs it)")
    done = subprocess.run([sys.executable, str(BENCHMARKS / smoke.script), "--smoke"], cwd=ROOT,
                          capture_output=True, text=True, timeout=smoke.timeout_s, check=False)
    tail = f"\n--- stdout:\n{done.stdout[-4000:]}\n--- stderr:\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{smoke.script} --smoke exited {done.returncode}{tail}"
    missing = [p for p in smoke.patterns if not re.search(p, done.stdout, flags=re.MULTILINE)]
    assert not missing, f"{smoke.script} --smoke printed no line matching {missing}{tail}"


def _scripts() -> list[str]:
    return sorted(path.name for path in BENCHMARKS.glob("*.py"))


def _runs_as_script(path: Path) -> bool:
    return any(isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
               for node in ast.parse(path.read_text()).body)


def test_every_benchmark_has_a_smoke_test() -> None:
    covered = {smoke.script for smoke in SMOKES}
    assert len(covered) == len(SMOKES), "a script is listed twice"
    unknown = set(_scripts()) - covered - set(HELPERS)
    assert not unknown, f"benchmarks/ files without a smoke test here (add them to SMOKES, or HELPERS): {unknown}"
    assert not (covered | set(HELPERS)) - set(_scripts()), "SMOKES or HELPERS list a file benchmarks/ lacks"
    for name in covered:
        path = BENCHMARKS / name
        assert _runs_as_script(path), f"{name} has no `if __name__ == \"__main__\":`"
        assert '"--smoke"' in path.read_text(), f"{name} takes no --smoke"
    for name in HELPERS:
        assert not _runs_as_script(BENCHMARKS / name), f"{name} runs as a script: list it in SMOKES"


def test_no_benchmark_file_is_longer_than_the_limit() -> None:
    lengths = {name: len((BENCHMARKS / name).read_text().splitlines()) for name in _scripts()}
    assert not {name: n for name, n in lengths.items() if n > MAX_LINES}, lengths


# Private names a file may import, with the reason. testbench/cusum_reference.py is the CUSUM written as its
# recursion against the detector's internals: it uses the detector's per-sample jitter, which
# controlplane.core.change_detection does not export under a public name.
ALLOWED_PRIVATE = {("cusum_reference.py", "_jitter")}


def _bad_imports(path: Path) -> list[str]:
    """`tests.*` modules and private names (or private modules) that `path` imports."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules, names = [alias.name for alias in node.names], []
        elif isinstance(node, ast.ImportFrom):
            modules, names = [node.module or ""], [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "tests" or any(part.startswith("_") for part in parts if part != "__future__"):
                bad.append(f"{path.name}:{node.lineno} imports {module}")
        bad += [f"{path.name}:{node.lineno} imports {name}" for name in names
                if name.startswith("_") and (path.name, name) not in ALLOWED_PRIVATE]
    return bad


def test_benchmarks_and_testbench_import_no_tests_and_no_private_names() -> None:
    paths = [*BENCHMARKS.glob("*.py"), *(ROOT / "testbench").glob("*.py")]
    assert not [line for path in sorted(paths) for line in _bad_imports(path)]
