"""Well-formed agent and decision messages shared by the tests and the benchmarks: an engine's limits, a
telemetry batch of geometric completions, and a decision to write to the store."""

from __future__ import annotations

import numpy as np

from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.loop.ingest import EngineHello, validate_hello

LIMITS = agent_pb2.EngineLimits(max_num_seqs=1024, max_num_batched_tokens=16384, kv_capacity_tokens=1_500_000,
                                block_size_tokens=16, max_model_len_tokens=32768)


def validated_hello(engine_id: str, pool: common_pb2.Pool) -> EngineHello:
    """The Hello of an engine of `pool` with LIMITS (vLLM 0.32.0, agent "test"), validated as the controller validates
    an agent's (`loop.ingest.validate_hello`): for a `Controller` or `FleetState` driven in-process."""
    return validate_hello(agent_pb2.Hello(engine_id=engine_id, pool=pool, vllm_version="0.32.0", agent_version="test",
                                          limits=LIMITS))


def geometric_batch(seq: int, rng: np.random.Generator, *, num: int, p0: float = 1 / 256,
                    num_running: int = 600, num_waiting: int = 100) -> agent_pb2.TelemetryBatch:
    """A well-formed batch: `num` geometric(p0) completions with uniform prompts, a few steps."""
    outputs = rng.geometric(p0, num)
    prompts = rng.integers(256, 768, num)
    steps = 8
    return agent_pb2.TelemetryBatch(
        seq=seq,
        completions=agent_pb2.Completions(prompt_tokens=prompts.tolist(), output_tokens=outputs.tolist(),
                                          finish_time_s=[1.7e9 + i for i in range(num)], aborted=[False] * num),
        steps=agent_pb2.Steps(prefill_tokens=[2048, 0] * (steps // 2), decode_tokens=[0, 500] * (steps // 2),
                              decode_requests=[0, 500] * (steps // 2), duration_s=[0.1, 0.06] * (steps // 2)),
        kv_used_tokens=400_000, kv_total_tokens=LIMITS.kv_capacity_tokens,
        scheduler=agent_pb2.SchedulerState(num_running_prefills=0, num_running_decodes=num_running,
                                           num_waiting=num_waiting),
        sent_at_s=1.7e9,
    )


def stamped_batch(seq: int, rng: np.random.Generator, *, num: int, median_ttft_s: float = 0.3
                  ) -> tuple[agent_pb2.TelemetryBatch, np.ndarray, np.ndarray]:
    """`geometric_batch` whose completions carry arrival and first-token stamps (log-normal TTFTs of the given
    median, TPOTs around 20 ms); returns it with the TTFTs and the TPOTs (of outputs of two tokens or more) they
    give, seconds."""
    batch = geometric_batch(seq, rng, num=num)
    c = batch.completions
    ttft = rng.lognormal(np.log(median_ttft_s), 0.8, num)
    tpot = rng.lognormal(np.log(0.02), 0.3, num)
    finish = np.asarray(c.finish_time_s)
    outputs = np.asarray(c.output_tokens, dtype=np.float64)
    first = finish - tpot * (outputs - 1)
    c.first_token_time_s.extend(first.tolist())
    c.arrival_time_s.extend((first - ttft).tolist())
    several = outputs >= 2
    return batch, first - (first - ttft), (finish - first)[several] / (outputs[several] - 1)


def make_decision(version: int, *, mode: common_pb2.Mode = common_pb2.MODE_EB) -> common_pb2.Decision:
    """An EB decision (k 4, N 64) at version `version`, decided at 1.7e9 + version."""
    return common_pb2.Decision(
        version=version,
        mode=mode,
        k=4,
        n=64,
        reason="crossover_eb",
        decided_at_s=1_700_000_000.0 + version,
        diagnostics=common_pb2.Diagnostics(theta0=0.05, lhs_s_per_token=1e-5),
    )
