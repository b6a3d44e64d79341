"""The per-engine decision loop (`controlplane.loop.engine.EngineLoop`): preemption baseline, sequence-gap
events with uint64 extremes, versions fenced by epoch, ACKs of versions never sent."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from controlplane.api.v1 import common_pb2
from controlplane.core.types import EngineLimits, Mode, ModePin, OperatorIntent, PolicyConfig, Reason
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.engine import EngineLoop, offered_occupancy
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.protocol import UINT64_MAX, VERSION_EPOCH_FACTOR, split_version

LOOP = DecisionLoopConfig()
EMPTY = np.zeros(0)
INTENT = OperatorIntent()


def _batch(seq: int, preemptions: int = 0, *, running: int | None = 4, completions: int = 0, waiting: int = 0,
           kv_used: int = 0, kv_total: int = 1000) -> ValidatedBatch:
    outputs = np.full(completions, 100.0)
    return ValidatedBatch(seq=seq, prompt_tokens=outputs, output_tokens=outputs, prefill_tokens=EMPTY,
                          decode_tokens=EMPTY, decode_requests=EMPTY, duration_s=EMPTY, num_aborted=0, num_dropped=0,
                          kv_used_tokens=kv_used, kv_total_tokens=kv_total, num_running=running, num_waiting=waiting,
                          num_preemptions=preemptions, num_events_dropped=0, traceparent="",
                          running_lengths=EMPTY.astype(np.int64), running_counts=EMPTY.astype(np.int64))


def _loop(epoch: int = 0, *, engine_id: str = "e") -> EngineLoop:
    hello = EngineHello(engine_id=engine_id, model="m", accelerator="a", vllm_version="0", agent_version="0",
                        limits=EngineLimits(max_num_seqs=8, max_num_batched_tokens=64, kv_capacity_tokens=1000,
                                            max_model_len_tokens=512),
                        block_size_tokens=16)
    return EngineLoop(hello=hello, config=LOOP, policy=PolicyConfig(), epoch=epoch)


def test_first_batch_is_the_preemption_baseline_then_increases_count() -> None:
    loop = _loop()
    loop.on_batch(_batch(1, 5000), now_s=0.0)  # an engine that preempted before this controller
    assert loop.preemptions_since_decision == 0
    loop.on_batch(_batch(2, 5003), now_s=1.0)
    loop.on_batch(_batch(3, 5010), now_s=2.0)
    assert loop.preemptions_since_decision == 10


def test_a_counter_that_goes_back_is_a_restarted_engine_and_counts_in_full() -> None:
    loop = _loop()
    loop.on_batch(_batch(1, 100), now_s=0.0)
    loop.on_batch(_batch(2, 3), now_s=1.0)
    assert loop.preemptions_since_decision == 3


def test_sequence_gaps_are_counted_as_events_even_at_uint64_extremes() -> None:
    loop = _loop()
    gaps = [loop.on_batch(_batch(seq), now_s=float(i)) for i, seq in enumerate((1, UINT64_MAX, 1, 10, 11))]
    assert gaps == [False, True, True, True, False]
    assert loop.num_sequence_gaps == 3


def test_a_running_count_dropped_by_validation_leaves_n_obs_alone() -> None:
    loop = _loop()
    loop.on_batch(_batch(1, running=6), now_s=0.0)
    loop.on_batch(_batch(2, running=None), now_s=5.0)
    assert loop.n_obs == 6.0


def test_the_offered_occupancy_counts_the_queue_while_the_kv_cache_has_room() -> None:
    """Running plus waiting, capped at max_num_seqs (8), while the KV cache is below 90% of its capacity; the
    running count alone when it is not, or unknown; nothing without a running count."""
    assert offered_occupancy(_batch(1, running=2, waiting=3, kv_used=100), max_num_seqs=8) == 5.0
    assert offered_occupancy(_batch(1, running=2, waiting=30, kv_used=100), max_num_seqs=8) == 8.0
    assert offered_occupancy(_batch(1, running=2, waiting=30, kv_used=900), max_num_seqs=8) == 2.0
    assert offered_occupancy(_batch(1, running=2, waiting=30, kv_used=0, kv_total=0), max_num_seqs=8) == 2.0
    assert offered_occupancy(_batch(1, running=None, waiting=30), max_num_seqs=8) is None
    loop = _loop()  # the same EMA as N_obs: the first batch sets both, later ones move them by 1 - e^(-dt/τ)
    loop.on_batch(_batch(1, running=2, waiting=30), now_s=0.0)
    assert (loop.n_obs, loop.n_offered) == (2.0, 8.0)
    loop.on_batch(_batch(2, running=2, waiting=0), now_s=LOOP.n_obs_time_constant_s)
    assert loop.n_obs == 2.0 and loop.n_offered == pytest.approx(2.0 + 6.0 * math.exp(-1.0))
    loop.on_batch(_batch(3, running=None, waiting=30), now_s=2 * LOOP.n_obs_time_constant_s)
    assert loop.n_offered == pytest.approx(2.0 + 6.0 * math.exp(-1.0))  # left alone with N_obs


def test_versions_carry_the_epoch_and_increase_across_epochs() -> None:
    loop = _loop(epoch=3)
    first = loop.decide(None, intent=INTENT, now_s=0.0, force_push=True)
    assert first.changed and split_version(first.latest.version) == (3, 1)
    loop.mark_sent(first.push, now_s=0.0)
    same = loop.decide(None, intent=INTENT, now_s=1.0)
    assert not same.changed and same.push is None and loop.latest.version == first.latest.version
    loop.epoch, loop.sequence = 4, 0  # the stream reopened on another replica: a new epoch
    pinned = loop.decide(None, intent=OperatorIntent(delta_s_per_token=1e-4), now_s=2.0)
    assert pinned.changed and pinned.latest.version == 4 * VERSION_EPOCH_FACTOR + 1
    assert pinned.latest.version > first.latest.version


def test_keepalive_resends_the_current_version() -> None:
    loop = _loop()
    first = loop.decide(None, intent=INTENT, now_s=0.0)
    loop.mark_sent(first.push, now_s=0.0)
    later = loop.decide(None, intent=INTENT, now_s=LOOP.keepalive_s + 1.0)
    assert later.push is not None and later.push.version == first.latest.version


def test_acks_of_versions_never_sent_are_refused() -> None:
    loop = _loop()
    outcome = loop.decide(None, intent=INTENT, now_s=0.0)
    loop.mark_sent(outcome.push, now_s=0.0)
    assert loop.ack(UINT64_MAX, applied=True) == "unknown_version"
    assert loop.acked_version == 0
    assert loop.ack(outcome.latest.version, applied=True) == "applied"
    assert loop.acked_version == outcome.latest.version


def test_latest_computation_is_kept_when_the_instruction_does_not_change() -> None:
    loop = _loop()
    loop.decide(None, intent=INTENT, now_s=0.0)
    again = loop.decide(None, intent=INTENT, now_s=7.0)
    assert not again.changed
    assert loop.latest_computed_at_s == 7.0 and loop.latest.decided_at_s == 7.0
    assert loop.latest.version == loop.version


def _due_batches(loop: EngineLoop, num_batches: int, *, completions: int) -> list[int]:
    """Feed one batch per second after a first decision at 0 s; the batches at which the loop was due."""
    loop.decide(None, intent=INTENT, now_s=0.0, force_push=True)
    due = []
    for seq in range(1, num_batches + 1):
        loop.on_batch(_batch(seq, completions=completions), now_s=float(seq))
        if loop.is_due(float(seq)):
            due.append(seq)
            loop.decide(None, intent=INTENT, now_s=float(seq))
    return due


def test_engines_that_connect_together_recompute_at_their_own_phase() -> None:
    # 1,000 engines connected at once, each completing 64 per one-second batch (a recompute every 256):
    # without a per-engine phase all would be due on the same batch, and a fleet-wide burst of decisions,
    # pushes and ACKs would follow every fourth second.
    first_due = [_due_batches(_loop(engine_id=f"engine-{i}"), 4, completions=64)[0] for i in range(1000)]
    spread = np.bincount(first_due, minlength=5)[1:]
    assert spread.sum() == 1000 and spread.min() > 180, spread  # about 250 per batch
    # The phase is a function of the engine id (every replica and the twin agree), and later cycles are
    # full length: one recompute every 256 completions.
    due = _due_batches(_loop(engine_id="engine-7"), 40, completions=64)
    assert due == _due_batches(_loop(engine_id="engine-7"), 40, completions=64)
    assert np.all(np.diff(due) == 4)


def test_the_interval_recompute_is_phased_too() -> None:
    # Engines with no completions recompute every interval_s, each at its own offset from the first.
    first_due = [_due_batches(_loop(engine_id=f"engine-{i}"), 2 * int(LOOP.interval_s), completions=0)
                 for i in range(200)]
    offsets = {due[0] for due in first_due}
    assert len(offsets) == int(LOOP.interval_s)  # every one-second slot of the interval is used
    for due in first_due:
        assert due[1] - due[0] == int(LOOP.interval_s)


def test_the_memory_guard_sees_the_last_running_count_and_holds_its_cap_above_it() -> None:
    """The loop passes the running count of the last batch that carried one to the policy: preemptions while
    the engine runs more than the guard's cap leave the cap alone, and cut it once the count is down to it."""
    from controlplane.core.types import Mode, ModePin, PolicyState

    loop = _loop()
    loop.policy_state = PolicyState(n_guard=4, n_eb_in_force=4)
    eb = OperatorIntent(pin=ModePin(mode=Mode.EB))
    loop.on_batch(_batch(1, 0, running=6), now_s=0.0)
    loop.on_batch(_batch(2, 5, running=None), now_s=1.0)  # a count dropped by validation keeps the last one
    assert loop.num_running == 6
    held = loop.decide(None, intent=eb, now_s=2.0).decision
    assert held.n == 4 and loop.policy_state.n_guard == 4
    loop.on_batch(_batch(3, 9, running=4), now_s=3.0)
    cut = loop.decide(None, intent=eb, now_s=4.0).decision
    assert cut.n == 3 and loop.policy_state.n_guard == 3


def test_the_mode_in_force_dates_from_its_latest_change_and_the_first_mode_from_never() -> None:
    """`mode_since_s`: −inf while the engine runs the mode it was first decided with (new versions of that mode
    keep it), the time of the decision that changed it after that (the objective loop's window waits from then)."""
    loop = _loop()
    pinned = {mode: OperatorIntent(pin=ModePin(mode=mode, reason=Reason.OPERATOR_PIN)) for mode in (Mode.MB, Mode.EB)}
    loop.decide(None, intent=pinned[Mode.MB], now_s=1.0)
    assert loop.mode_since_s == -math.inf
    loop.decide(None, intent=replace(pinned[Mode.MB], delta_s_per_token=1e-4), now_s=2.0)
    assert loop.mode_since_s == -math.inf
    assert (loop.mode_before, loop.mode_before_since_s) == (0, math.inf)
    loop.decide(None, intent=pinned[Mode.EB], now_s=3.0)
    assert loop.mode_since_s == 3.0 and loop.current.mode == common_pb2.MODE_EB
    assert (loop.mode_before, loop.mode_before_since_s) == (common_pb2.MODE_MB, -math.inf)
    loop.decide(None, intent=pinned[Mode.EB], now_s=4.0, force_push=True)
    assert loop.mode_since_s == 3.0
    loop.decide(None, intent=pinned[Mode.MB], now_s=5.0)
    assert loop.mode_since_s == 5.0
    # And the mode before the latest change, with since when it had run (the window up to a switch is its).
    assert (loop.mode_before, loop.mode_before_since_s) == (common_pb2.MODE_EB, 3.0)
