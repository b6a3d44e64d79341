"""The replicas' rollouts through the store: what this replica publishes, and what it reads of the others'.

Each replica writes, in its hash of rollout views (`store/rollouts.py`), its rollouts in progress (field: the pool
key) and its verdicts of the last COOLDOWN_S (field: the pool key, "|#" and the rollout's start), so the others can
tell who owns a pool's rollout and apply its verdict (`loop.rollout_peers`); `ListRollouts` shows the others' in
progress beside its own, and their verdicts among its recent ones.
"""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError

from controlplane.api.v1 import operator_pb2
from controlplane.core.types import Mode
from controlplane.loop.fleet import FleetState
from controlplane.loop.rollout import COOLDOWN_S, Verdict
from controlplane.loop.rollout_peers import PeerRollout
from controlplane.protocol import bounded, pool_key_of_message
from controlplane.service.fleet_view import rollout_view

logger = logging.getLogger(__name__)
MAX_RECENT = 64


def rollout_views(fleet: FleetState, now_s: float) -> dict[str, bytes]:
    """This replica's rollouts in progress and verdicts of the last COOLDOWN_S, as the store shares them: field →
    serialised `RolloutView`."""
    views = {}
    for key in sorted(fleet.pool_keys()):
        rollouts = fleet.pool(key).rollouts
        if rollouts.active is not None:
            views[key] = rollout_view(key, rollouts.active, fleet).SerializeToString(deterministic=True)
        for ended in rollouts.history:
            if now_s - ended.ended_at_s < COOLDOWN_S:
                view = rollout_view(key, ended.rollout, fleet, ended=ended)
                views[f"{key}|#{ended.rollout.started_at_s!r}"] = view.SerializeToString(deterministic=True)
    return views


def peer_views(stored: dict[str, list[bytes]], own_id: str) -> list[operator_pb2.RolloutView]:
    """The other replicas' views (controller id → serialised views, as `Store.list_rollouts` gives them); an
    unreadable one is skipped with a warning."""
    views = []
    for owner in sorted(stored):
        if owner == own_id:
            continue
        for blob in sorted(stored[owner]):
            try:
                view = operator_pb2.RolloutView.FromString(blob)
            except DecodeError:
                logger.warning("replica %s wrote an unreadable rollout view; skipped", bounded(owner))
                continue
            view.controller_id = owner  # the hash it came from names its replica, whatever the view says
            views.append(view)
    return views


def peer_rollouts(views: list[operator_pb2.RolloutView]) -> list[PeerRollout]:
    """The views as `loop.rollout_peers` reads them; one with an unknown mode or state is skipped."""
    peers = []
    for view in views:
        try:
            verdict = Verdict(view.state) if view.ended_at_s > 0 else None
            peers.append(PeerRollout(pool_key_of_message(view.pool), view.controller_id, Mode(view.from_mode),
                                     Mode(view.to_mode), view.started_at_s, view.ended_at_s, verdict,
                                     challenge=view.challenge))
        except ValueError:
            logger.warning("replica %s published a rollout view with mode %s→%s, state %s; skipped",
                           bounded(view.controller_id), bounded(view.from_mode), bounded(view.to_mode),
                           bounded(view.state))
    return peers


def add_peer_views(response: operator_pb2.ListRolloutsResponse, views: list[operator_pb2.RolloutView]) -> None:
    """Add the other replicas' views to this replica's answer: in progress to `rollouts`, ended to `recent`
    (newest first, at most MAX_RECENT in all)."""
    recent = list(response.recent)
    for view in views:
        (recent.append if view.ended_at_s > 0 else response.rollouts.append)(view)
    del response.recent[:]
    response.recent.extend(sorted(recent, key=lambda v: -v.ended_at_s)[:MAX_RECENT])
