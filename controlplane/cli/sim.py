"""`controlplane sim`: the digital twin (controlplane/sim) from the command line.

  controlplane sim run --scenario closed:balanced:c=2048 --scheduler v1 --scheduler eb-kstar --out sim-out
  controlplane sim sweep --scenario bursty:ppas-long-context:burst=0.4 --scenario bursty:ppas-long-context:burst=1.0 \
      --scheduler mbt:2048 --scheduler mbt:16384 --scheduler ppas:16384:2048 --profile rtx-5090-qwen2.5-3b --seeds 5
  controlplane sim fit-profile --steps steps.jsonl --name cpu-tiny --max-num-seqs 64 --out cpu-tiny.json
  controlplane sim profiles

`run` runs every scheduler on one scenario; `sweep` runs the cross product of scenarios × schedulers × seeds.
Sizes: --requests N (a closed-loop scenario's requests), --duration-s S (an open-loop scenario's simulated
seconds) and --max-num-seqs N (the simulated engine's batch limit) override the scenario's and the profile's.
Both print a table and, with --out DIR, write DIR/table.csv, DIR/table.txt, DIR/throughput_latency.png and
one DIR/timeline_<scenario>_<scheduler>_<seed>.png per run (mode, k, N, budget over time); `run` with
--steps-out FILE also writes the first run's steps as JSON lines (the format fit-profile reads).
Scenario and scheduler spellings: see controlplane/sim/scenarios.py and controlplane/sim/schedulers.py.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import replace
from pathlib import Path

from controlplane.sim.fit import fit_profile, read_steps, steps_to_jsonl
from controlplane.sim.fit_check import check_profile_fit, describe_fit
from controlplane.sim.plots import plot_throughput_latency, plot_timeline
from controlplane.sim.profiles import PROFILES, EngineShape, SimProfile, get_profile, load_profile, profile_to_json
from controlplane.sim.report import csv_table, text_table
from controlplane.sim.runner import RunResult, run_scenario
from controlplane.sim.scenarios import DEFAULT_NUM_REQUESTS, parse_scenario, resize
from controlplane.sim.schedulers import parse_scheduler


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("sim", help="the digital twin: run scenarios, sweep, fit profiles",
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="sim_command", required=True, metavar="SIM_COMMAND")
    for name, help_text in (("run", "one scenario under one or more schedulers"),
                            ("sweep", "scenarios × schedulers × seeds")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--scenario", action="append", required=True,
                       help="scenario spelling (repeat for sweep): closed:SHAPE:c=C[:n=N], "
                            "poisson:SHAPE:rate=R:for=S, bursty:SHAPE:burst=R, dist-shift, conc-shift; "
                            "e.g. closed:balanced:c=2048")
        p.add_argument("--scheduler", action="append", required=True,
                       help="v1, v0, eb:K[:N], eb-kstar, eb+[:DELTA], mbt:B, ppas:BMAX:BCAP[:NTH], ppas+:... "
                            "(repeatable; @n=<max_num_seqs>, @b=<budget> override the profile)")
        p.add_argument("--profile", default="rtx-pro-6000-qwen3-8b",
                       help=f"shipped profile ({', '.join(PROFILES)}); default rtx-pro-6000-qwen3-8b")
        p.add_argument("--profile-file", type=Path,
                       help="a profile JSON file (e.g. from fit-profile); wins over --profile")
        p.add_argument("--requests", type=int, metavar="N",
                       help=f"closed-loop scenarios: N requests in all, spread over their phases (default: the "
                            f"spelling's n=, else {DEFAULT_NUM_REQUESTS}; a shift scenario's own phase sizes)")
        p.add_argument("--duration-s", type=float, metavar="S",
                       help="open-loop scenarios (poisson, bursty): S simulated seconds in all, phases scaled in "
                            "proportion (default: the spelling's for=; bursty: 5 phases of 10 s)")
        p.add_argument("--max-num-seqs", type=int, metavar="N",
                       help="the simulated engine's max_num_seqs for every scheduler without its own @n= "
                            "(default: the profile's)")
        p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
        p.add_argument("--seeds", type=int, default=1, help="number of seeds from --seed (default 1)")
        p.add_argument("--out", type=Path, help="directory for table.csv, table.txt and the PNG plots")
        p.add_argument("--no-plots", action="store_true", help="write no PNG")
        if name == "run":
            p.add_argument("--steps-out", type=Path, help="write the first run's steps as JSON lines")
        p.set_defaults(run=_run)
    fit = sub.add_parser("fit-profile", help="fit a profile from recorded step telemetry (JSON lines)")
    fit.add_argument("--steps", type=Path, required=True,
                     help="JSON lines {prefill_tokens, decode_tokens, decode_requests, duration_s} per step")
    fit.add_argument("--name", required=True, help="profile name")
    fit.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    defaults = EngineShape()
    fit.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    fit.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    fit.add_argument("--kv-capacity-tokens", type=int, default=defaults.kv_capacity_tokens)
    fit.add_argument("--block-size-tokens", type=int, default=defaults.block_size_tokens)
    fit.add_argument("--max-model-len-tokens", type=int, default=defaults.max_model_len_tokens)
    fit.set_defaults(run=_fit)
    listing = sub.add_parser("profiles", help="list the shipped profiles")
    listing.set_defaults(run=_profiles)


def _profile(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SimProfile:
    try:
        if args.profile_file is not None:
            return load_profile(args.profile_file)
        return get_profile(args.profile)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")[:60]


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.sim_command == "run" and len(args.scenario) != 1:
        parser.error("run takes one --scenario; use sweep for several")
    if args.seeds < 1:
        parser.error(f"--seeds must be ≥ 1, got {args.seeds}")
    profile = _profile(args, parser)
    for flag, value in (("--requests", args.requests), ("--max-num-seqs", args.max_num_seqs)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be ≥ 1, got {value}")
    try:
        limit = profile.shape.max_model_len_tokens
        workloads = [resize(parse_scenario(s, max_model_len_tokens=limit, profile_name=profile.name),
                            num_requests=args.requests, duration_s=args.duration_s) for s in args.scenario]
        schedulers = [parse_scheduler(s) for s in args.scheduler]
    except ValueError as exc:
        parser.error(str(exc))
    if args.max_num_seqs is not None:
        schedulers = [s if s.max_num_seqs else replace(s, max_num_seqs=args.max_num_seqs) for s in schedulers]
    results: list[RunResult] = []
    for workload in workloads:
        for scheduler in schedulers:
            for seed in range(args.seed, args.seed + args.seeds):
                try:
                    results.append(run_scenario(workload, scheduler, profile, seed=seed))
                except ValueError as exc:
                    parser.error(f"{scheduler.name} on {workload.name}: {exc}")
    table = text_table(results)
    print(f"profile {profile.name}: {profile.source}")
    print(table)
    steps_out = getattr(args, "steps_out", None)
    if steps_out is not None and results:
        steps_out.write_text(steps_to_jsonl(results[0].steps))
        print(f"steps of {results[0].scheduler} written to {steps_out}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "table.txt").write_text(table + "\n")
        (args.out / "table.csv").write_text(csv_table(results))
        if not args.no_plots:
            plot_throughput_latency(results, args.out / "throughput_latency.png", title=f"twin on {profile.name}")
            for result in results:
                name = f"timeline_{_slug(result.scenario)}_{_slug(result.scheduler)}_{result.seed}.png"
                plot_timeline(result, args.out / name)
        print(f"results written to {args.out}")
    return 0


def _fit(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        shape = EngineShape(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                            kv_capacity_tokens=args.kv_capacity_tokens, block_size_tokens=args.block_size_tokens,
                            max_model_len_tokens=args.max_model_len_tokens)
        steps = read_steps(args.steps)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    result = fit_profile(steps, name=args.name, shape=shape, source=f"fitted from {args.steps.name}")
    check = check_profile_fit(result, steps)
    print("\n".join(describe_fit(result, check)))
    if result.profile is None or check.problems:
        print(f"no profile written from {args.steps}")
        return 1
    if result.fit.mixed is None:
        print("note: no mixed steps; α_MB = α_p and the MB coefficients are 0 (no interference term)")
    args.out.write_text(json.dumps(profile_to_json(result.profile), indent=2) + "\n")
    print(f"profile {args.name} ({result.num_steps} steps, {result.num_rejected} rejected) written to {args.out}")
    return 0


def _profiles(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    for profile in PROFILES.values():
        c = profile.costs
        print(f"{profile.name:<24} α_p {c.alpha_p_s:.3e} β_p {c.beta_p_s_per_token:.3e} α_d {c.alpha_d_s:.3e} "
              f"β_d {c.beta_d_s_per_request:.3e} N {profile.shape.max_num_seqs} "
              f"B {profile.shape.max_num_batched_tokens} KV {profile.shape.kv_capacity_tokens}  ({profile.source})")
    return 0
