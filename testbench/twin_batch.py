"""`twin_batch`: the telemetry batch an agent would send for a twin engine (`controlplane.sim.engine.SimEngine`)
at the end of a second, as the fleet state machine takes it (a `ValidatedBatch`), for benchmarks that drive
`FleetState` with twin engines in simulated time."""

from __future__ import annotations

import numpy as np

from agents.running_lengths import running_length_entries
from controlplane.loop.ingest import Latencies, ValidatedBatch
from controlplane.sim.engine import SimEngine


def twin_batch(sim: SimEngine, *, seq: int, prompts: np.ndarray, outputs: np.ndarray, admitted_s: np.ndarray,
               steps: list, latencies: Latencies | None = None) -> ValidatedBatch:
    """The batch of completions (prompt and output tokens, admission times in the twin's seconds), steps
    ((prefill tokens, decode tokens, duration s) each; steps that ran no token are left out, as the agent does)
    and the twin's running requests now, at sim.now_s."""
    now_s = sim.now_s
    columns = np.asarray(steps, dtype=np.float64).reshape(-1, 3)
    columns = columns[(columns[:, 0] + columns[:, 1]) > 0]
    lengths, counts, running_admitted = running_length_entries(sim.running_output_tokens().tolist(),
                                                               sim.running_admitted_s().tolist())
    return ValidatedBatch(
        seq=seq, prompt_tokens=prompts, output_tokens=outputs, prefill_tokens=columns[:, 0],
        decode_tokens=columns[:, 1], decode_requests=columns[:, 1], duration_s=columns[:, 2], num_aborted=0,
        num_dropped=0, kv_used_tokens=int(sim.kv_used_tokens), kv_total_tokens=sim.kv_total_tokens,
        num_running=int(sim.num_running), num_waiting=int(sim.num_waiting), num_preemptions=int(sim.num_preemptions),
        num_events_dropped=0, traceparent="", running_lengths=np.asarray(lengths, dtype=np.int64),
        running_counts=np.asarray(counts, dtype=np.int64), admitted_age_s=now_s - admitted_s,
        running_admitted_age_s=now_s - np.asarray(running_admitted), latencies=latencies)
