"""Replicas agree on a pool's rollout (`loop.rollout_peers`): of two rollouts in progress the one started first owns
the pool (ties: the lower replica id) and the other replica yields its own, neither letting the change through nor
holding it off; while a peer owns it no rollout starts here; a peer's promotion lets the change through here and
its rollback holds it off, each applied once and only within the cooldown; views with impossible times (forged, a
clock gone wrong, a replica that died mid-rollout) are not believed."""

from __future__ import annotations

from controlplane.core.types import Mode
from controlplane.loop.rollout import COOLDOWN_S, Asked, PoolRollouts, Verdict
from controlplane.loop.rollout_peers import PeerOutcome, PeerRollout, apply_peers

POOL = "m|a"
ENGINES = ["a0", "a1", "a2"]


def _established(mode: Mode = Mode.MB) -> PoolRollouts:
    rollouts = PoolRollouts()
    for engine in ENGINES:
        rollouts.asked(engine, mode, lambda: ENGINES, 0.0)
    return rollouts


def _started_here(at_s: float) -> PoolRollouts:
    rollouts = _established()
    _, rollout = rollouts.asked(ENGINES[0], Mode.EB, lambda: ENGINES, at_s)
    assert rollout is not None
    return rollouts


def _peer(started_at_s: float, *, replica: str = "replica-b", verdict: Verdict | None = None,
          ended_at_s: float = 0.0) -> PeerRollout:
    return PeerRollout(POOL, replica, Mode.MB, Mode.EB, started_at_s, ended_at_s, verdict)


def test_the_rollout_started_later_yields_to_the_one_started_first() -> None:
    rollouts = _started_here(100.0)
    outcome = apply_peers(rollouts, [_peer(99.0)], replica_id="replica-a", now_s=101.0)
    assert outcome.yielded_to == "replica-b" and rollouts.active is None
    assert rollouts.history[-1].verdict == Verdict.YIELDED and "replica-b owns" in rollouts.history[-1].detail
    assert not rollouts.approved_until_s and not rollouts.blocked_until_s  # neither let through nor held off
    assert rollouts.peer_owner == "replica-b"
    assert all(rollouts.hold_for(e, 101.0) == Mode.MB for e in ENGINES)  # the canary is back on the established mode
    # While the peer owns it, no rollout starts here: the engines asking for the change are held.
    assert rollouts.asked(ENGINES[1], Mode.EB, lambda: ENGINES, 102.0) == (Asked.NOTHING, None)


def test_the_rollout_started_first_is_kept_and_a_tie_goes_to_the_lower_replica_id() -> None:
    rollouts = _started_here(100.0)
    assert apply_peers(rollouts, [_peer(101.0)], replica_id="replica-a", now_s=102.0).yielded_to is None
    assert rollouts.active is not None and rollouts.peer_owner is None
    assert apply_peers(rollouts, [_peer(100.0, replica="replica-0")], replica_id="replica-a",
                       now_s=102.0).yielded_to == "replica-0"
    tied = _started_here(100.0)
    kept = apply_peers(tied, [_peer(100.0, replica="replica-z")], replica_id="replica-a", now_s=102.0)
    assert kept.yielded_to is None


def test_a_peers_promotion_lets_the_change_through_here_once() -> None:
    rollouts = _established()
    promoted = _peer(100.0, verdict=Verdict.PROMOTED, ended_at_s=160.0)
    assert apply_peers(rollouts, [promoted], replica_id="replica-a", now_s=161.0).newly_applied
    assert rollouts.peer_owner is None
    assert rollouts.asked(ENGINES[0], Mode.EB, lambda: ENGINES, 162.0) == (Asked.SWITCH, None)
    assert not apply_peers(rollouts, [promoted], replica_id="replica-a", now_s=163.0).newly_applied


def test_a_peers_rollback_holds_the_change_off_here_until_its_cooldown_ends() -> None:
    rollouts = _established()
    rolled_back = _peer(100.0, verdict=Verdict.ROLLED_BACK, ended_at_s=160.0)
    assert apply_peers(rollouts, [rolled_back], replica_id="replica-a", now_s=161.0).newly_applied
    assert rollouts.asked(ENGINES[0], Mode.EB, lambda: ENGINES, 162.0) == (Asked.NOTHING, None)
    _, started = rollouts.asked(ENGINES[0], Mode.EB, lambda: ENGINES, 160.0 + COOLDOWN_S)
    assert started is not None  # after the cooldown the change may be tried again


def test_verdicts_older_than_the_cooldown_and_peers_gone_change_nothing() -> None:
    rollouts = _established()
    old = _peer(0.0, verdict=Verdict.PROMOTED, ended_at_s=10.0)
    assert not apply_peers(rollouts, [old], replica_id="replica-a", now_s=10.0 + COOLDOWN_S).newly_applied
    assert not rollouts.approved_until_s
    apply_peers(rollouts, [_peer(700.0)], replica_id="replica-a", now_s=701.0)
    assert rollouts.peer_owner == "replica-b"
    apply_peers(rollouts, [], replica_id="replica-a", now_s=702.0)  # its view lapsed or it ended
    assert rollouts.peer_owner is None


def test_a_replicas_own_views_are_not_peers() -> None:
    rollouts = _started_here(100.0)
    assert apply_peers(rollouts, [_peer(99.0, replica="replica-a")], replica_id="replica-a",
                       now_s=101.0).yielded_to is None
    assert rollouts.active is not None and rollouts.peer_owner is None


def test_views_with_impossible_times_are_not_believed() -> None:
    now_s = 10_000.0
    forged = [
        _peer(float("nan")),  # not a time
        _peer(now_s + 3600.0),  # starts an hour ahead of this replica's clock
        _peer(now_s - 3600.0),  # "in progress" for an hour: no rollout runs that long (its replica died, say)
        _peer(now_s - 100.0, verdict=Verdict.PROMOTED, ended_at_s=now_s - 200.0),  # ended before it started
        _peer(now_s - 100.0, verdict=Verdict.ROLLED_BACK, ended_at_s=float("inf")),
    ]
    for view in forged:
        rollouts = _started_here(now_s - 10.0)
        outcome = apply_peers(rollouts, [view], replica_id="replica-a", now_s=now_s)
        assert outcome == PeerOutcome() and rollouts.active is not None and rollouts.peer_owner is None, view
        assert not rollouts.approved_until_s and not rollouts.blocked_until_s
    believed = _started_here(now_s - 10.0)
    assert apply_peers(believed, [_peer(now_s - 20.0)], replica_id="replica-a", now_s=now_s).yielded_to == "replica-b"
