"""The twin against the papers: every published figure the twin's hardware covers, paper beside twin.

    .venv/bin/python benchmarks/twin_vs_papers.py            # the full set (a few minutes on 2 cores)
    .venv/bin/python benchmarks/twin_vs_papers.py --quick    # fewer requests and seeds
    .venv/bin/python benchmarks/twin_vs_papers.py --smoke    # every section on tiny runs: seconds, figures meaningless
    .venv/bin/python benchmarks/twin_vs_papers.py --section table2,ppas   # some sections only

Each row: the quantity, the paper's value, the twin's, and `diff`: for a change or ratio in percent, twin −
paper in percentage points; for an absolute value (req/s, s, ms, tok/s), the twin's relative deviation in
percent. `ok` when |diff| ≤ 5 and, for a TTFT/TPOT change, the sign agrees; otherwise the row is printed
anyway with a note naming what the twin measured there. Rows marked `sign` have only a published direction.

Sections (the profiles: controlplane/sim/profiles.py; the workloads: controlplane/sim/data/workloads.json):
  table2   [EB] Table 2 and [EB] §4.3.3: EB(k̂*) vs v1 on ShareGPT, WildChat, LongBench, NuminaMath (c = 2048), RTX
           PRO 6000 and H200, Qwen3-8B and Qwen3-30B-A3B: requests/s, the change, TTFT and TPOT changes; 4,000
           requests each (NuminaMath too: with fewer than 2,048 the closed loop is one batch in flight at t = 0
           and the run its drain, never a steady state)
  table3   [EB] Table 3 and [EB] §4.4: EB+ vs v1 and EB(k̂*) at c = 32 / 512 / 2048 (μ_L 512, μ_O 256), the
           distribution and concurrency shifts; goodput at c = 512 (TTFT < 10 s, TPOT < 100 ms); per cell also
           EB+ warm-started from the pool snapshot an earlier run (seed 1) left, against the better of v1
           and EB(k̂*) (a pool with history skips the 400-completion cold start)
  oracle   [EB] §4.2: EB(k̂*) over the best fixed k at N = 1024, H200, geometric outputs
  table4   [EB] Table 4: WildChat on L40S and B300
  table6   [EB] Table 6: EB(k̂*) vs v1 at 128K input / 64 output on the RTX PRO 6000 (Qwen3 with YaRN's
           131,072-token context), as many concurrent requests as the KV cache holds; the paper publishes the
           range over its seven models, +1.4 to +4.0%
  kernel   [EB] §1 and [EB] App. A.1: the mixed-batch crossover decode ratio; the linear prefill model's R²
  ppas     [PPAS] Tables 1, 2, 3, 9, 10: P-PAS vs fixed MBT 2k / 16k on the bursty long-context trace,
           Qwen2.5-3B on the RTX 5090: the twin's mean over 40 seeds (traces) against the paper's five-seed
           means, each [PPAS] Table 9 row noting how many standard errors of a five-seed mean apart they are
Deterministic (fixed seeds); one process.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

# The published figures, the rows and the runs live beside this script (papers_tables.py, papers_report.py,
# papers_runs.py); `python benchmarks/twin_vs_papers.py` finds them on sys.path[0].
from papers_report import add, footnote, print_rows, summary
from papers_runs import (
    PPAS_METRICS,
    V1_GRID_N,
    best_v1,
    change,
    decode_split,
    eb_state,
    goodput,
    goodput_floor,
    improvement,
    improvement_sampling_note,
    materialized_requests,
    mean_running,
    mixed_decode_tokens,
    paper_decoding,
    paper_sampling_note,
    ppas_runs,
    prefill_r2,
    published_lines,
    queue_wait,
    rps,
    run,
    slo_spread,
    step_profile,
    time_mean,
    tpot_median_ms,
    tps,
    v1_state,
)
from papers_tables import (
    ORACLE_PAPER,
    PAPER_SEEDS,
    PPAS_TABLE1,
    PPAS_TABLE3,
    PPAS_TABLE9,
    PPAS_TABLE10,
    TABLE2_AVERAGE,
    TABLE2_CHANGE,
    TABLE2_RPS,
    TABLE4,
    TABLE6_RANGE,
    TPOT_MS,
    TTFT_S,
)

from controlplane.sim.arrivals import closed_loop
from controlplane.sim.lengths import (
    DATASET_SHAPES,
    FixedLengths,
    LengthShape,
    synthetic_geometric_shape,
    synthetic_shape,
)
from controlplane.sim.profiles import get_profile
from controlplane.sim.roofline import RooflineStepModel, mixed_crossover_ratio
from controlplane.sim.runner import run_scenario
from controlplane.sim.scenarios import check_fits, concurrency_shift, distribution_shift
from controlplane.sim.schedulers import parse_scheduler

WORKLOADS = ("sharegpt", "wildchat", "longbench", "numinamath")


def section_table2(requests: int, long_requests: int) -> None:
    title = "table2"
    print(f"\n[{title}] [EB] Table 2 / [EB] §4.3.3 — EB(k̂*) vs v1 (best of N ∈ {V1_GRID_N}), c = 2048, "
          f"{requests} requests ({long_requests} for NuminaMath)")
    for name in ("rtx-pro-6000-qwen3-8b", "h200-qwen3-8b", "rtx-pro-6000-qwen3-30b-a3b", "h200-qwen3-30b-a3b"):
        profile = get_profile(name)
        changes = []
        for workload_name in WORKLOADS:
            count = long_requests if workload_name == "numinamath" else requests
            workload = check_fits(closed_loop(DATASET_SHAPES[workload_name], concurrency=2048, num_requests=count),
                                  max_model_len_tokens=profile.shape.max_model_len_tokens, profile_name=name)
            v1 = best_v1(workload, profile)
            eb = run(workload, "eb-kstar", profile, steps=True)
            key = (name, workload_name)
            gain = change(rps(eb), rps(v1))
            changes.append(gain)
            cause = f"EB {eb_state(eb)}; {v1_state(v1)}"
            add(title, f"{name} {workload_name}: EB/v1 req/s", TABLE2_CHANGE.get(key), gain, note=cause)
            if key in TABLE2_RPS:
                paper_v1, paper_eb = TABLE2_RPS[key]
                lines = {who: "; " + published_lines(
                    profile.costs, paper_rps=rate, prompt_tokens=DATASET_SHAPES[workload_name].prompt.mean_tokens,
                    output_tokens=DATASET_SHAPES[workload_name].output.mean_tokens, paper_tpot_ms=tpot_ms,
                    budget_tokens=profile.shape.max_num_batched_tokens, mixed=who == "v1")
                    for who, rate, tpot_ms in zip(("v1", "EB"), TABLE2_RPS[key], TPOT_MS.get(key, (0.0, 0.0)),
                                                  strict=True) if key in TPOT_MS}
                add(title, f"{name} {workload_name}: v1 req/s", paper_v1, rps(v1), kind="abs", unit="req/s",
                    note=v1_state(v1) + lines.get("v1", ""))
                add(title, f"{name} {workload_name}: EB(k̂*) req/s", paper_eb, rps(eb), kind="abs", unit="req/s",
                    note=f"EB {eb_state(eb)}" + lines.get("EB", ""))
                if workload_name in ("sharegpt", "wildchat", "numinamath"):
                    tpot_v1_ms, tpot_ms = TPOT_MS[key]
                    shape = DATASET_SHAPES[workload_name]
                    decoding = paper_eb * shape.output.mean_tokens * tpot_ms / 1e3
                    decoding_v1 = paper_v1 * shape.output.mean_tokens * tpot_v1_ms / 1e3
                    footnote(title, f"{name} {workload_name}: the paper's EB(k̂*) {paper_eb} req/s at {tpot_ms} ms per "
                                    f"token means ≈ {decoding:.0f} requests decoding (Little's law with the shape's "
                                    f"{shape.output.mean_tokens:.0f}-token mean output; v1 ≈ {decoding_v1:.0f}); the "
                                    f"twin's KV ({profile.shape.kv_capacity_tokens} tokens) holds "
                                    f"{mean_running(eb):.0f} (EB) / {mean_running(v1):.0f} (v1) of this shape, whose "
                                    f"requests carry {shape.mean_prompt_tokens:.0f} prompt tokens on average")
            tpot = change(eb.metrics.tpot_mean_s, v1.metrics.tpot_mean_s)
            ttft = change(eb.metrics.ttft_mean_s, v1.metrics.ttft_mean_s)
            latency = (f"TPOT EB {eb.metrics.tpot_mean_s * 1e3:.0f} / v1 {v1.metrics.tpot_mean_s * 1e3:.0f} ms "
                       f"(medians {tpot_median_ms(eb):.0f} / {tpot_median_ms(v1):.0f}), "
                       f"TTFT EB {eb.metrics.ttft_mean_s:.0f} / v1 {v1.metrics.ttft_mean_s:.0f} s")
            if key in TPOT_MS:
                paper_v1, paper_eb = TPOT_MS[key]
                add(title, f"{name} {workload_name}: TPOT change EB vs v1", change(paper_eb, paper_v1), tpot,
                    sign_matters=True, note=latency)
                output_tokens = DATASET_SHAPES[workload_name].output.mean_tokens
                rates = TABLE2_RPS.get(key)  # the paper's req/s, where it publishes them for this profile
                for who, result, paper_ms, paper_rps in (("EB", eb, paper_eb, rates and rates[1]),
                                                         ("v1", v1, paper_v1, rates and rates[0])):
                    implied = (f"paper ≈ {paper_decoding(paper_rps, output_tokens, paper_ms):.0f} decoding "
                               f"(Little's law); " if paper_rps else "")
                    add(title, f"{name} {workload_name}: {who} TPOT", paper_ms, result.metrics.tpot_mean_s * 1e3,
                        kind="abs", unit="ms", note=f"{implied}twin {step_profile(result)}")
            elif workload_name == "longbench" and name.endswith("qwen3-8b"):
                add(title, f"{name} longbench: TPOT change (v1 lower, [EB] §4.3.3)", 1.0, tpot, kind="sign",
                    note=latency)
            if workload_name == "longbench":
                footnote(title, f"{name} longbench: {decode_split(eb, v1)}")
            if workload_name == "longbench" and name.endswith("qwen3-8b"):
                if key in TTFT_S:
                    paper_v1, paper_eb = TTFT_S[key]
                    add(title, f"{name} longbench: TTFT change EB vs v1", change(paper_eb, paper_v1), ttft,
                        sign_matters=True, note=latency)
                    wait = queue_wait(eb, v1)
                    add(title, f"{name} longbench: EB TTFT", paper_eb, eb.metrics.ttft_mean_s, kind="abs", unit="s",
                        note=f"{wait}; EB {rps(eb):.2f} req/s (paper {TABLE2_RPS[key][1]})")
                    add(title, f"{name} longbench: v1 TTFT", paper_v1, v1.metrics.ttft_mean_s, kind="abs", unit="s",
                        note=f"{wait}; v1 {rps(v1):.2f} req/s (paper {TABLE2_RPS[key][0]})")
                else:
                    add(title, f"{name} longbench: TTFT change (EB lower, [EB] §4.3.3)", -1.0, ttft, kind="sign",
                        note=latency)
            elif name.endswith("qwen3-8b"):
                add(title, f"{name} {workload_name}: TTFT change (v1 generally lower)", 1.0, ttft, kind="sign",
                    note=f"{latency}; {queue_wait(eb, v1)}")
        add(title, f"{name}: average EB/v1 over the four", TABLE2_AVERAGE[name], float(np.mean(changes)),
            note="the mean of the four rows above: " + " / ".join(f"{c:+.1f}" for c in changes))
        if name == "rtx-pro-6000-qwen3-8b":
            workload = closed_loop(DATASET_SHAPES["wildchat-single-turn"], concurrency=2048, num_requests=requests)
            v1, eb = best_v1(workload, profile), run(workload, "eb-kstar", profile, steps=True)
            note = f"diagnostic: WildChat turns without history; EB {eb_state(eb)}; v1 {mean_running(v1):.0f} running"
            add(title, f"{name} wildchat-single-turn: EB/v1 req/s", TABLE2_CHANGE[(name, "wildchat")],
                change(rps(eb), rps(v1)), note=note)
            add(title, f"{name} wildchat-single-turn: v1 req/s", TABLE2_RPS[(name, "wildchat")][0], rps(v1), kind="abs",
                unit="req/s", note=f"diagnostic; {v1_state(v1)}")
            add(title, f"{name} wildchat-single-turn: EB(k̂*) req/s", TABLE2_RPS[(name, "wildchat")][1], rps(eb),
                kind="abs", unit="req/s", note=f"diagnostic; EB {eb_state(eb)}")
    print_rows(title)


def section_table3(requests: int, quick: bool, small_requests: int = 300) -> None:
    title = "table3"
    print(f"\n[{title}] [EB] Table 3 / [EB] §4.4 — EB+ (δ = 0) vs v1 and EB(k̂*), Qwen3-8B, μ_L 512 / μ_O 256, "
          f"N ≤ 1024, {requests} requests")
    shape = synthetic_shape(512, 256)
    for name in ("rtx-pro-6000-qwen3-8b", "h200-qwen3-8b"):
        profile = get_profile(name)
        rtx = name.startswith("rtx")
        cells = [(f"c={c}", closed_loop(shape, concurrency=c,
                                        num_requests=requests if c > 32 else max(small_requests, requests // 4)))
                 for c in (32, 512, 2048)]
        if not quick:
            cells += [("dist-shift", distribution_shift()), ("conc-shift", concurrency_shift())]
        for cell, workload in cells:
            v1 = run(workload, "v1", profile, steps=True)
            eb = run(workload, "eb-kstar", profile, steps=True)
            ebp = run(workload, "eb+", profile, steps=True)
            modes = "→".join(dict.fromkeys(d.mode for d in ebp.timeline))
            note = (f"tok/s v1 {tps(v1):.0f} EB {tps(eb):.0f} EB+ {tps(ebp):.0f}; EB+ modes {modes}; "
                    f"TTFT s {v1.metrics.ttft_mean_s:.2f}/{eb.metrics.ttft_mean_s:.2f}/{ebp.metrics.ttft_mean_s:.2f}")
            best = max(tps(v1), tps(eb))
            label = f"{name.split('-qwen')[0]} {cell}"
            earlier = run(workload, "eb+", profile, seed=1)
            warm = run_scenario(workload, replace(parse_scheduler("eb+"), warm_start=earlier.pool_window), profile,
                                seed=0, record_steps=False)
            add(title, f"{label}: EB+ warm-started/best of v1 and EB (≥ −1%)", 0.0, change(tps(warm), best),
                note=f"EB+ cold {change(tps(ebp), best):+.1f}%; warm first decision {warm.timeline[0].reason}, "
                     f"tok/s {tps(warm):.0f}")
            if rtx and cell == "c=2048":
                add(title, f"{label}: EB/v1 tok/s", change(13179, 8830), change(tps(eb), tps(v1)), note=note)
                add(title, f"{label}: EB+/v1 tok/s", change(13214, 8830), change(tps(ebp), tps(v1)), note=note)
                add(title, f"{label}: EB+/EB tok/s", change(13214, 13179), change(tps(ebp), tps(eb)), note=note)
                output_tokens = shape.output.mean_tokens  # tok/s counts prompt and output tokens
                for who, result, paper_tp, paper_ttft, paper_tpot in (("v1", v1, 8830, 83.8, 207.3),
                                                                      ("EB(k̂*)", eb, 13179, 70.8, 82.7),
                                                                      ("EB+", ebp, 13214, 68.2, 101.6)):
                    paper_rps = paper_tp / (shape.mean_prompt_tokens + output_tokens)
                    lines = published_lines(profile.costs, paper_rps=paper_rps, prompt_tokens=shape.mean_prompt_tokens,
                                            output_tokens=output_tokens, paper_tpot_ms=paper_tpot,
                                            budget_tokens=profile.shape.max_num_batched_tokens, mixed=who == "v1")
                    profile_note = f"twin {mean_running(result):.0f} running, {step_profile(result)}; {lines}"
                    add(title, f"{label}: {who} tok/s", paper_tp, tps(result), kind="abs", unit="tok/s",
                        note=profile_note)
                    add(title, f"{label}: {who} TTFT", paper_ttft, result.metrics.ttft_mean_s, kind="abs", unit="s",
                        note=f"queue wait (Little's law) {time_mean(result, 'num_waiting') / rps(result):.0f} s")
                    implied = paper_decoding(paper_rps, output_tokens, paper_tpot)
                    add(title, f"{label}: {who} TPOT", paper_tpot, result.metrics.tpot_mean_s * 1e3, kind="abs",
                        unit="ms", note=f"paper ≈ {implied:.0f} decoding (Little's law); {profile_note}")
                latency = (f"TPOT v1 {v1.metrics.tpot_mean_s * 1e3:.0f} / EB+ {ebp.metrics.tpot_mean_s * 1e3:.0f} ms, "
                           f"TTFT v1 {v1.metrics.ttft_mean_s:.0f} / EB+ {ebp.metrics.ttft_mean_s:.0f} s; v1 "
                           f"{step_profile(v1)}; EB+ {step_profile(ebp)}")
                add(title, f"{label}: TPOT change EB+ vs v1", change(101.6, 207.3),
                    change(ebp.metrics.tpot_mean_s, v1.metrics.tpot_mean_s), sign_matters=True, note=latency)
                add(title, f"{label}: TTFT change EB+ vs v1", change(68.2, 83.8),
                    change(ebp.metrics.ttft_mean_s, v1.metrics.ttft_mean_s), sign_matters=True,
                    note=f"{latency}; {queue_wait(ebp, v1)} (EB+ / v1)")
            elif rtx and cell == "c=512":
                add(title, f"{label}: EB+/v1 tok/s", 62.0, change(tps(ebp), tps(v1)), note=note)
                add(title, f"{label}: TPOT change EB+ vs v1 (1.8× lower)", (1 / 1.8 - 1) * 100,
                    change(ebp.metrics.tpot_mean_s, v1.metrics.tpot_mean_s), sign_matters=True,
                    note=f"TPOT v1 {v1.metrics.tpot_mean_s * 1e3:.0f} / EB+ {ebp.metrics.tpot_mean_s * 1e3:.0f} ms; "
                         f"v1 {step_profile(v1)}; EB+ {step_profile(ebp)}")
                add(title, f"{label}: goodput EB+ (TTFT<10 s, TPOT<100 ms)", 80.3, goodput(ebp),
                    note=slo_spread(ebp))
                add(title, f"{label}: goodput EB(k̂*)", 77.3, goodput(eb), note=slo_spread(eb))
                add(title, f"{label}: goodput v1", 5.8, goodput(v1), note=slo_spread(v1))
                footnote(title, goodput_floor(profile, running=512, context_tokens=512 + 256 // 2))
            elif rtx and cell == "c=32":
                add(title, f"{label}: EB+/v1 tok/s (EB+ picks MB)", 0.0, change(tps(ebp), tps(v1)), note=note)
                add(title, f"{label}: EB+ tok/s", 4930, tps(ebp), kind="abs", unit="tok/s",
                    note=f"twin {step_profile(ebp)}")
                add(title, f"{label}: EB+ TTFT", 0.061, ebp.metrics.ttft_mean_s, kind="abs", unit="s",
                    note=f"queue wait (Little's law) {time_mean(ebp, 'num_waiting') / rps(ebp) * 1e3:.0f} ms")
                add(title, f"{label}: EB+ TPOT", 19.5, ebp.metrics.tpot_mean_s * 1e3, kind="abs", unit="ms",
                    note=f"twin {step_profile(ebp)}")
                add(title, f"{label}: TTFT change EB(k̂*) vs v1 (~1.5×)", 50.0,
                    change(eb.metrics.ttft_mean_s, v1.metrics.ttft_mean_s), sign_matters=True,
                    note=f"TTFT v1 {v1.metrics.ttft_mean_s * 1e3:.0f} / EB {eb.metrics.ttft_mean_s * 1e3:.0f} ms; "
                         f"{queue_wait(eb, v1)}; EB {eb_state(eb)}; EB {step_profile(eb)}")
            elif rtx:
                paper = {"dist-shift": 36.4, "conc-shift": 22.6}[cell]
                add(title, f"{label}: EB+/v1 tok/s", paper, change(tps(ebp), tps(v1)), note=note)
                add(title, f"{label}: EB+/best of v1 and EB (within ~1%)", 0.0, change(tps(ebp), best))
            else:
                paper_v1 = {"c=32": 0.0, "c=512": 0.0, "dist-shift": 3.9, "conc-shift": 0.6}
                if cell in paper_v1:
                    add(title, f"{label}: EB+/v1 tok/s", paper_v1[cell], change(tps(ebp), tps(v1)), note=note)
                else:
                    add(title, f"{label}: EB+/EB tok/s", 0.0, change(tps(ebp), tps(eb)), note=note)
                if cell in ("dist-shift", "conc-shift"):
                    add(title, f"{label}: EB+/best of v1 and EB (within ~1%)", 0.0, change(tps(ebp), best))
    print_rows(title)


ORACLE_KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768)


def section_oracle(requests: int) -> None:
    title = "oracle"
    print(f"\n[{title}] [EB] §4.2 — EB(k̂*) over the best fixed k at N = 1024 (H200, Qwen3-8B, geometric outputs, "
          f"c = 2048, {requests} requests)")
    profile = get_profile("h200-qwen3-8b")
    for name, paper in ORACLE_PAPER.items():
        mu_l, mu_o = {"decode-heavy": (128, 1024), "balanced": (512, 512), "prefill-heavy": (1024, 128)}[name]
        workload = closed_loop(synthetic_geometric_shape(mu_l, mu_o), concurrency=2048, num_requests=requests)
        runs = {k: run(workload, f"eb:{k}:1024", profile, steps=True) for k in ORACLE_KS}
        best_k = max(runs, key=lambda k: tps(runs[k]))
        eb = run(workload, "eb-kstar", profile, steps=True)
        add(title, f"h200 geometric {name}: EB(k̂*) over best fixed k", paper, change(tps(eb), tps(runs[best_k])),
            note=f"best fixed k {best_k} ({tps(runs[best_k]):.0f} tok/s, {mean_running(runs[best_k]):.0f} running, "
                 f"{runs[best_k].metrics.num_preemptions} preemptions); EB {eb_state(eb)}, {tps(eb):.0f} tok/s")
    print_rows(title)


def section_table4(requests: int) -> None:
    title = "table4"
    print(f"\n[{title}] [EB] Table 4 — WildChat, Qwen3-8B, c = 2048, {requests} requests")
    for name, (paper_v1, paper_eb) in TABLE4.items():
        profile = get_profile(name)
        workload = closed_loop(DATASET_SHAPES["wildchat"], concurrency=2048, num_requests=requests)
        v1 = best_v1(workload, profile)
        eb = run(workload, "eb-kstar", profile, steps=True)
        note = f"EB {eb_state(eb)}; {v1_state(v1)}; KV {profile.shape.kv_capacity_tokens} tokens"
        acc = name.split("-qwen")[0]
        add(title, f"{acc} wildchat: EB/v1 req/s", change(paper_eb, paper_v1), change(rps(eb), rps(v1)), note=note)
        add(title, f"{acc} wildchat: v1 req/s", paper_v1, rps(v1), kind="abs", unit="req/s", note=v1_state(v1))
        add(title, f"{acc} wildchat: EB(k̂*) req/s", paper_eb, rps(eb), kind="abs", unit="req/s",
            note=f"EB {eb_state(eb)}")
        latency = (f"TTFT EB {eb.metrics.ttft_mean_s:.0f} / v1 {v1.metrics.ttft_mean_s:.0f} s, TPOT EB "
                   f"{eb.metrics.tpot_mean_s * 1e3:.0f} / v1 {v1.metrics.tpot_mean_s * 1e3:.0f} ms")
        if acc == "l40s":
            add(title, f"{acc} wildchat: TTFT change (EB lower)", -1.0,
                change(eb.metrics.ttft_mean_s, v1.metrics.ttft_mean_s), kind="sign", note=latency)
            add(title, f"{acc} wildchat: TPOT change (EB lower)", -1.0,
                change(eb.metrics.tpot_mean_s, v1.metrics.tpot_mean_s), kind="sign",
                note=f"{latency}; EB {step_profile(eb)}; v1 {step_profile(v1)}")
        else:
            add(title, f"{acc} wildchat: TTFT change (comparable)", 0.0,
                change(eb.metrics.ttft_mean_s, v1.metrics.ttft_mean_s), note=latency)
            add(title, f"{acc} wildchat: TPOT change (comparable)", 0.0,
                change(eb.metrics.tpot_mean_s, v1.metrics.tpot_mean_s),
                note=f"{latency}; EB {step_profile(eb)}; v1 {step_profile(v1)}")
    footnote(title, "the paper's L40S figures exceed its RTX PRO 6000 ones on the same workload (14.70 vs 14.19 "
                    "req/s for EB(k̂*)) although the L40S has half the bandwidth and a third of the KV cache; no "
                    "one model of the two cards gives both")
    print_rows(title)


LONG_CONTEXT_TOKENS = 131_072  # Qwen3 with YaRN (4 × its native 32,768), which a 128K input needs
LONG_OUTPUT_TOKENS = 64


def section_table6(cycles: int) -> None:
    title = "table6"
    print(f"\n[{title}] [EB] Table 6 — 128K input / 64 output, RTX PRO 6000, B = 8192, the most concurrent "
          f"requests the KV cache holds, {cycles} rounds of them")
    shape = LengthShape("long-context-128k", FixedLengths(LONG_CONTEXT_TOKENS - LONG_OUTPUT_TOKENS),
                        FixedLengths(LONG_OUTPUT_TOKENS), "[EB] Table 6: 128K input, 64 output tokens")
    for name in ("rtx-pro-6000-qwen3-8b", "rtx-pro-6000-qwen3-30b-a3b"):
        base = get_profile(name)
        profile = replace(base, shape=replace(base.shape, max_model_len_tokens=LONG_CONTEXT_TOKENS))
        concurrency = profile.shape.kv_capacity_tokens // LONG_CONTEXT_TOKENS
        workload = closed_loop(shape, concurrency=concurrency, num_requests=cycles * concurrency)
        v1 = run(workload, "v1", profile, steps=True)
        eb = run(workload, "eb-kstar", profile, steps=True)
        gain = change(tps(eb), tps(v1))
        note = (f"c = {concurrency} (KV {profile.shape.kv_capacity_tokens} tokens); tok/s EB {tps(eb):.0f} / "
                f"v1 {tps(v1):.0f}")
        if concurrency == 1:
            note += "; one request at a time: EB and v1 run the same steps"
        elif gain < TABLE6_RANGE[0]:
            # What v1's mixed steps would have to cost more per decode token for EB to gain the range's low end.
            tokens = tps(v1) * v1.metrics.makespan_s
            extra_s = ((1.0 + TABLE6_RANGE[0] / 100.0) / tps(eb) - 1.0 / tps(v1)) * tokens / mixed_decode_tokens(v1)
            note += (f"; {decode_split(eb, v1)}; EB gains {TABLE6_RANGE[0]:+.1f}% if each decode in v1's mixed "
                     f"steps costs {extra_s * 1e3:.0f} ms more (the twin's κ·P·D/(P + D) does not grow with context)")
        add(title, f"{name}: EB/v1 tok/s at 128K / 64", TABLE6_RANGE[0], gain, kind="range",
            paper_high=TABLE6_RANGE[1], note=note)
    print_rows(title)


def section_kernel() -> None:
    title = "kernel"
    print(f"\n[{title}] [EB] §1 / [EB] App. A.1 — step-level shape of the cost (roofline, no run)")
    for name, paper in (("rtx-pro-6000-qwen3-8b", 20.0), ("h200-qwen3-8b", 80.0)):
        r = mixed_crossover_ratio(RooflineStepModel(get_profile(name).roofline))
        add(title, f"{name.split('-qwen')[0]}: mixed > decode marginal cost above r (%)", paper, r * 100.0,
            note="calibration target (κ is set from it); paper: Qwen3-4B, ctx 16, [EB] App. A.2: same for Qwen3-8B")
    for name in ("l40s-qwen3-8b", "b300-qwen3-8b"):
        r = mixed_crossover_ratio(RooflineStepModel(get_profile(name).roofline))
        add(title, f"{name.split('-qwen')[0]}: mixed > decode marginal cost above r (%)", None, r * 100.0,
            note="not published; κ transferred (bandwidth-scaled)")
    for name in ("rtx-pro-6000-qwen3-8b", "rtx-pro-6000-qwen3-30b-a3b"):
        profile = get_profile(name)
        for top, paper in ((8192, 98.6), (16384, 97.9), (131072, 94.3)):
            value = prefill_r2(profile, top) * 100.0
            add(title, f"{name}: linear prefill R² ×100 up to {top} tokens (≥)", paper, value, kind="min",
                note="paper: every model at or above the bound ([EB] Tables 5 and 7)")
    print_rows(title)


SCHEDULER_NAMES = {"mbt:2048": "MBT 2k", "mbt:16384": "MBT 16k", "ppas:16384:2048": "P-PAS"}


def section_ppas(seeds: int, quick: bool) -> None:
    title = "ppas"
    profile = get_profile("rtx-5090-qwen2.5-3b")
    print(f"\n[{title}] P-PAS paper — Qwen2.5-3B / RTX 5090, 25k prompts / 32 outputs, 10 s phases, steady 0.2 "
          f"req/s, {seeds} seeds (B_max 16k, B_cap 2k, N_th 2)")
    shape = DATASET_SHAPES["ppas-long-context"]
    rates = tuple(PPAS_TABLE9)
    per_seed = {s: {r: ppas_runs(shape, r, s, profile, seeds) for r in rates} for s in SCHEDULER_NAMES}
    means = {s: {r: {k: float(v.mean()) for k, v in per_seed[s][r].items()} for r in rates}
             for s in SCHEDULER_NAMES}
    for metric, (vs_2k, vs_16k) in PPAS_TABLE1.items():
        for name, baseline, paper in (("2k", "mbt:2048", vs_2k), ("16k", "mbt:16384", vs_16k)):
            add(title, f"[PPAS] Table 1 {metric}: P-PAS improvement vs MBT {name}", paper,
                improvement(means, rates, metric, baseline),
                note=improvement_sampling_note(per_seed, rates, metric, baseline, paper))
    for name, baseline, paper in (("2k", "mbt:2048", 12.2), ("16k", "mbt:16384", 9.0)):
        add(title, f"[PPAS] Table 2 Qwen2.5-3B avg latency vs MBT {name} (0.4, 1.0)", paper,
            improvement(means, (0.4, 1.0), "avg latency", baseline),
            note=improvement_sampling_note(per_seed, (0.4, 1.0), "avg latency", baseline, paper))
    explained, off_rows = 0, 0
    for rate, by_scheduler in PPAS_TABLE9.items():
        for scheduler, values in by_scheduler.items():
            twin = means[scheduler][rate]
            for (metric, _), paper in zip(PPAS_METRICS.items(), values, strict=True):
                unit = "s/tok" if metric == "avg TPOT" else "s"
                note, within = paper_sampling_note(per_seed[scheduler][rate][metric], paper)
                row = add(title, f"[PPAS] Table 9 λ={rate} {SCHEDULER_NAMES[scheduler]} {metric}", paper, twin[metric],
                          kind="abs", unit=unit, note=note)
                if not row.ok:
                    off_rows += 1
                    explained += int(within)
    footnote(title, f"[PPAS] Table 9: {explained} of the {off_rows} rows off by more than 5% have the paper's value "
                    f"within two standard errors of a {PAPER_SEEDS}-seed mean of the twin's own traces ({seeds} seeds; "
                    f"the paper's realized traces are not published), i.e. within what drawing five traces moves a "
                    f"mean; the rest name their distance in the note")
    counts = [materialized_requests(shape, rate, seeds) for rate in rates]
    footnote(title, "calibration targets: the two λ = 0.4 TTFT rows (MBT 2k and 16k) set the profile's prefill "
                    "efficiency and prefill-step overhead (calibrate.py); every other row is a check")
    footnote(title, "requests per trace in the twin (mean of the seeds) by burst rate: "
                    + ", ".join(f"{r}: {c:.1f}" for r, c in zip(rates, counts, strict=True))
                    + "; the paper's realized traces are not published, and at these sizes one request more or less "
                      "in a burst moves the mean latency by several percent")
    if not quick:
        for scheduler, (e2e, p95, makespan) in PPAS_TABLE10.items():
            values = ppas_runs(shape, 1.6, scheduler, profile, seeds)
            for metric, paper in (("avg latency", e2e), ("p95 latency", p95), ("makespan", makespan)):
                add(title, f"[PPAS] Table 10 λ=1.6 {SCHEDULER_NAMES[scheduler]} {metric}", paper,
                    float(values[metric].mean()), kind="abs", unit="s",
                    note=paper_sampling_note(values[metric], paper)[0])
        for (prompt, output), papers in PPAS_TABLE3.items():
            variant = LengthShape(f"ppas-{prompt}-{output}", FixedLengths(prompt), FixedLengths(output),
                                  "[PPAS] Table 3")
            sub_seeds = {s: {r: ppas_runs(variant, r, s, profile, seeds) for r in (0.8, 1.2)} for s in SCHEDULER_NAMES}
            sub = {s: {r: {k: float(v.mean()) for k, v in by_rate.items()} for r, by_rate in by_seed.items()}
                   for s, by_seed in sub_seeds.items()}
            labels = ("avg vs 2k", "p95 vs 2k", "avg vs 16k", "p95 vs 16k")
            metrics = ("avg latency", "p95 latency", "avg latency", "p95 latency")
            baselines = ("mbt:2048", "mbt:2048", "mbt:16384", "mbt:16384")
            for label, metric, baseline, paper in zip(labels, metrics, baselines, papers, strict=True):
                add(title, f"[PPAS] Table 3 {prompt // 1000}k/{output}: P-PAS {label}", paper,
                    improvement(sub, (0.8, 1.2), metric, baseline),
                    note=improvement_sampling_note(sub_seeds, (0.8, 1.2), metric, baseline, paper))
    print_rows(title)


SECTIONS = ("kernel", "table2", "table3", "oracle", "table4", "table6", "ppas")
# --smoke: (requests, NuminaMath requests, table3's c = 32 requests, table6 rounds, P-PAS seeds), as --quick otherwise
SMOKE = (40, 40, 40, 1, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and seeds")
    parser.add_argument("--smoke", action="store_true",
                        help="--quick with {} requests ({} NuminaMath, {} at c = 32), {} table6 round(s), {} P-PAS "
                             "seeds: every section's code in seconds".format(*SMOKE))
    parser.add_argument("--section", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)}")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.section.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    args.quick = args.quick or args.smoke
    requests = 500 if args.quick else 4000
    long_requests, small_requests, cycles, ppas_seeds = (300 if args.quick else 4000), 300, (4 if args.quick else 16), \
        (4 if args.quick else 40)
    if args.smoke:
        requests, long_requests, small_requests, cycles, ppas_seeds = SMOKE
    started = time.perf_counter()
    print("The twin vs the papers ('diff': points for changes, relative % for absolute values)")
    actions = {
        "kernel": section_kernel,
        "table2": lambda: section_table2(requests, long_requests),
        "table3": lambda: section_table3(requests, args.quick, small_requests),
        "oracle": lambda: section_oracle(requests),
        "table4": lambda: section_table4(requests),
        "table6": lambda: section_table6(cycles),
        "ppas": lambda: section_ppas(ppas_seeds, args.quick),
    }
    for section in SECTIONS:
        if section in chosen:
            t0 = time.perf_counter()
            actions[section]()
            print(f"   ({section}: {time.perf_counter() - t0:.0f} s)")
    summary()
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
