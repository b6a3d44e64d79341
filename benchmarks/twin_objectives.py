"""Latency objectives against measured outcomes: a pool of twin engines under a TTFT p99 objective, decided by
the fleet state machine, beside a sweep of static configurations at the same open-loop load.

    .venv/bin/python benchmarks/twin_objectives.py                      # 4 cases, 2 engines, 10 simulated min
    .venv/bin/python benchmarks/twin_objectives.py --minutes 12 --engines 4 --seeds 2
    .venv/bin/python benchmarks/twin_objectives.py --cases h200-qwen3-8b:sharegpt --rate 30
    .venv/bin/python benchmarks/twin_objectives.py --smoke              # tiny, seconds (the figures mean nothing)

Each run is a pool of `--engines` twin engines driven by the fleet state machine in simulated time
(`testbench.twin_pool`: open-loop Poisson arrivals at the case's rate per engine, so TTFT includes queueing; every
second's completions, steps and latency stamps go to `FleetState.batch` as the agent sends them). Guarded rollouts
are on (the product's default; `--no-guard` turns them off). Cases are (profile, workload) pairs, ShareGPT-like and
LongBench-like on H200 and RTX PRO 6000 with Qwen3-8B.

Printed per case, after minute --warmup-min (3): first the static sweep, each row the same arrival trace under
one fixed configuration: MB and EB pinned (operator pins), and the crossover rule (EB+) with a fixed δ (the
FleetState's default intent) crossed with P-PAS's B_cap at ×0.25, ×1 and ×4 the policy's own 2,048 tokens (set
through a static budget sweep, `core.budget.SweepPoint`, which is how an operator fixes B_cap; MB's rows too).
Per row: the pool's TTFT p99 over all requests finishing after the warm-up, its p99 in each one-minute window,
TPOT p99, output (decode) tokens per second, the share of steps run as MB (stock) steps. Then, for TTFT p99
targets at 25, 50 and 75% of the way between EB's and MB's own p99 (the ×1 rows), the objective run
(`operator_pb2.LatencyObjective`, fleet scope, δ bounds left to the whole range): the share of one-minute
windows after the warm-up whose p99 meets the target (goal ≥ 95%), its throughput against the best static row
that meets the target in ≥ 95% of its windows (goal ≥ 97%), and the tracker's state, δ and B_cap scale at the
end of each minute, and the guarded rollouts' events. Last, an infeasible objective (half the lowest p99 of any
static row, so no configuration reaches it): minutes until the tracker says INFEASIBLE (goal ≤ 2; also when it
first had MIN_REQUESTS latencies to evaluate), the configuration it then runs, and whether that configuration's
TTFT p99 is within 5% of the lowest static row's (the issue's "runs the configuration with the lowest predicted
quantile"). The last line counts the goals met. In an open loop a stable configuration delivers the offered
load, so the throughput ratios are near 1 unless a configuration falls behind. `--seeds` repeats each run with
other arrival traces (windows pooled, p99s and throughput averaged, the first seed's trace printed).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from controlplane.sim.profiles import get_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbench, from a checkout
from testbench.twin_pool import CASES, WORKLOADS, Config, Result, run_seeds

TARGET_FRACTIONS = (0.25, 0.5, 0.75)  # of the way from EB's TTFT p99 to MB's
GOAL_WINDOWS = 0.95
GOAL_THROUGHPUT = 0.97
GOAL_INFEASIBLE_MIN = 2.0
LOWEST_SLACK = 0.05  # an infeasible objective's pool runs within this of the lowest static TTFT p99
STATIC_DELTAS_S_PER_TOKEN = (-1e-4, 0.0, 1e-4)
BUDGET_SCALES = (0.25, 1.0, 4.0)



def _statics(scales: tuple[float, ...], deltas: tuple[float, ...]) -> list[Config]:
    configs = [Config(f"MB ×{s:g}", pin="mb", budget_scale=s) for s in scales]
    configs.append(Config("EB", pin="eb"))
    configs += [Config(f"δ {d:+.0e} ×{s:g}", delta_s_per_token=d, budget_scale=s) for d in deltas for s in scales]
    return configs


def _state(name: str) -> str:
    return {"NO_LATENCY_DATA": "none", "MEETING": "meet", "ADJUSTING": "adj", "INFEASIBLE": "INF"}[name]


def _trace_text(trace: list) -> str:
    return " ".join(f"{minute}:{_state(state)} {delta:+.0e} ×{scale:g}" for minute, state, delta, scale in trace)


def _windows_text(windows: list[float]) -> str:
    return " ".join(f"{p:.3g}" for p in windows)


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "met" if ok else "NOT met"


def _rollouts_text(rollouts: list) -> str:
    return ", ".join(f"{what} at {t} s" for t, what in rollouts) or "none"


def run_case(profile_name: str, workload: str, rate_per_s: float, args, kw: dict) -> list[bool | None]:
    """The static sweep, the three objectives and the infeasible one for one case; prints them and returns
    whether each goal was met (None: not applicable, no static meets the target)."""
    profile = get_profile(profile_name)
    prompt, output = WORKLOADS[workload]
    print(f"\n== {profile.name}, {workload}-like (prompts log-normal mean {prompt.median_free_mean_tokens:g} "
          f"tokens, outputs {output.median_free_mean_tokens:g}), {rate_per_s:g} req/s per engine, "
          f"{args.engines} engines, {args.minutes:g} min, seeds {args.seeds}, windows after minute "
          f"{args.warmup_min:g}")
    print(f"{'static':<16}{'TTFT p99 s':>11}{'TPOT p99 ms':>12}{'out tok/s':>10}{'MB steps':>9}  "
          f"TTFT p99 per minute, s")
    statics: dict[str, Result] = {}
    for config in _statics(args.budget_scales, args.deltas):
        result = statics[config.label] = run_seeds(profile, workload, config, **kw)
        print(f"{config.label:<16}{result.ttft_p99_s:>11.3f}{1e3 * result.tpot_p99_s:>12.1f}"
              f"{result.tokens_per_s:>10.0f}{result.mb_step_share:>9.0%}  {_windows_text(result.window_p99_s)}",
              flush=True)
    eb_s, mb_s = statics["EB"].ttft_p99_s, statics["MB ×1"].ttft_p99_s
    print(f"TTFT p99: EB {eb_s:.3f} s, MB {mb_s:.3f} s (MB/EB {mb_s / eb_s:.2f}); targets at 25/50/75% of the way "
          f"from EB's to MB's")
    print(f"{'objective':<18}{'windows met':>12}{'out tok/s':>10}{'best static':>28}{'ratio':>7}{'TTFT p99 s':>11}"
          f"{'MB steps':>9}  goals (≥{GOAL_WINDOWS:.0%} windows, ≥{GOAL_THROUGHPUT:.0%} throughput)")
    met: list[bool | None] = []
    traces = []
    for fraction in TARGET_FRACTIONS:
        target_s = eb_s + fraction * (mb_s - eb_s)
        label = f"{fraction:.0%} ({target_s:.3f} s)"
        result = run_seeds(profile, workload, Config(label, target_s=target_s), **kw)
        meeting = [(r.tokens_per_s, name) for name, r in statics.items() if r.windows_met(target_s) >= GOAL_WINDOWS]
        best_tokens, best_name = max(meeting) if meeting else (math.nan, "none meets it")
        ratio = result.tokens_per_s / best_tokens if meeting else math.nan
        share = result.windows_met(target_s)
        ok_windows, ok_tokens = share >= GOAL_WINDOWS, (ratio >= GOAL_THROUGHPUT) if meeting else None
        met += [ok_windows, ok_tokens]
        best = f"{best_name} {best_tokens:.0f}" if meeting else best_name
        print(f"{label:<18}{share:>12.0%}{result.tokens_per_s:>10.0f}{best:>28}{ratio:>7.3f}{result.ttft_p99_s:>11.3f}"
              f"{result.mb_step_share:>9.0%}  windows {_verdict(ok_windows)}, throughput {_verdict(ok_tokens)}"
              f"{'' if result.infeasible_at_s is None else f'; INFEASIBLE at {result.infeasible_at_s / 60:.1f} min'}",
              flush=True)
        traces.append((label, result))
    for label, result in traces:
        print(f"  trace {label}: per minute {_windows_text(result.window_p99_s)} s; {_trace_text(result.trace)}; "
              f"rollouts: {_rollouts_text(result.rollouts)}")
    lowest_name, lowest = min(((name, r.ttft_p99_s) for name, r in statics.items()), key=lambda item: item[1])
    target_s = 0.5 * lowest
    result = run_seeds(profile, workload, Config("infeasible", target_s=target_s), **kw)
    at_s = result.infeasible_at_s
    ok = at_s is not None and at_s <= GOAL_INFEASIBLE_MIN * 60.0
    lowest_ok = result.ttft_p99_s <= (1.0 + LOWEST_SLACK) * lowest
    met += [ok, lowest_ok]
    end = result.trace[-1] if result.trace else (0, "NO_LATENCY_DATA", 0.0, 1.0)
    print(f"infeasible target {target_s:.3f} s (half the lowest static p99, {lowest_name} {lowest:.3f} s): "
          f"{'never flagged' if at_s is None else f'INFEASIBLE after {at_s / 60:.2f} min'} (goal ≤ "
          f"{GOAL_INFEASIBLE_MIN:g}: {_verdict(ok)}; first evaluated with enough latencies at "
          f"{(result.data_at_s or math.nan) / 60:.2f} min); at the end δ {end[2]:+.0e}, B_cap ×{end[3]:g}, MB steps "
          f"{result.mb_step_share:.0%}, out tok/s {result.tokens_per_s:.0f}")
    print(f"  runs the lowest-quantile configuration (TTFT p99 within {LOWEST_SLACK:.0%} of the lowest static's): "
          f"{_verdict(lowest_ok)} ({result.ttft_p99_s:.3f} s against {lowest:.3f} s)")
    print(f"  trace: {_trace_text(result.trace)}; rollouts: {_rollouts_text(result.rollouts)}")
    if result.infeasible_detail:
        print(f"  detail: {result.infeasible_detail}")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(f"{p}:{w}" for p, w in CASES),
                        help="profile:workload pairs (workloads: sharegpt, longbench)")
    parser.add_argument("--rate", type=float, default=None, help="arrivals per second per engine (default: the "
                        "case's own)")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--warmup-min", type=float, default=3.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--no-guard", action="store_true", help="mode changes at once (no guarded rollouts)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    args.budget_scales, args.deltas = BUDGET_SCALES, STATIC_DELTAS_S_PER_TOKEN
    if args.smoke:
        args.cases, args.engines, args.minutes, args.warmup_min, args.seeds = "h200-qwen3-8b:sharegpt", 2, 1.5, 0.5, 1
        args.budget_scales, args.deltas, args.rate = (1.0,), (0.0,), args.rate or 12.0
    started = time.perf_counter()
    kw = dict(seeds=list(range(args.seeds)), engines=args.engines, minutes=args.minutes,
              warmup_s=args.warmup_min * 60.0, guard=not args.no_guard)
    print(f"TTFT p99 objectives on twin pools: {args.engines} engines, open-loop Poisson arrivals, "
          f"{args.minutes:g} simulated minutes, guarded rollouts {'off' if args.no_guard else 'on'}")
    met: list[bool | None] = []
    for spec in args.cases.split(","):
        profile_name, workload = spec.split(":")
        rate = args.rate if args.rate is not None else CASES[(profile_name, workload)]
        met += run_case(profile_name, workload, rate, args, {**kw, "rate_per_s": rate})
    judged = [ok for ok in met if ok is not None]
    print(f"\ngoals met: {sum(judged)} of {len(judged)} ({len(met) - len(judged)} not applicable) -> "
          f"{'all met' if all(judged) else 'NOT all met'}")
    print(f"wall {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
