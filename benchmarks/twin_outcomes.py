"""A wrong model against measured outcomes: a pool of twin engines decided by the fleet state machine under a
stale calibration, with and without guarded rollouts, beside each static mode.

    .venv/bin/python benchmarks/twin_outcomes.py                    # 4 stale calibrations, 4 engines, 10 min
    .venv/bin/python benchmarks/twin_outcomes.py --minutes 30 --engines 10 --stationary-runs 20
    .venv/bin/python benchmarks/twin_outcomes.py --smoke            # 2 engines, 2 simulated minutes
    .venv/bin/python benchmarks/twin_outcomes.py --prompt-tokens 2000 --factors prefill:1   # wrong from the start

Each run is `--engines` twin engines (`controlplane.sim.engine.SimEngine`, the profile's step times as the
truth) in one pool, each a closed loop of `--concurrency` requests (prompts uniform on 0.5–1.5× 512 tokens,
geometric outputs of mean 256), all driven by one `FleetState` in simulated time: every simulated second each
engine's completions and steps go to `FleetState.batch` as the agent would send them, the pool is refreshed
when due, `FleetState.tick` runs (rollout verdicts), and every decision pushed is applied to its engine's
enforcer. The pool calibration (which takes precedence over the online fit) is the profile's own (the truth)
until --switch-s, then the profile's with its prefill or decode slope scaled by --factors: a stale model put
in a running pool. Printed per case: the pool's output tokens per second from --switch-s to the end under MB
alone, EB alone, EB+ without the guard and EB+ with it; the guard's and the unguarded loop's throughput against
the better static mode; and each rollout's start and verdict (a challenge of the pool's established mode, which
the guard starts though the model asks for nothing, says so). A stale model that still picks the better mode
makes no change, but a challenge still tests it. `--stationary-runs` keeps the true calibration throughout (a
correct model) with other seeds and counts the rollbacks of changes it asked for, and the challenges promoted.

The second kind of wrong model: the profile's step times carry costs its linear calibration cannot represent
(attention over the context, which the roofline profiles model); with `--prompt-tokens 2000` and the profile's
own calibration throughout (`--factors prefill:1`), the model picks MB where EB delivers more, from the start.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from controlplane.api.v1 import operator_pb2
from controlplane.core.types import CostModel, EngineLimits, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import FleetState
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.protocol import pool_key_of
from controlplane.sim.engine import SimEngine
from controlplane.sim.profiles import SimProfile, get_profile
from controlplane.sim.schedulers import parse_scheduler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbench, from a checkout
from testbench.twin_batch import twin_batch

PROMPT_TOKENS = 512
OUTPUT_MEAN_TOKENS = 256
MODEL, ACCELERATOR = "twin", "twin"
POOL_KEY = pool_key_of(MODEL, ACCELERATOR)
_EMPTY = np.zeros(0)


@dataclass
class _Engine:
    engine_id: str
    sim: SimEngine
    stream: object
    prompts: list
    outputs: list
    admitted: list
    steps: list
    next_telemetry_s: float = 1.0
    seq: int = 0
    counted_tokens: float = 0.0


def _stale(costs: CostModel, which: str, factor: float) -> CostModel:
    if which == "prefill":
        return replace(costs, beta_p_s_per_token=costs.beta_p_s_per_token * factor)
    return replace(costs, beta_d_s_per_request=costs.beta_d_s_per_request * factor)


def _requests(rng: np.random.Generator, count: int, prompt_tokens: int = PROMPT_TOKENS) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    prompts = np.rint(rng.uniform(0.5, 1.5, count) * prompt_tokens).astype(np.int64)
    return prompts, rng.geometric(1.0 / OUTPUT_MEAN_TOKENS, count).astype(np.int64)


def run(profile: SimProfile, calibration: CostModel, *, engines: int, concurrency: int, minutes: float, seed: int,
        guard: bool, switch_s: float, pin: str | None = None, prompt_tokens: int = PROMPT_TOKENS) -> tuple[float, list]:
    """The pool's output tokens per simulated second after switch_s (when `calibration` replaces the profile's
    own), and its rollout events (second, event)."""
    rng = np.random.default_rng(seed)
    shape = parse_scheduler("eb+").shape_for(profile)
    shape = replace(shape, max_num_seqs=max(shape.max_num_seqs, concurrency))
    loop = DecisionLoopConfig()
    fleet = FleetState(loop, PolicyConfig(), replica_id="twin-outcomes", guard_rollouts=guard)
    fleet.set_calibration(POOL_KEY, profile.costs, 0.0, refresh=False)
    switched = False
    if pin is not None:
        mode = {"mb": operator_pb2.PINNED_MODE_MB, "eb": operator_pb2.PINNED_MODE_EB}[pin]
        fleet.set_overrides([operator_pb2.OverrideRecord(kind=operator_pb2.OVERRIDE_KIND_PIN, mode=mode, scope=(
            operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)))], 0.0)
    pool: list[_Engine] = []
    for i in range(engines):
        sim = SimEngine(profile, shape=shape, record_steps=False, seed=seed * 1000 + i)
        engine = _Engine(f"e{i}", sim, object(), [], [], [], [])
        limits = EngineLimits(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens,
                              kv_capacity_tokens=sim.kv_total_tokens, max_model_len_tokens=shape.max_model_len_tokens)
        fleet.attach(EngineHello(engine_id=engine.engine_id, model=MODEL, accelerator=ACCELERATOR, vllm_version="",
                                 agent_version="", limits=limits, block_size_tokens=16),
                     identity="twin", epoch=1, stream=engine.stream, now_s=0.0)
        _apply([*pool, engine], fleet.first_decision(engine.engine_id, engine.stream, 0.0), 0.0)
        sim.add_requests(*_requests(rng, concurrency, prompt_tokens), 0.0)
        pool.append(engine)
    events: list = []
    end_s = minutes * 60.0
    next_tick_s = 1.0
    while True:
        engine = min(pool, key=lambda e: e.sim.now_s)
        now_s = engine.sim.now_s
        if now_s >= end_s:
            break
        if not switched and now_s >= switch_s:
            switched = True
            effects = fleet.set_calibration(POOL_KEY, calibration, now_s)
            events += [(round(now_s), e) for e in effects.rollouts]
            _apply(pool, effects, now_s)
        if now_s >= next_tick_s:
            if fleet.refresh_due(POOL_KEY, now_s) is not None:
                fleet.refresh_pool(POOL_KEY, now_s)
            effects = fleet.tick(now_s)
            events += [(round(now_s), e) for e in effects.rollouts]
            _apply(pool, effects, now_s)
            next_tick_s += 1.0
        step = engine.sim.step()
        if step is None:
            raise RuntimeError("a closed-loop engine went idle")
        engine.steps.append((step.prefill_tokens, step.num_decodes, step.duration_s))
        if step.end_s > switch_s:
            engine.counted_tokens += step.num_decodes
        if step.finished.size:
            prompts, outputs = engine.sim.lengths_of(step.finished)
            engine.prompts.append(prompts.astype(np.float64))
            engine.outputs.append(outputs.astype(np.float64))
            engine.admitted.append(engine.sim.admitted_of(step.finished))
            engine.sim.add_requests(*_requests(rng, step.finished.size, prompt_tokens), step.end_s)
        if engine.sim.now_s >= engine.next_telemetry_s:
            effects = fleet.batch(engine.engine_id, engine.stream, _batch(engine), engine.sim.now_s)
            events += [(round(engine.sim.now_s), e) for e in effects.rollouts]
            _apply(pool, effects, engine.sim.now_s)
    return sum(e.counted_tokens for e in pool) / (end_s - switch_s), events


def _batch(engine: _Engine) -> ValidatedBatch:
    engine.next_telemetry_s = max(engine.next_telemetry_s + 1.0, engine.sim.now_s)
    engine.seq += 1
    prompts = np.concatenate(engine.prompts) if engine.prompts else _EMPTY
    outputs = np.concatenate(engine.outputs) if engine.outputs else _EMPTY
    admitted = np.concatenate(engine.admitted) if engine.admitted else _EMPTY
    batch = twin_batch(engine.sim, seq=engine.seq, prompts=prompts, outputs=outputs, admitted_s=admitted,
                       steps=engine.steps)
    for column in (engine.prompts, engine.outputs, engine.admitted, engine.steps):
        column.clear()
    return batch


def _apply(pool: list[_Engine], effects, now_s: float) -> None:
    by_id = {e.engine_id: e for e in pool}
    for push in effects.pushes:
        engine = by_id.get(push.engine_id)
        if engine is not None:
            engine.sim.enforcer.apply(push.decision, now_s=now_s)


def _events_text(events: list) -> str:
    return ", ".join(f"{e.event} {'challenge ' if 'challenge' in e.detail else ''}{e.from_mode}→{e.to_mode} at {t} s"
                     for t, e in events) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="h200-qwen3-8b")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--factors", default="prefill:0.5,prefill:2,decode:0.5,decode:2")
    parser.add_argument("--stationary-runs", type=int, default=3)
    parser.add_argument("--switch-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                        help="mean prompt length (uniform on 0.5–1.5× it); long prompts make the profile's step "
                             "times depart from its linear calibration (attention over the context)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.engines, args.concurrency, args.minutes, args.stationary_runs, args.switch_s = 2, 64, 2.0, 1, 60.0
        args.factors = "prefill:0.5"
    started = time.perf_counter()
    profile = get_profile(args.profile)
    costs = profile.costs
    print(f"{args.engines} engines × {args.concurrency} in flight, {args.minutes:g} simulated minutes, profile "
          f"{profile.name}; the stale calibration from {args.switch_s:.0f} s, throughput counted from then")
    print(f"{'calibration':<18}{'MB tok/s':>10}{'EB tok/s':>10}{'EB+ no guard':>14}{'EB+ guard':>11}"
          f"{'guard/best':>12}{'no guard/best':>15}  rollouts")
    kw = dict(engines=args.engines, concurrency=args.concurrency, minutes=args.minutes, seed=args.seed,
              switch_s=args.switch_s, prompt_tokens=args.prompt_tokens)
    for spec in args.factors.split(","):
        which, factor = spec.split(":")
        stale = _stale(costs, which, float(factor))
        mb, _ = run(profile, stale, guard=False, pin="mb", **kw)
        eb, _ = run(profile, stale, guard=False, pin="eb", **kw)
        free, _ = run(profile, stale, guard=False, **kw)
        guarded, events = run(profile, stale, guard=True, **kw)
        best = max(mb, eb)
        print(f"{which + ' ×' + factor:<18}{mb:>10.0f}{eb:>10.0f}{free:>14.0f}{guarded:>11.0f}"
              f"{guarded / best:>12.3f}{free / best:>15.3f}  {_events_text(events)}")
    rollbacks = promoted_challenges = 0
    for run_index in range(args.stationary_runs):
        _, events = run(profile, costs, guard=True, **{**kw, "seed": args.seed + 100 + run_index})
        rollbacks += sum(e.event == "rolled_back" and "challenge" not in e.detail for _, e in events)
        promoted_challenges += sum(e.event == "promoted" and "challenge" in e.detail for _, e in events)
        print(f"stationary run {run_index}: {_events_text(events)}")
    print(f"rollbacks of a change the correct model asked for in {args.stationary_runs} stationary runs: {rollbacks}; "
          f"challenges of its mode promoted: {promoted_challenges}")
    print(f"wall {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
