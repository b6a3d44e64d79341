"""`validate_batch` keeps exactly the values possible for the engine, in both of its tiers and both step
encodings.

A reference written one value at a time (the contract in `loop/ingest.py`'s docstring) is compared with
`validate_batch` on seeded batches: clean ones (the tier of whole-column reductions) and ones with each kind
of impossible value planted (the tier of per-value masks), their steps sent as repeated fields and packed
(`Steps.packed_columns`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.api.v1 import agent_pb2
from controlplane.core.types import EngineLimits
from controlplane.loop.ingest import MAX_STEP_DURATION_S, TelemetryError, validate_batch
from controlplane.protocol import pack_step_columns

LIMITS = EngineLimits(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=1 << 20,
                      max_model_len_tokens=4096)


def _batch(rng: np.random.Generator, num_completions: int, num_steps: int) -> agent_pb2.TelemetryBatch:
    prefill = rng.integers(0, 2, num_steps) * rng.integers(1, 1024, num_steps)
    decode_req = rng.integers(0, LIMITS.max_num_seqs + 1, num_steps)
    decode_tok = np.where(prefill + decode_req == 0, 1, decode_req)
    return agent_pb2.TelemetryBatch(
        seq=1,
        completions=agent_pb2.Completions(
            prompt_tokens=rng.integers(1, 2048, num_completions).tolist(),
            output_tokens=rng.integers(1, 2048, num_completions).tolist(),
            finish_time_s=(1.7e9 + rng.random(num_completions)).tolist(),
            aborted=[False] * num_completions),
        steps=agent_pb2.Steps(prefill_tokens=prefill.tolist(), decode_tokens=decode_tok.tolist(),
                              decode_requests=decode_req.tolist(),
                              duration_s=rng.uniform(1e-3, 0.1, num_steps).tolist()))


# fault → the (column, value) pairs it writes at one index ("completions." or "steps." column paths).
_FAULT_VALUES: dict[str, tuple[tuple[str, float], ...]] = {
    "prompt_zero": (("completions.prompt_tokens", 0),),
    "output_zero": (("completions.output_tokens", 0),),
    "finish_nan": (("completions.finish_time_s", math.nan),),
    "finish_inf": (("completions.finish_time_s", -math.inf),),
    "too_long": (("completions.prompt_tokens", LIMITS.max_model_len_tokens), ("completions.output_tokens", 1)),
    "aborted": (("completions.aborted", True),),
    "duration_zero": (("steps.duration_s", 0.0),),
    "duration_negative": (("steps.duration_s", -1e-3),),
    "duration_nan": (("steps.duration_s", math.nan),),
    "duration_inf": (("steps.duration_s", math.inf),),
    "duration_long": (("steps.duration_s", MAX_STEP_DURATION_S * 1.01),),
    "no_tokens": (("steps.prefill_tokens", 0), ("steps.decode_tokens", 0), ("steps.decode_requests", 0)),
    "over_budget": (("steps.prefill_tokens", LIMITS.max_num_batched_tokens),),
    "requests_over_tokens": (("steps.decode_tokens", 3), ("steps.decode_requests", 4)),
    "requests_over_max_num_seqs": (("steps.decode_tokens", LIMITS.max_num_seqs + 1),
                                   ("steps.decode_requests", LIMITS.max_num_seqs + 1)),
}
_COMPLETION_FAULTS = tuple(f for f, writes in _FAULT_VALUES.items() if writes[0][0].startswith("completions."))
_STEP_FAULTS = tuple(f for f, writes in _FAULT_VALUES.items() if writes[0][0].startswith("steps."))


def _plant(batch: agent_pb2.TelemetryBatch, fault: str, i: int) -> None:
    for path, value in _FAULT_VALUES[fault]:
        message, column = path.split(".")
        getattr(getattr(batch, message), column)[i] = value


def _reference(batch: agent_pb2.TelemetryBatch) -> tuple[list, list, int, int]:
    """(kept completions, kept steps, aborted, dropped), one value at a time."""
    c, s = batch.completions, batch.steps
    kept_c, kept_s, aborted, dropped = [], [], 0, 0
    for p, o, f, a in zip(c.prompt_tokens, c.output_tokens, c.finish_time_s, c.aborted, strict=True):
        if a:
            aborted += 1
        elif p >= 1 and o >= 1 and math.isfinite(f) and p + o <= LIMITS.max_model_len_tokens:
            kept_c.append((p, o))
        else:
            dropped += 1
    for pf, dt, dr, d in zip(s.prefill_tokens, s.decode_tokens, s.decode_requests, s.duration_s, strict=True):
        if (math.isfinite(d) and 0 < d <= MAX_STEP_DURATION_S and 0 < pf + dt <= LIMITS.max_num_batched_tokens
                and dr <= dt and dr <= LIMITS.max_num_seqs):
            kept_s.append((pf, dt, dr, d))
        else:
            dropped += 1
    return kept_c, kept_s, aborted, dropped


def packed(batch: agent_pb2.TelemetryBatch) -> agent_pb2.TelemetryBatch:
    """The same batch with its steps in `Steps.packed_columns` (mode and budget columns kept as they are)."""
    out = agent_pb2.TelemetryBatch()
    out.CopyFrom(batch)
    s = batch.steps
    columns = pack_step_columns(s.duration_s, s.prefill_tokens, s.decode_tokens, s.decode_requests)
    out.steps.CopyFrom(agent_pb2.Steps(packed_columns=columns, mode=s.mode, budget_tokens=s.budget_tokens))
    return out


def _kept(batch: agent_pb2.TelemetryBatch) -> tuple[list, list, int, int]:
    """What validate_batch keeps; the same from the batch with its steps packed (checked here)."""
    got = _validated(batch)
    assert _validated(packed(batch)) == got
    return got


def _validated(batch: agent_pb2.TelemetryBatch) -> tuple[list, list, int, int]:
    v = validate_batch(batch, LIMITS)
    completions = list(zip(v.prompt_tokens.tolist(), v.output_tokens.tolist(), strict=True))
    steps = list(zip(v.prefill_tokens.tolist(), v.decode_tokens.tolist(), v.decode_requests.tolist(),
                     v.duration_s.tolist(), strict=True))
    return completions, steps, v.num_aborted, v.num_dropped


@pytest.mark.parametrize("seed", range(8))
def test_a_clean_batch_keeps_every_value(seed: int) -> None:
    batch = _batch(np.random.default_rng(seed), 64, 1000)
    completions, steps, aborted, dropped = _kept(batch)
    assert (len(completions), len(steps), aborted, dropped) == (64, 1000, 0, 0)
    assert (completions, steps, aborted, dropped) == _reference(batch)


@pytest.mark.parametrize("seed", range(8))
def test_a_clean_batch_at_the_limits_keeps_every_value(seed: int) -> None:
    # The longest prompt and the longest output (the largest prefill and the largest decode) together exceed
    # the limit although no one request (step) does: the clean tier must not take the bound for the total.
    rng = np.random.default_rng(seed)
    batch = _batch(rng, 64, 1000)
    c, s = batch.completions, batch.steps
    c.prompt_tokens[0], c.output_tokens[0] = LIMITS.max_model_len_tokens - 1, 1
    c.prompt_tokens[1], c.output_tokens[1] = 1, LIMITS.max_model_len_tokens - 1
    s.prefill_tokens[0], s.decode_tokens[0], s.decode_requests[0] = LIMITS.max_num_batched_tokens, 0, 0
    s.prefill_tokens[1] = 0
    s.decode_tokens[1] = s.decode_requests[1] = LIMITS.max_num_seqs
    completions, steps, aborted, dropped = _kept(batch)
    assert (len(completions), len(steps), aborted, dropped) == (64, 1000, 0, 0)
    assert (completions, steps, aborted, dropped) == _reference(batch)


@pytest.mark.parametrize("fault", _COMPLETION_FAULTS + _STEP_FAULTS)
def test_each_impossible_value_is_dropped_and_counted_and_nothing_else(fault: str) -> None:
    for seed in range(5):
        rng = np.random.default_rng(seed)
        batch = _batch(rng, 32, 200)
        size = 32 if fault in _COMPLETION_FAULTS else 200
        for i in rng.choice(size, size=int(rng.integers(1, 4)), replace=False):
            _plant(batch, fault, int(i))
        got, want = _kept(batch), _reference(batch)
        assert got == want
        assert got[2] + got[3] >= 1


def test_mixed_faults_in_one_batch_match_the_reference() -> None:
    faults = _COMPLETION_FAULTS + _STEP_FAULTS
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        batch = _batch(rng, 16, 64)
        for _ in range(int(rng.integers(0, 6))):
            fault = faults[int(rng.integers(len(faults)))]
            _plant(batch, fault, int(rng.integers(16 if fault in _COMPLETION_FAULTS else 64)))
        assert _kept(batch) == _reference(batch)


def test_empty_columns_give_empty_float_arrays() -> None:
    v = validate_batch(agent_pb2.TelemetryBatch(seq=3), LIMITS)
    for column in (v.prompt_tokens, v.output_tokens, v.prefill_tokens, v.decode_tokens, v.decode_requests,
                   v.duration_s):
        assert column.size == 0
        assert column.dtype == np.float64
    assert (v.num_aborted, v.num_dropped) == (0, 0)


def test_admissions_become_ages_before_the_batch_was_sent_and_impossible_ones_unknown() -> None:
    sent_at_s = 1.7e9 + 10.0
    batch = agent_pb2.TelemetryBatch(
        seq=1, sent_at_s=sent_at_s,
        completions=agent_pb2.Completions(
            prompt_tokens=[10, 10, 10, 10, 0], output_tokens=[5, 6, 7, 8, 9],
            finish_time_s=[1.7e9 + 9.0] * 5, aborted=[False, False, False, True, False],
            # fine, after its finish, not finite, aborted, dropped (prompt 0)
            admitted_time_s=[1.7e9 + 4.0, 1.7e9 + 9.5, math.nan, math.nan, 1.7e9]),
        running=agent_pb2.RunningLengths(output_tokens=[3, 40], num_requests=[2, 1],
                                         admitted_time_s=[1.7e9 + 9.0, 1.7e9 + 2.0]))
    v = validate_batch(batch, LIMITS)
    assert v.output_tokens.tolist() == [5.0, 6.0, 7.0]
    assert v.admitted_age_s[0] == pytest.approx(6.0) and np.isnan(v.admitted_age_s[1:]).all()
    assert v.running_admitted_age_s.tolist() == pytest.approx([1.0, 8.0])
    batch.running.admitted_time_s[1] = math.inf  # one unknown running admission: none is used
    assert validate_batch(batch, LIMITS).running_admitted_age_s.size == 0
    unreported = validate_batch(agent_pb2.TelemetryBatch(seq=1, completions=batch.completions), LIMITS)
    assert unreported.running_admitted_age_s.size == 0


@pytest.mark.parametrize("column", ["completions", "running"])
def test_admissions_of_the_wrong_count_are_refused_with_the_field_named(column: str) -> None:
    batch = agent_pb2.TelemetryBatch(
        seq=1, completions=agent_pb2.Completions(prompt_tokens=[10, 10], output_tokens=[5, 6],
                                                 finish_time_s=[1.7e9] * 2, aborted=[False] * 2),
        running=agent_pb2.RunningLengths(output_tokens=[3], num_requests=[2]))
    getattr(batch, column).admitted_time_s.extend([1.7e9] * 3)
    with pytest.raises(TelemetryError, match=f"telemetry.{column}.admitted_time_s"):
        validate_batch(batch, LIMITS)
