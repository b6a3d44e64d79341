"""Replicas agree on a pool's rollout: one owns it, all show it, and its verdict holds on every replica.

Each replica publishes its rollouts in progress and its verdicts of the last COOLDOWN_S (`store/rollouts.py`), and
applies the other replicas' (`PeerRollout`) to the pools it holds (`apply_peers`):
- One owns it. Of the rollouts in progress for a pool, the one started first (ties: the lowest replica id) owns the
  pool's rollout. A replica whose own rollout is not the owner yields it: it ends with verdict YIELDED (neither let
  through nor held off), its canaries going back to their established mode. While a peer owns the pool's
  rollout, this replica starts none there: its engines that ask for a change are held (as for a second change in
  one pool). So two replicas that started one at once settle on one within a publication round.
- Its verdict holds everywhere. A peer's promotion lets the change through here until its cooldown ends (engines
  asking for it switch at their next decision; a promoted challenge moves this replica's engines of its old mode
  at once); a peer's rollback or abort holds it off here likewise. Each
  verdict is applied once.
The owner's canaries are among the engines it holds; the other replicas' engines of the pool hold their mode until
the verdict.

A view is believed only when its times are possible (`is_plausible`): finite, not ahead of this replica's clock by
more than MAX_SKEW_S, and, for one in progress, started within LONGEST_CHANGE_S + MAX_SKEW_S, a challenge within
LONGEST_OBSERVE_S + MAX_SKEW_S (no such rollout runs longer): a replica that died mid-rollout, a clock gone wrong
or a forged view cannot hold a pool's changes for longer than one rollout could.

Pure: no I/O, no clock (times are passed in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.core.types import Mode
from controlplane.loop.rollout import COOLDOWN_S, LONGEST_CHANGE_S, LONGEST_OBSERVE_S, PoolRollouts, Verdict

MAX_SKEW_S = 30.0  # how far another replica's clock may run ahead of this one's


@dataclass(frozen=True, slots=True)
class PeerRollout:
    """Another replica's rollout of a pool, as it published it: in progress (ended_at_s 0, verdict None) or ended."""

    pool_key: str
    controller_id: str
    from_mode: Mode
    to_mode: Mode
    started_at_s: float
    ended_at_s: float = 0.0
    verdict: Verdict | None = None
    challenge: bool = False  # a challenge of the pool's established mode (`PoolRollouts.challenge`)

    @property
    def rank(self) -> tuple[float, str]:
        """Who owns a pool's rollout among those in progress: the lowest rank."""
        return self.started_at_s, self.controller_id


@dataclass(frozen=True, slots=True)
class PeerOutcome:
    """What applying the peers changed here: this replica yielded its rollout; a peer's verdict was newly applied."""

    yielded_to: str | None = None
    newly_applied: bool = False


def is_plausible(peer: PeerRollout, now_s: float) -> bool:
    """Whether a peer's view has possible times (see the module docstring)."""
    started, ended = peer.started_at_s, peer.ended_at_s
    if not (math.isfinite(started) and math.isfinite(ended) and started <= now_s + MAX_SKEW_S):
        return False
    if peer.verdict is None:
        return started >= now_s - (LONGEST_OBSERVE_S if peer.challenge else LONGEST_CHANGE_S) - MAX_SKEW_S
    return started <= ended <= now_s + MAX_SKEW_S


def apply_peers(rollouts: PoolRollouts, peers: list[PeerRollout], *, replica_id: str, now_s: float) -> PeerOutcome:
    """Apply the other replicas' rollouts of one pool (their published views; this replica's own, and views with
    impossible times, are left out) to its `rollouts` here (see the module docstring)."""
    peers = [p for p in peers if p.controller_id != replica_id and is_plausible(p, now_s)]
    running = [p for p in peers if p.verdict is None]
    owner = min(running, key=lambda p: p.rank, default=None)
    yielded_to = None
    active = rollouts.active
    if owner is not None and active is not None and owner.rank < (active.started_at_s, replica_id):
        rollouts.finish(Verdict.YIELDED, now_s, detail=f"replica {owner.controller_id} owns the pool's rollout "
                                                       f"(started {owner.started_at_s:.0f} s)")
        yielded_to = owner.controller_id
    rollouts.peer_owner = owner.controller_id if owner is not None and rollouts.active is None else None
    newly = False
    for peer in peers:
        if peer.verdict is None or now_s - peer.ended_at_s >= COOLDOWN_S:
            continue
        seen = (peer.controller_id, peer.started_at_s)
        if seen in rollouts.peer_verdicts_applied:
            continue
        rollouts.peer_verdicts_applied[seen] = peer.ended_at_s
        newly = True
        change = (peer.from_mode, peer.to_mode)
        if peer.verdict == Verdict.PROMOTED:
            rollouts.promote(change, peer.ended_at_s, challenge=peer.challenge)
        elif peer.verdict in (Verdict.ROLLED_BACK, Verdict.ABORTED):
            rollouts.blocked_until_s[change] = peer.ended_at_s + COOLDOWN_S
            rollouts.approved_until_s.pop(change, None)
    for seen in [s for s, ended_s in rollouts.peer_verdicts_applied.items() if now_s - ended_s >= COOLDOWN_S]:
        del rollouts.peer_verdicts_applied[seen]
    return PeerOutcome(yielded_to=yielded_to, newly_applied=newly)
