"""A pool of synthetic engines driven through the fleet state machine (`controlplane.loop.fleet.FleetState`)
second by second, as the controller would feed it: for the judging and poisoning tests and
`benchmarks/attack_soak.py`.

Each engine serves a `Workload`: per second a batch of `per_second` completions (geometric outputs of mean
`output_mean_tokens`, prompts uniform in [0.5, 1.5] × `prompt_mean_tokens`, admitted up to 8 s before) with
300 running requests of geometric ages. An engine's random stream depends on its id and the seed only, so
the honest engines send exactly the same data whether or not attackers are present: a difference in their
decisions is the attackers' doing.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, replace

import numpy as np

from controlplane.core.types import EngineLimits, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import FleetState
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.protocol import pool_key_of
from controlplane.sim.profiles import H200_QWEN3_8B

MODEL, ACCELERATOR = "Qwen/Qwen3-8B", "NVIDIA H200"
POOL_KEY = pool_key_of(MODEL, ACCELERATOR)
# A KV capacity that binds N (about 250 slots for 512-token prompts), so prompt lengths move N̂*.
LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=16384, kv_capacity_tokens=200_000,
                      max_model_len_tokens=32768)
START_S = 100_000.0
_EMPTY = np.zeros(0)


@dataclass(frozen=True)
class Workload:
    """What one engine serves: mean prompt and output lengths (tokens) and completions per second."""

    prompt_mean_tokens: float = 512.0
    output_mean_tokens: float = 256.0
    per_second: int = 100
    running: int = 300


HONEST = Workload()
LONG_CONTEXT = Workload(prompt_mean_tokens=7000.0, output_mean_tokens=480.0, per_second=40, running=60)


def synthetic_batch(workload: Workload, seq: int, rng: np.random.Generator) -> ValidatedBatch:
    n = workload.per_second
    outputs = rng.geometric(1.0 / workload.output_mean_tokens, n).astype(np.float64)
    prompts = np.rint(rng.uniform(0.5, 1.5, n) * workload.prompt_mean_tokens)
    ages = rng.geometric(1.0 / workload.output_mean_tokens, workload.running)
    lengths, counts = np.unique(ages, return_counts=True)
    return ValidatedBatch(
        seq=seq, prompt_tokens=prompts, output_tokens=outputs, prefill_tokens=_EMPTY, decode_tokens=_EMPTY,
        decode_requests=_EMPTY, duration_s=_EMPTY, num_aborted=0, num_dropped=0, kv_used_tokens=100_000,
        kv_total_tokens=LIMITS.kv_capacity_tokens, num_running=workload.running, num_waiting=20, num_preemptions=0,
        num_events_dropped=0, traceparent="", running_lengths=lengths.astype(np.int64),
        running_counts=counts.astype(np.int64), admitted_age_s=rng.uniform(0.0, 8.0, n),
        running_admitted_age_s=np.full(lengths.size, 4.0))


@dataclass(frozen=True)
class Outcome:
    """Each engine's decision in force at the end (N, k) and whether it was kept out of its pool."""

    n: dict[str, int]
    k: dict[str, int]
    excluded: dict[str, bool]
    reasons: dict[str, str]  # the decision's reason and flags
    modes: dict[str, int]  # common_pb2.Mode
    memberships: list[tuple[int, str, bool]]  # (second, engine, kept out) for every membership change


def attach_engines(fleet: FleetState, engine_ids: list[str], now_s: float, *, limits: EngineLimits = LIMITS,
                   model: str = MODEL, accelerator: str = ACCELERATOR) -> dict[str, object]:
    """Attach the engines (vLLM 0.32, one identity) and push each its first decision; their streams by id."""
    streams = {e: object() for e in engine_ids}
    for engine_id in engine_ids:
        hello = EngineHello(engine_id=engine_id, model=model, accelerator=accelerator, vllm_version="0.32.0",
                            agent_version="drive", limits=limits, block_size_tokens=16)
        fleet.attach(hello, identity="drive", epoch=1, stream=streams[engine_id], now_s=now_s)
        fleet.first_decision(engine_id, streams[engine_id], now_s)
    return streams


def drive(engines: dict[str, Workload], *, seconds: int = 60, seed: int = 0,
          shift: tuple[int, dict[str, Workload]] | None = None) -> Outcome:
    """Run the engines (id → workload) of one pool through a FleetState for `seconds` simulated seconds;
    `shift` (second, id → workload): from that second those engines serve the new workloads."""
    loop = DecisionLoopConfig(recompute_completions=1_000_000, interval_s=2.0, ttl_s=60.0)
    fleet = FleetState(loop, PolicyConfig(min_samples=400, cooldown_s=0.0), replica_id="drive")
    fleet.set_calibration(POOL_KEY, H200_QWEN3_8B, START_S, refresh=False)
    rngs = {e: np.random.default_rng([seed, zlib.crc32(e.encode())]) for e in engines}
    streams = attach_engines(fleet, list(engines), START_S)
    memberships: list[tuple[int, str, bool]] = []
    for t in range(1, seconds + 1):
        now_s = START_S + t
        fleet.close_bucket(POOL_KEY, now_s)
        if fleet.refresh_due(POOL_KEY, now_s) is not None:
            fleet.refresh_pool(POOL_KEY, now_s)
        for engine_id, workload in engines.items():
            if shift is not None and t >= shift[0]:
                workload = shift[1].get(engine_id, workload)
            effects = fleet.batch(engine_id, streams[engine_id], synthetic_batch(workload, t, rngs[engine_id]), now_s)
            memberships += [(t, m.engine_id, m.verdict.excluded) for m in effects.memberships]
        fleet.tick(now_s)
    records = {e: fleet.engine(e) for e in engines}
    last = {e: r.loop.current for e, r in records.items()}
    return Outcome(reasons={e: f"{d.reason} {sorted(d.flags)}" for e, d in last.items()},
                   modes={e: d.mode for e, d in last.items()}, memberships=memberships,
                   n={e: r.loop.current.n for e, r in records.items()},
                   k={e: r.loop.current.k for e, r in records.items()},
                   excluded={e: r.loop.excluded_from_pool for e, r in records.items()})


def run_rates(fleet: FleetState, streams: dict[str, object], first_s: int, last_s: int, rates: dict[int, float],
              rng: np.random.Generator, events: list) -> None:
    """Seconds first_s..last_s of `streams`' engines (the pool POOL_KEY): each second the pool's bucket closes and
    it is refreshed when due, then every engine sends a batch whose steps deliver the output tokens per busy
    second `rates` gives for the mode it runs (5% noise), then the fleet ticks; rollout events go to `events`
    as (second, event)."""
    for t in range(first_s, last_s + 1):
        now_s = START_S + t
        fleet.close_bucket(POOL_KEY, now_s)
        if fleet.refresh_due(POOL_KEY, now_s) is not None:
            fleet.refresh_pool(POOL_KEY, now_s)
        for engine_id, stream in streams.items():
            mode = fleet.engine(engine_id).loop.current.mode
            busy_s = np.full(10, 0.08)
            decode = rates[mode] * busy_s * (1 + 0.05 * rng.standard_normal(10))
            batch = replace(synthetic_batch(HONEST, t, rng), prefill_tokens=np.zeros(10), decode_tokens=decode,
                            decode_requests=np.full(10, 200.0), duration_s=busy_s)
            events += [(t, e) for e in fleet.batch(engine_id, stream, batch, now_s).rollouts]
        events += [(t, e) for e in fleet.tick(now_s).rollouts]


def worst_change(outcome: Outcome, baseline: Outcome, engine_ids: list[str]) -> tuple[float, float]:
    """The largest relative change of N and of k over engine_ids, against the baseline run."""
    dn = max(abs(outcome.n[e] - baseline.n[e]) / baseline.n[e] for e in engine_ids)
    dk = max(abs(outcome.k[e] - baseline.k[e]) / baseline.k[e] for e in engine_ids)
    return dn, dk
