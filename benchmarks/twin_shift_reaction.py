"""How fast EB+ follows a shift of the output-length law in the twin: a closed loop at c = 2,048 on a GPU profile.

    .venv/bin/python benchmarks/twin_shift_reaction.py                 # H200 Qwen3-8B, 3 shifts, 5 seeds
    .venv/bin/python benchmarks/twin_shift_reaction.py --seeds 20 --profile rtx-pro-6000-qwen3-8b
    .venv/bin/python benchmarks/twin_shift_reaction.py --seeds 20 --shift geometric:1024:256   # one shift
    .venv/bin/python benchmarks/twin_shift_reaction.py --smoke     # c = 256, short runs, 1 seed: a few seconds

Each run is one workload of two closed-loop phases (prompts uniform on 0.5–1.5× 512 tokens; outputs of the
old law, then of the new one) under `eb+`, the product's decision loop with its defaults (a decision every
256 completions or 5 s, one-second pool buckets, shift detection on). The shift is the arrival of the first
request of the new law; every completion after it counts, including those of the requests in flight then
(the old law's). Each decision's θ̂*·N̂* (k̂* before its floor) and N̂* are compared with the new law's
steady values: the medians of the decisions over the second half of a run of the new law alone, the median
over --reference-seeds such runs (one run's moves ~2% with its seed). Printed per
shift, medians over the seeds: the post-shift completions after which every later decision stays within 10%
and within 5% (the decision cadence, ~100–250 completions here, is the resolution), the error of the first
decision after 300 and after 600 completions, and the same settling and errors counted in completions of
requests of the new law only (the 2,048 requests in flight at the shift follow the old law).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from controlplane.sim.arrivals import Phase, Workload
from controlplane.sim.lengths import GeometricLengths, LengthShape, UniformLengths
from controlplane.sim.profiles import get_profile
from controlplane.sim.runner import RunResult, run_scenario
from controlplane.sim.schedulers import parse_scheduler

CONCURRENCY = 2048
PROMPT_TOKENS = 512
BEFORE_COMPLETIONS = 4000  # the old law in steady state before the shift (beyond the requests in flight)
SHIFTS = (("geometric", 128, 1024), ("geometric", 1024, 256), ("uniform", 512, 1024))
# --smoke: (concurrency, completions before the shift, after it, seeds, reference seeds), and short outputs (the
# twin's time, and with it the pool's once-a-second refreshes, grows with them)
SMOKE = (256, 300, 600, 1, 1)
SMOKE_SHIFTS = (("geometric", 256, 128), ("uniform", 128, 256))


def _shape(kind: str, mean_output_tokens: int) -> LengthShape:
    output = (GeometricLengths.from_mean(mean_output_tokens) if kind == "geometric"
              else UniformLengths(nominal_mean_tokens=mean_output_tokens))
    prompt = UniformLengths(nominal_mean_tokens=PROMPT_TOKENS)
    return LengthShape(f"{kind}-{PROMPT_TOKENS}-{mean_output_tokens}", prompt, output,
                       "benchmark: prompts uniform on 0.5–1.5× the mean")


def _decisions(run: RunResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(at_s, θ̂*·N̂*, N̂*) of the decisions computed by the rule (cold-start and held ones left out) while the
    closed loop was full: up to the last arrival (the drain that follows completes the longest requests last)."""
    last_arrival_s = float(np.max(run.requests["arrival_s"]))
    rows = [(d.at_s, d.theta_star * d.n_star, d.n_star) for d in run.timeline
            if d.n_star > 0 and d.theta_star > 0 and d.at_s <= last_arrival_s]
    at, k, n = (np.array(c, dtype=np.float64) for c in zip(*rows, strict=True)) if rows else (np.zeros(0),) * 3
    return at, k, n


REFERENCE_SEED = 12345


def steady(kind: str, mean_output_tokens: int, profile: str, completions: int, seeds: int, *,
           concurrency: int = CONCURRENCY) -> tuple[float, float]:
    """The new law's steady (θ̂*·N̂*, N̂*): per run of that law alone, the medians of the decisions over its
    second half; then the median over `seeds` such runs. One run's medians move ~2% with its seed (geometric
    256 on H200: θ̂*·N̂* 30.4 at seed 12345, 31.0–31.2 at seeds 0–3), a third of the 5% tolerance."""
    phase = Phase(_shape(kind, mean_output_tokens), num_requests=completions, concurrency=concurrency)
    ks, ns = [], []
    for seed in range(REFERENCE_SEED, REFERENCE_SEED + seeds):
        run = run_scenario(Workload("steady", (phase,)), parse_scheduler("eb+"), get_profile(profile), seed=seed,
                           record_steps=False)
        at, k, n = _decisions(run)
        late = at >= np.median(at)
        ks.append(float(np.median(k[late])))
        ns.append(float(np.median(n[late])))
    return float(np.median(ks)), float(np.median(ns))


def one_run(kind: str, before: int, after: int, profile: str, seed: int, post: int, *, concurrency: int = CONCURRENCY,
            pre: int = BEFORE_COMPLETIONS) -> tuple[np.ndarray, ...]:
    """Per decision after the shift: (completions since the shift, those of requests of the new law, θ̂*·N̂*,
    N̂*)."""
    first = pre + concurrency  # the old law in steady state before the shift
    phases = (Phase(_shape(kind, before), num_requests=first, concurrency=concurrency),
              Phase(_shape(kind, after), num_requests=post + concurrency, concurrency=concurrency))
    run = run_scenario(Workload("shift", phases), parse_scheduler("eb+"), get_profile(profile), seed=seed,
                       record_steps=False)
    shift_s = float(run.requests["arrival_s"][first])
    finish_s = run.requests["finish_s"]
    every = np.sort(finish_s[np.isfinite(finish_s)])
    new_law = np.sort(finish_s[first:][np.isfinite(finish_s[first:])])
    at, k, n = _decisions(run)
    later = at >= shift_s
    at, k, n = at[later], k[later], n[later]
    done = np.searchsorted(every, at, side="right") - np.searchsorted(every, shift_s, side="right")
    done_new = np.searchsorted(new_law, at, side="right")
    return done, done_new, k, n


def _settling(done: np.ndarray, error: np.ndarray, tolerance: float) -> float:
    outside = np.nonzero(error > tolerance)[0]
    if outside.size == 0:
        return float(done[0]) if done.size else float("nan")
    last = outside[-1]
    return float(done[last + 1]) if last + 1 < done.size else float("inf")


def _error_at(done: np.ndarray, error: np.ndarray, completions: int) -> float:
    i = int(np.searchsorted(done, completions))
    return float(error[i]) if i < error.size else float("nan")


def _parse_shift(text: str) -> tuple[str, int, int]:
    kind, before, after = text.split(":")
    if kind not in ("geometric", "uniform") or int(before) < 1 or int(after) < 1:
        raise argparse.ArgumentTypeError(f"expected geometric|uniform:BEFORE:AFTER (tokens ≥ 1), got {text!r}")
    return kind, int(before), int(after)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h200-qwen3-8b")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--post-completions", type=int, default=6000, help="completions of the new law")
    parser.add_argument("--reference-seeds", type=int, default=3,
                        help="runs of the new law alone for its steady values")
    parser.add_argument("--shift", action="append", type=_parse_shift, metavar="KIND:BEFORE:AFTER",
                        help="a shift to run (repeatable; kind geometric or uniform, mean output tokens); default: "
                             + ", ".join(f"{k}:{b}:{a}" for k, b, a in SHIFTS))
    parser.add_argument("--smoke", action="store_true",
                        help="c = {}, {} completions before and {} after the shift, {} seed(s), {} reference "
                             "seed(s), shifts {}: the same code paths in a few seconds".format(
                                 *SMOKE, ", ".join(f"{k}:{b}:{a}" for k, b, a in SMOKE_SHIFTS)))
    args = parser.parse_args()
    concurrency, pre = CONCURRENCY, BEFORE_COMPLETIONS
    if args.smoke:
        concurrency, pre, args.post_completions, args.seeds, args.reference_seeds = SMOKE
        args.shift = args.shift or list(SMOKE_SHIFTS)
    started = time.perf_counter()
    print(f"{args.profile}, c = {concurrency}, EB+ with the product's loop defaults; medians over {args.seeds} "
          f"seeds; completions counted from the shift")
    print(f"{'shift':<24}{'steady k / N':>14}{'10% after':>11}{'5% after':>10}{'err@300':>9}{'err@600':>9}"
          f"   new-law completions: {'10%':>5}{'5%':>6}{'err@300':>9}{'err@600':>9}")
    for kind, before, after in args.shift or SHIFTS:
        k_steady, n_steady = steady(kind, after, args.profile, 2 * args.post_completions, args.reference_seeds,
                                    concurrency=concurrency)
        figures: dict[str, list[float]] = {f"{prefix}{name}": [] for prefix in ("", "new")
                                           for name in ("10", "5", "300", "600")}
        for seed in range(args.seeds):
            done, done_new, k, n = one_run(kind, before, after, args.profile, seed, args.post_completions,
                                           concurrency=concurrency, pre=pre)
            error = np.maximum(np.abs(k / k_steady - 1.0), np.abs(n / n_steady - 1.0))
            for prefix, counted in (("", done), ("new", done_new)):  # all completions, new-law ones
                figures[f"{prefix}10"].append(_settling(counted, error, 0.10))
                figures[f"{prefix}5"].append(_settling(counted, error, 0.05))
                figures[f"{prefix}300"].append(_error_at(counted, error, 300))
                figures[f"{prefix}600"].append(_error_at(counted, error, 600))
        m = {name: float(np.median(values)) for name, values in figures.items()}
        label = f"{kind} {before} → {after}"
        print(f"{label:<24}{k_steady:>7.2f} / {n_steady:<4.0f}{m['10']:>11.0f}{m['5']:>10.0f}{m['300']:>9.1%}"
              f"{m['600']:>9.1%}   {'':>21}{m['new10']:>5.0f}{m['new5']:>6.0f}{m['new300']:>9.1%}"
              f"{m['new600']:>9.1%}", flush=True)
    print(f"(wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
