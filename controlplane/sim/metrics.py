"""Run metrics of the twin, from per-request times.

Throughput counts prompt and output tokens ("TP in tok/s", [EB] Table 3 caption); output tokens/s is reported too.
TTFT = first token − arrival; TPOT = (finish − first token) / (output − 1) over requests with > 1 output token;
E2E = finish − arrival; makespan = last finish − first arrival. Means and p95 are over completed requests.
Pure functions; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Summary of one run. Times in seconds (TPOT in seconds per token), throughput per second."""

    num_requests: int
    num_completed: int
    makespan_s: float
    throughput_tokens_per_s: float
    output_tokens_per_s: float
    requests_per_s: float
    ttft_mean_s: float
    ttft_p95_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    e2e_mean_s: float
    e2e_p95_s: float
    num_preemptions: int = 0
    num_steps: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else math.nan


def _p95(x: np.ndarray) -> float:
    return float(np.percentile(x, 95)) if x.size else math.nan


def summarize(requests: dict[str, np.ndarray], *, num_preemptions: int = 0, num_steps: int = 0) -> RunMetrics:
    """Metrics of the requests in `requests` (the columns of `SimEngine.request_arrays`)."""
    finish = requests["finish_s"]
    done = np.isfinite(finish)
    arrival = requests["arrival_s"]
    first = requests["first_token_s"][done]
    outputs = requests["output_tokens"][done]
    prompts = requests["prompt_tokens"][done]
    finish_done = finish[done]
    arrival_done = arrival[done]
    makespan = float(finish_done.max() - np.nanmin(arrival)) if done.any() else math.nan
    ttft = first - arrival_done
    e2e = finish_done - arrival_done
    multi = outputs > 1
    tpot = (finish_done[multi] - first[multi]) / (outputs[multi] - 1)
    rate = (lambda amount: amount / makespan) if makespan and makespan > 0 else (lambda amount: math.nan)
    return RunMetrics(
        num_requests=int(finish.size), num_completed=int(done.sum()), makespan_s=makespan,
        throughput_tokens_per_s=rate(float(prompts.sum() + outputs.sum())),
        output_tokens_per_s=rate(float(outputs.sum())), requests_per_s=rate(float(done.sum())),
        ttft_mean_s=_mean(ttft), ttft_p95_s=_p95(ttft), tpot_mean_s=_mean(tpot), tpot_p95_s=_p95(tpot),
        e2e_mean_s=_mean(e2e), e2e_p95_s=_p95(e2e), num_preemptions=num_preemptions, num_steps=num_steps)


def geometric_mean_ratio(numerators: list[float], denominators: list[float]) -> float:
    """(Π a_i / b_i)^(1/K): the aggregate over burst rates of [PPAS] §5.1."""
    logs = [math.log(a / b) for a, b in zip(numerators, denominators, strict=True)]
    return math.exp(sum(logs) / len(logs))
