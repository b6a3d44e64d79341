"""Decision versions fenced by engine epochs: version = epoch · 10^9 + sequence.

A controller replica reserves a new epoch for an engine (`RedisStore.reserve_epoch`, an atomic INCR in
Redis) whenever that engine's stream opens on it, and numbers the engine's decisions 1, 2, … within the
epoch. Epochs only grow, so an engine that reconnects to another replica continues with strictly higher
versions, and two replicas never issue the same version for one engine: each holds a different epoch.
The versions fit the protobuf `uint64 version`; the store's version guard compares them exactly. The
factor, the uint64 bound and the checked `compose_version`/`split_version` live in `controlplane.protocol`
(their one home, which the agent imports too); the store re-exports them with the derived bounds below.

Pure functions, no I/O.
"""

from __future__ import annotations

from controlplane.protocol import UINT64_MAX, VERSION_EPOCH_FACTOR, compose_version, split_version

SEQUENCE_LIMIT = VERSION_EPOCH_FACTOR
"""Sequences run from 0 to SEQUENCE_LIMIT - 1 (10^9 - 1) within one epoch."""
MAX_VERSION = UINT64_MAX
"""The largest version (uint64)."""
MAX_EPOCH = MAX_VERSION // SEQUENCE_LIMIT
"""The largest epoch with a version in uint64 (its sequences stop at MAX_VERSION % SEQUENCE_LIMIT)."""

__all__ = ["MAX_EPOCH", "MAX_VERSION", "SEQUENCE_LIMIT", "compose_version", "split_version"]
