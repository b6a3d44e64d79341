"""One saturated workload on a real vLLM CPU engine, side by side: stock vLLM, the agent in PASSTHROUGH,
MB with the P-PAS budget, EB(k̂*) and EB+ (auto). Prints throughput ratios to stock, TTFT, TPOT and the
agent hook's own time per step.

Run: `.venv/bin/python benchmarks/agent_modes.py [--rounds 2] [--num-requests 600]`; `--smoke`: every
configuration on 4 short requests (the engines' start-up, ~1 minute each on 2 cores, is most of it).
Every configuration runs in a fresh engine process on the same seeded workload; with --rounds > 1 the
order alternates and the figures are medians. The controller runs on an embedded redis-server. The
model is a tiny random-weight Qwen2, so absolute figures say little; the ratios are the result.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc  # noqa: E402
from controlplane.store.embedded import EmbeddedRedis  # noqa: E402
from testbench.net import free_port  # noqa: E402
from testbench.tiny_model import write_tiny_model  # noqa: E402

ENGINE = ROOT / "tests" / "e2e" / "engine_workload.py"
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
CONFIGS = {  # name -> pin (None: no pin, the controller decides; "stock": no agent at all)
    "stock": "stock",
    "passthrough": operator_pb2.PINNED_MODE_PASSTHROUGH,
    "mb_budget": operator_pb2.PINNED_MODE_MB,
    "eb_kstar": operator_pb2.PINNED_MODE_EB,
    "eb_plus": None,
}
# --smoke: (num_requests, prompt_tokens, output_tokens), and unless --configs says otherwise the baseline and
# EB+ alone (each configuration starts an engine of its own: about a minute on 2 cores)
SMOKE = (4, "16,64", "4,16")
SMOKE_CONFIGS = "stock,eb_plus"


@contextlib.contextmanager
def running_controller(tmp: Path, *serve_args: str) -> Iterator[tuple[operator_pb2_grpc.OperatorServiceStub, str]]:
    """A `controlplane serve` process on an embedded redis-server under `tmp`; yields an operator stub and
    the agent address. Stops both on exit."""
    port = free_port()
    with EmbeddedRedis(tmp / "redis") as redis_server:
        controller = subprocess.Popen(
            [sys.executable, "-m", "controlplane", "serve", "--port", str(port), "--redis-url", redis_server.url,
             *serve_args],
            stdout=(tmp / "controller.log").open("w"), stderr=subprocess.STDOUT)
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            grpc.channel_ready_future(channel).result(timeout=60)
            yield operator_pb2_grpc.OperatorServiceStub(channel), f"127.0.0.1:{port}"
        finally:
            controller.terminate()
            controller.wait(timeout=30)


def _set_pin(stub: operator_pb2_grpc.OperatorServiceStub, pin: int | None, *, pinned: bool) -> bool:
    """Pin the fleet to `pin`, or with None leave the controller to decide: clear the fleet pin this benchmark
    set (`pinned`), if any; the controller answers NOT_FOUND to clearing a pin that is not in force. Returns
    whether a fleet pin set here is in force afterwards."""
    if pin is not None:
        stub.PinMode(operator_pb2.PinModeRequest(scope=FLEET, mode=pin, reason="benchmark"))
        return True
    if pinned:
        stub.ClearOverride(operator_pb2.ClearOverrideRequest(scope=FLEET, kind=operator_pb2.OVERRIDE_KIND_PIN,
                                                             reason="benchmark"))
    return False


def run_engine(args: argparse.Namespace, model: Path, work: Path, name: str, address: str) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ENGINE), "--model-dir", str(model), "--result", str(work / "result.json"),
               "--num-requests", str(args.num_requests), "--prompt-tokens", args.prompt_tokens, "--output-tokens",
               args.output_tokens, "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens",
               str(args.max_num_batched_tokens), "--log-stats", "--seed", str(args.seed), "--batch-interval-s", "1.0"]
    if args.smoke:  # seconds saved at each engine's start; the figures mean nothing then
        command.append("--single-process-executor")
    if name == "stock":
        command.append("--stock")
    else:
        command += ["--address", address, "--engine-id", f"bench-{name}-{time.monotonic_ns()}",
                    "--report", str(work / "report.json")]
    with (work / "engine.log").open("w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    result = json.loads((work / "result.json").read_text())
    if not result["all_exact"]:
        raise SystemExit(f"{name}: some request did not produce exactly max_tokens")
    report = json.loads((work / "report.json").read_text()) if name != "stock" else {}
    return {"tok_s": result["num_output_tokens"] / result["elapsed_s"], "ttft_s": result["ttft_mean_s"],
            "tpot_s": result["tpot_mean_s"], "elapsed_s": result["elapsed_s"], "report": report}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--num-requests", type=int, default=600)
    parser.add_argument("--prompt-tokens", default="64,512")
    parser.add_argument("--output-tokens", default="32,256")
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--configs", default=None, help=f"subset of {','.join(CONFIGS)} (default: all)")
    parser.add_argument("--smoke", action="store_true",
                        help="{} requests, prompts {}, outputs {}, configurations {} unless --configs: the "
                             "same code paths".format(*SMOKE, SMOKE_CONFIGS))
    args = parser.parse_args()
    if args.smoke:
        args.num_requests, args.prompt_tokens, args.output_tokens = SMOKE
    if args.configs is None:
        args.configs = SMOKE_CONFIGS if args.smoke else ",".join(CONFIGS)
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown or "stock" not in args.configs.split(","):
        parser.error(f"--configs: unknown {sorted(unknown)} (stock is required as the baseline)")
    selected = {name: CONFIGS[name] for name in args.configs.split(",")}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = write_tiny_model(tmp / "model")
        with running_controller(tmp, "--min-samples", "200", "--decision-interval-s", "1", "--cooldown-s",
                                "5") as (stub, address):
            results: dict[str, list[dict]] = {name: [] for name in selected}
            pinned = False  # whether a fleet pin set here is in force
            for round_index in range(args.rounds):
                names = list(selected) if round_index % 2 == 0 else list(reversed(selected))
                for name in names:
                    if selected[name] != "stock":
                        pinned = _set_pin(stub, selected[name], pinned=pinned)
                    print(f"round {round_index + 1}: {name} ...", flush=True)
                    results[name].append(run_engine(args, model, tmp / f"{name}-{round_index}", name, address))
            decisions = {e.engine_id: e for e in stub.ListEngines(operator_pb2.ListEnginesRequest()).engines}
            views = {eid: stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=eid)).decision
                     for eid in decisions}
    _print(args, results, views)


def _print(args: argparse.Namespace, results: dict[str, list[dict]], views: dict[str, common_pb2.Decision]) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    stock = median("stock", "tok_s")
    print(f"\n{args.num_requests} requests, prompts {args.prompt_tokens}, outputs {args.output_tokens}, "
          f"max_num_seqs {args.max_num_seqs}, budget {args.max_num_batched_tokens}, rounds {args.rounds}")
    print(f"{'config':<12} {'out tok/s':>10} {'vs stock':>9} {'TTFT s':>8} {'TPOT ms':>8} {'hook µs p50':>12} "
          f"{'mean':>7} {'reqs/step':>10} {'goal µs':>8} {'link CPU':>9}  decision")
    for name in results:
        tok_s = median(name, "tok_s")
        report = results[name][-1]["report"]
        hook = mean = per_step = goal = link = ""
        if report:
            steps = max(1, report["num_steps"])
            mean_us = statistics.median(r["report"]["hook_time_s"] / max(1, r["report"]["num_steps"]) * 1e6
                                        for r in results[name])
            median_us = statistics.median(r["report"]["hook_us_median"] for r in results[name])
            reqs = report["num_scheduled_requests"] / steps
            hook, mean, per_step, goal = f"{median_us:.2f}", f"{mean_us:.1f}", f"{reqs:.1f}", f"{5 + 0.1 * reqs:.2f}"
            link_share = statistics.median(r["report"].get("link_batch_cpu_s", 0.0) / r["elapsed_s"]
                                           for r in results[name])
            link = f"{100 * link_share:.2f}%"
        decision = _describe(name, views)
        print(f"{name:<12} {tok_s:>10.0f} {tok_s / stock:>9.3f} {median(name, 'ttft_s'):>8.3f} "
              f"{median(name, 'tpot_s') * 1e3:>8.2f} {hook:>12} {mean:>7} {per_step:>10} {goal:>8} {link:>9}  "
              f"{decision}")


def _describe(name: str, views: dict[str, common_pb2.Decision]) -> str:
    mine = [d for eid, d in views.items() if eid.startswith(f"bench-{name}-")]
    if not mine:
        return "stock vLLM" if name == "stock" else "-"
    d = mine[-1]
    return f"{common_pb2.Mode.Name(d.mode)[5:]} k={d.k} N={d.n} ({d.reason})"


if __name__ == "__main__":
    main()
