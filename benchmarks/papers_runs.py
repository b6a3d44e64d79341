"""Running the twin for `benchmarks/twin_vs_papers.py`, and what its rows say of a run: throughput, latency and
step-log summaries (what sets a run's TPOT and throughput, the queue wait, the goodput), what the published
calibration says of a paper's own figures, and the P-PAS runs over seeds with their sampling notes."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from papers_tables import PAPER_SEEDS

from agents.enforcement.plan import StepKind
from controlplane.core.types import CostModel
from controlplane.sim.arrivals import Workload, bursty, materialize
from controlplane.sim.engine import KIND_CODES
from controlplane.sim.lengths import LengthShape
from controlplane.sim.metrics import geometric_mean_ratio
from controlplane.sim.profiles import SimProfile
from controlplane.sim.roofline import RooflineStepModel, prefill_pairs_from_scratch
from controlplane.sim.runner import RunResult, run_scenario
from controlplane.sim.scenarios import check_fits
from controlplane.sim.schedulers import parse_scheduler

V1_GRID_N = (256, 512, 1024)


def run(workload: Workload, scheduler: str, profile: SimProfile, seed: int = 0, steps: bool = False) -> RunResult:
    return run_scenario(workload, parse_scheduler(scheduler), profile, seed=seed, record_steps=steps)


def rps(result: RunResult) -> float:
    return result.metrics.requests_per_s


def tps(result: RunResult) -> float:
    return result.metrics.throughput_tokens_per_s


def change(a: float, b: float) -> float:
    """a over b as a change in percent."""
    return (a / b - 1.0) * 100.0


def time_mean(result: RunResult, column: str) -> float:
    """Time-weighted mean of one step-log column (NaN without a step log)."""
    steps = result.steps
    if not steps or steps["duration_s"].size == 0:
        return math.nan
    return float(np.average(steps[column], weights=steps["duration_s"]))


def mean_running(result: RunResult) -> float:
    """Time-weighted mean of running requests (needs the step log)."""
    return time_mean(result, "num_running")


def best_v1(workload: Workload, profile: SimProfile, key: Callable[[RunResult], float] = rps) -> RunResult:
    """v1's best-throughput max_num_seqs of V1_GRID_N (the paper grid-searches N per scheduler); of settings within
    1% of the best, the largest N (v1's throughput is flat in N at saturation, and the paper's v1 TPOTs, e.g. 269 ms
    on ShareGPT, show it served with about 1,100 requests decoding)."""
    runs = [run(workload, f"v1@n={n}", profile, steps=True) for n in V1_GRID_N]
    best = max(key(r) for r in runs)
    return [r for r in runs if key(r) >= 0.99 * best][-1]


def kv_used(result: RunResult) -> float:
    """Time-weighted mean KV occupancy in percent (needs the step log)."""
    return time_mean(result, "kv_used_tokens") / result.kv_total_tokens * 100.0


def v1_state(result: RunResult) -> str:
    return (f"v1 N={result.scheduler.split('=')[1]}, {mean_running(result):.0f} running, "
            f"KV {kv_used(result):.0f}% used, {result.metrics.num_preemptions} preemptions")


def eb_state(result: RunResult) -> str:
    """The decision in force at the end, the smallest N the run saw, mean running requests and preemptions."""
    last = result.timeline[-1] if result.timeline else None
    kn = f"k̂* {last.k}, N̂* {last.n} (min N {min(d.n for d in result.timeline)})" if last else "no decision"
    return (f"{kn}, {mean_running(result):.0f} running, KV {kv_used(result):.0f}% used, "
            f"{result.metrics.num_preemptions} preemptions")


def step_profile(result: RunResult) -> str:
    """What sets a run's TPOT and throughput (needs the step log): requests decoding per step (time-weighted), the
    mean duration of the steps that decode, and the share of time in steps that decode nothing (a decoding
    request waits through them: TPOT ≈ decode step / (1 − that share))."""
    steps = result.steps
    if not steps or steps["duration_s"].size == 0:
        return "no step log"
    duration = steps["duration_s"]
    decoding = steps["num_decodes"] > 0
    idle_share = duration[~decoding].sum() / duration.sum()
    step_ms = duration[decoding].mean() * 1e3 if decoding.any() else math.nan
    return (f"{time_mean(result, 'num_decodes'):.0f} decoding per step, {step_ms:.0f} ms per decoding step, "
            f"{idle_share:.0%} of the time in steps without a decode")


def paper_decoding(paper_rate_per_s: float, output_tokens: float, paper_tpot_ms: float) -> float:
    """How many requests the paper's figures have decoding at once, by Little's law: completions per second ×
    output tokens per request × seconds per output token."""
    return paper_rate_per_s * output_tokens * paper_tpot_ms / 1e3


def published_lines(costs: CostModel, *, paper_rps: float, prompt_tokens: float, output_tokens: float,
                    paper_tpot_ms: float, budget_tokens: int, mixed: bool) -> str:
    """What the profile's published calibration (`costs`, short-context step lines) says of the paper's own
    figures. EB (`mixed` False): its decode steps carry the ≈D requests the paper's rate and TPOT imply
    (`paper_decoding`) at α_d + β_d·D, its prefill steps the paper's prompt tokens (`prompt_tokens`: those
    prefilled, a cached prefix left out) at α_p + β_p·n per `budget_tokens`-token step; the seconds both fill
    per second of serving (1.0: the lines alone, with no cost growing with context, account for the paper's
    figures). v1 (`mixed` True): the throughput 1/β_MB^e(r) that the authors' fit of their own v1 runs gives
    at this workload's decode ratio r, in tokens and requests per second."""
    if mixed:
        ratio = output_tokens / (prompt_tokens + output_tokens)
        rate = 1.0 / costs.beta_mb_e(ratio)
        return (f"the published β_MB^e(r = {ratio:.2f}) gives v1 {rate:.0f} tok/s "
                f"({rate / (prompt_tokens + output_tokens):.3g} req/s; paper {paper_rps:.3g})")
    decoding = paper_decoding(paper_rps, output_tokens, paper_tpot_ms)
    decode_step_s = costs.alpha_d_s + costs.beta_d_s_per_request * decoding
    decode_s = paper_rps * output_tokens / decoding * decode_step_s
    prompt_rate = paper_rps * prompt_tokens
    prefill_s = prompt_rate * costs.beta_p_s_per_token + prompt_rate / budget_tokens * costs.alpha_p_s
    return (f"the published lines at the paper's figures: decode steps of ≈{decoding:.0f} at "
            f"{decode_step_s * 1e3:.0f} ms and the prefills fill {decode_s + prefill_s:.2f} s per second "
            f"with no context term")


def decode_split(eb: RunResult, v1: RunResult) -> str:
    """Where the decode tokens cost time (needs the step log): EB's decode-only steps (share of its time, mean
    duration, requests per step) against what v1's mixed steps take beyond their prefill at EB's prefill cost
    per token."""
    steps = eb.steps
    decode = steps["kind"] == KIND_CODES[StepKind.DECODE_ONLY]
    prefill = steps["kind"] == KIND_CODES[StepKind.PREFILL_ONLY]
    if not (decode.any() and prefill.any() and v1.steps):
        return "no EB phase steps"
    duration = steps["duration_s"]
    per_prefill_token_s = duration[prefill].sum() / steps["prefill_tokens"][prefill].sum()
    mixed = v1.steps
    extra_s = mixed["duration_s"] - mixed["prefill_tokens"] * per_prefill_token_s
    return (f"EB's decode-only steps take {duration[decode].sum() / duration.sum():.0%} of its time, "
            f"{duration[decode].mean() * 1e3:.0f} ms each for {steps['num_decodes'][decode].mean():.0f} requests; "
            f"v1's mixed steps take {extra_s.mean() * 1e3:.0f} ms beyond their prefill for "
            f"{mixed['num_decodes'].mean():.0f} decodes")


def queue_wait(eb: RunResult, v1: RunResult) -> str:
    """The mean wait in the queue by Little's law (time-weighted mean of waiting requests / request rate; needs
    the step log): at c = 2,048 it is most of TTFT, so the faster scheduler has the lower TTFT (as in the
    paper's own [EB] Table 3 at c = 2,048: EB 70.8 s, v1 83.8 s)."""
    waits = [time_mean(result, "num_waiting") / rps(result) for result in (eb, v1)]
    return f"queue wait (Little's law) EB {waits[0]:.0f} / v1 {waits[1]:.0f} s"


def tpot_median_ms(result: RunResult) -> float:
    """Median time per output token after the first, ms: a preempted request's wait inflates the mean alone."""
    _, tpot_s, many = request_latencies_s(result)
    return float(np.median(tpot_s[many]) * 1e3)


def request_latencies_s(result: RunResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: TTFT, TPOT (time per output token after the first; 0 for one-token outputs) and whether it
    has a TPOT (more than one output token), seconds."""
    req = result.requests
    outputs = req["output_tokens"]
    many = outputs > 1
    tpot = np.where(many, (req["finish_s"] - req["first_token_s"]) / np.maximum(outputs - 1, 1), 0.0)
    return req["first_token_s"] - req["arrival_s"], tpot, many


def goodput(result: RunResult, *, ttft_s: float = 10.0, tpot_s: float = 0.1) -> float:
    """Percent of requests meeting both SLOs (TTFT < 10 s and TPOT < 100 ms; one-token outputs: TTFT only)."""
    ttft, tpot, _ = request_latencies_s(result)
    return float(np.mean((ttft < ttft_s) & (tpot < tpot_s)) * 100.0)


def slo_spread(result: RunResult) -> str:
    """Where the requests' TPOT and TTFT sit against the goodput SLOs: a threshold metric, so a TPOT level a
    fifth off moves it from most requests to few."""
    ttft_s, tpot_s, many = request_latencies_s(result)
    p20, p50, p80 = np.percentile(tpot_s[many] * 1e3, [20, 50, 80])
    return (f"TPOT p20/p50/p80 {p20:.0f}/{p50:.0f}/{p80:.0f} ms, TTFT p50 {np.median(ttft_s):.1f} s, "
            f"{np.mean(ttft_s < 10.0) * 100:.0f}% under 10 s")


def goodput_floor(profile: SimProfile, *, running: int, context_tokens: int) -> str:
    """The decode step the profile's published calibration and datasheet bandwidth allow at `running` requests
    of `context_tokens` context: what TPOT cannot go below in EB, before any prefill phase."""
    assert profile.roofline is not None
    line_s = profile.costs.alpha_d_s + running * profile.costs.beta_d_s_per_request
    kv_bytes = running * context_tokens * profile.roofline.model.kv_bytes_per_token
    kv_s = kv_bytes / profile.roofline.accelerator.memory_bandwidth_bytes_per_s
    return (f"goodput at c = 512: a decode step of {running} requests takes {line_s * 1e3:.0f} ms on the published "
            f"calibration line (at 16 tokens of context) and reads {kv_bytes / 1e9:.0f} GB of KV at the workload's "
            f"mean context ({context_tokens} tokens), ≥ {kv_s * 1e3:.0f} ms at the datasheet bandwidth: "
            f"≥ {(line_s + kv_s) * 1e3:.0f} ms per token before the prefill phases EB interleaves, against the "
            f"100 ms SLO that the paper's 80% of requests meet")


def mixed_decode_tokens(result: RunResult) -> int:
    """Decode tokens scheduled in steps that also carry prefill (needs the step log)."""
    steps = result.steps
    return int(steps["num_decodes"][steps["prefill_tokens"] > 0].sum())


def prefill_r2(profile: SimProfile, top_tokens: int) -> float:
    """R² of a straight line through the roofline's single-prompt prefill times up to `top_tokens`."""
    assert profile.roofline is not None
    model = RooflineStepModel(profile.roofline)
    n = np.linspace(256, top_tokens, 32).astype(int)
    t = np.asarray([model.duration_s(int(x), 0, 0, prefill_pairs_from_scratch(int(x))) for x in n])
    fit = np.polyval(np.polyfit(n, t, 1), n)
    return float(1.0 - ((t - fit) ** 2).sum() / ((t - t.mean()) ** 2).sum())


PPAS_METRICS = {"avg latency": "e2e_mean_s", "p95 latency": "e2e_p95_s", "avg TTFT": "ttft_mean_s",
                "avg TPOT": "tpot_mean_s", "makespan": "makespan_s"}


def ppas_runs(shape: LengthShape, rate: float, scheduler: str, profile: SimProfile,
              seeds: int) -> dict[str, np.ndarray]:
    """Each metric of the bursty trace at `rate` under `scheduler`, one value per seed (seeds 0 … seeds − 1)."""
    workload = check_fits(bursty(shape, burst_rate_per_s=rate), max_model_len_tokens=profile.shape.max_model_len_tokens,
                          profile_name=profile.name)
    runs = [run(workload, scheduler, profile, seed=seed) for seed in range(seeds)]
    return {k: np.asarray([getattr(r.metrics, m) for r in runs], dtype=np.float64) for k, m in PPAS_METRICS.items()}


def paper_sampling_note(values: np.ndarray, paper: float) -> tuple[str, bool]:
    """How far the paper's five-seed mean lies from the twin's mean in standard errors of a five-seed mean
    (the spread the twin's own traces give it): the part of a row's gap that trace sampling explains."""
    mean = float(values.mean())
    se = float(values.std(ddof=1)) / math.sqrt(PAPER_SEEDS) if values.size > 1 else math.nan
    if not (math.isfinite(se) and se > 0.0):
        return "", False
    z = (paper - mean) / se
    return f"5-seed SE ±{se / mean * 100:.1f}%, paper at {z:+.1f} SE", abs(z) <= 2.0


def materialized_requests(shape: LengthShape, rate: float, seeds: int) -> float:
    """Mean number of requests the bursty trace at `rate` draws over `seeds` seeds."""
    sizes = [materialize(bursty(shape, burst_rate_per_s=rate), seed=seed).num_requests for seed in range(seeds)]
    return float(np.mean(sizes))


def improvement(means: dict, rates: tuple[float, ...], metric: str, baseline: str) -> float:
    ratio = geometric_mean_ratio([means["ppas:16384:2048"][r][metric] for r in rates],
                                 [means[baseline][r][metric] for r in rates])
    return (1.0 - ratio) * 100.0


RESAMPLES = 1000  # five-seed draws per improvement row


def improvement_sampling_note(per_seed: dict, rates: tuple[float, ...], metric: str, baseline: str,
                              paper: float) -> str:
    """How far the paper's improvement lies from the twin's in standard errors of an improvement computed from
    five seeds: the spread of the improvement over RESAMPLES draws of five of the twin's seeds (the same five for
    both schedulers and every rate, as a paper run replays one trace per seed under each scheduler)."""
    seeds = per_seed[baseline][rates[0]][metric].size
    if seeds <= PAPER_SEEDS:
        return f"{seeds} seeds: no five-seed spread to measure"
    rng = np.random.default_rng(0)
    pair = ("ppas:16384:2048", baseline)
    draws = []
    for _ in range(RESAMPLES):
        pick = rng.choice(seeds, size=PAPER_SEEDS, replace=False)
        means = {s: {r: {metric: float(per_seed[s][r][metric][pick].mean())} for r in rates} for s in pair}
        draws.append(improvement(means, rates, metric, baseline))
    full = {s: {r: {metric: float(per_seed[s][r][metric].mean())} for r in rates} for s in pair}
    se = float(np.std(draws, ddof=1))
    return f"5-seed SE ±{se:.1f} pts, paper at {(paper - improvement(full, rates, metric, baseline)) / se:+.1f} SE"
