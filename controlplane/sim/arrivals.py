"""Workloads of the twin: phases of request lengths and how requests arrive.

A `Workload` is a sequence of `Phase`s. Each phase draws lengths from a `LengthShape` and is either
- closed loop: `num_requests` requests issued while fewer than `concurrency` are in the system (a new one
  the moment one finishes; the EB paper's saturated regime and its concurrency shift), or
- open loop: Poisson arrivals at `rate_per_s` for `duration_s` seconds (the P-PAS bursty trace is five
  10 s phases alternating a steady 0.2 req/s with a burst rate).
All phases of one workload are of the same kind. `materialize` draws every request up front from one seed
(lengths and arrival times from independent streams), so each scheduler sees the same realized trace.

Pure: numpy generators owned here, no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.sim.lengths import LengthShape


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of a workload (closed: num_requests and concurrency; open: rate_per_s and duration_s)."""

    shape: LengthShape
    num_requests: int = 0
    concurrency: int = 0
    rate_per_s: float = 0.0
    duration_s: float = 0.0

    @property
    def is_closed(self) -> bool:
        return self.concurrency > 0


@dataclass(frozen=True, slots=True)
class Workload:
    """A named sequence of phases, all closed-loop or all open-loop."""

    name: str
    phases: tuple[Phase, ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError(f"workload {self.name}: at least one phase is needed")
        closed = {p.is_closed for p in self.phases}
        if len(closed) != 1:
            raise ValueError(f"workload {self.name}: mixes closed-loop and open-loop phases")
        for p in self.phases:
            if p.is_closed and p.num_requests < 1:
                raise ValueError(f"workload {self.name}: a closed-loop phase needs num_requests ≥ 1")
            if not p.is_closed and not (math.isfinite(p.rate_per_s) and p.rate_per_s >= 0.0
                                        and math.isfinite(p.duration_s) and p.duration_s > 0.0):
                raise ValueError(f"workload {self.name}: an open-loop phase needs rate ≥ 0 and duration > 0")

    @property
    def is_closed(self) -> bool:
        return self.phases[0].is_closed


@dataclass(frozen=True, eq=False)
class RequestTrace:
    """Every request of one realized workload, in issue order.

    prompt_tokens / output_tokens: lengths. arrival_s: open loop only (closed loop: NaN, the runner sets the
    arrival when it issues the request). concurrency: closed loop only, the cap in force when request i is
    issued (0 for open loop). cached_prompt_tokens: the leading prompt tokens shared with a previous turn
    (the shape's shared prefix; 0 when it has none), which the engine serves from its prefix cache.
    """

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray
    concurrency: np.ndarray
    cached_prompt_tokens: np.ndarray | None = None

    @property
    def num_requests(self) -> int:
        return int(self.prompt_tokens.size)


def closed_loop(shape: LengthShape, *, concurrency: int, num_requests: int, name: str = "") -> Workload:
    """One closed-loop phase."""
    return Workload(name or f"{shape.name}/closed:{concurrency}/n:{num_requests}",
                    (Phase(shape, num_requests=num_requests, concurrency=concurrency),))


def poisson(shape: LengthShape, *, rate_per_s: float, duration_s: float, name: str = "") -> Workload:
    """One open-loop Poisson phase."""
    return Workload(name or f"{shape.name}/poisson:{rate_per_s:g}/for:{duration_s:g}s",
                    (Phase(shape, rate_per_s=rate_per_s, duration_s=duration_s),))


def bursty(shape: LengthShape, *, burst_rate_per_s: float, steady_rate_per_s: float = 0.2,
           phase_s: float = 10.0, num_phases: int = 5) -> Workload:
    """The P-PAS trace ([PPAS] §4.1): `num_phases` phases of `phase_s` seconds, steady first, alternating with
    bursts."""
    phases = tuple(Phase(shape, rate_per_s=burst_rate_per_s if i % 2 else steady_rate_per_s, duration_s=phase_s)
                   for i in range(num_phases))
    return Workload(f"{shape.name}/bursty:{burst_rate_per_s:g}", phases)


def materialize(workload: Workload, *, seed: int) -> RequestTrace:
    """Draw every request of `workload` (deterministic in `seed`)."""
    length_seed, arrival_seed = np.random.SeedSequence(seed).spawn(2)
    lengths_rng = np.random.default_rng(length_seed)
    arrivals_rng = np.random.default_rng(arrival_seed)
    prompts, outputs, arrivals, caps, cached = [], [], [], [], []
    start_s = 0.0
    for phase in workload.phases:
        if phase.is_closed:
            count = phase.num_requests
            arrivals.append(np.full(count, np.nan))
            caps.append(np.full(count, phase.concurrency, dtype=np.int64))
        else:
            times = []
            t = start_s
            end = start_s + phase.duration_s
            if phase.rate_per_s > 0.0:
                while True:
                    t += float(arrivals_rng.exponential(1.0 / phase.rate_per_s))
                    if t >= end:
                        break
                    times.append(t)
            count = len(times)
            arrivals.append(np.asarray(times, dtype=np.float64))
            caps.append(np.zeros(count, dtype=np.int64))
            start_s = end
        prompt = phase.shape.prompt.sample(lengths_rng, count)
        outputs.append(phase.shape.output.sample(lengths_rng, count))
        prefix = getattr(phase.shape, "shared_prefix", None)
        shared = prefix.sample(lengths_rng, count) if prefix is not None else np.zeros(count, dtype=np.int64)
        prompts.append(prompt + shared)
        cached.append(shared)
    return RequestTrace(np.concatenate(prompts), np.concatenate(outputs), np.concatenate(arrivals),
                        np.concatenate(caps), np.concatenate(cached))
