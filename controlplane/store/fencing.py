"""Decision versions fenced by engine epochs: version = epoch · 10^9 + sequence.

A controller replica reserves a new epoch for an engine (`RedisStore.reserve_epoch`, an atomic INCR in
Redis) whenever that engine's stream opens on it, and numbers the engine's decisions 1, 2, … within the
epoch. Epochs only grow, so an engine that reconnects to another replica continues with strictly higher
versions, and two replicas never issue the same version for one engine: each holds a different epoch.
The versions fit the protobuf `uint64 version`; the store's version guard compares them exactly. The
factor and the uint64 bound come from `controlplane.protocol` (their one home); these are the checked
forms the store and its callers use.

Pure functions, no I/O.
"""

from __future__ import annotations

from controlplane.protocol import UINT64_MAX, VERSION_EPOCH_FACTOR

SEQUENCE_LIMIT = VERSION_EPOCH_FACTOR
"""Sequences run from 0 to SEQUENCE_LIMIT - 1 (10^9 - 1) within one epoch."""
MAX_VERSION = UINT64_MAX
"""The largest version (uint64)."""
MAX_EPOCH = MAX_VERSION // SEQUENCE_LIMIT
"""The largest epoch with a version in uint64 (its sequences stop at MAX_VERSION % SEQUENCE_LIMIT)."""


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


def compose_version(epoch: int, seq: int) -> int:
    """The version of decision `seq` in `epoch`: epoch · 10^9 + seq.

    Args:
        epoch: the engine's epoch (from `reserve_epoch`), >= 0.
        seq: the decision's sequence number within the epoch, 0 <= seq < 10^9.

    Raises:
        ValueError: for a negative epoch, a sequence outside [0, 10^9), a non-int argument, or a version
            above 2^64 - 1 (uint64 overflow).
    """
    _check_int("epoch", epoch)
    _check_int("seq", seq)
    if epoch < 0:
        raise ValueError(f"epoch must not be negative, got {epoch}")
    if not 0 <= seq < SEQUENCE_LIMIT:
        raise ValueError(f"seq must be in [0, {SEQUENCE_LIMIT}), got {seq}: reserve a new epoch instead")
    version = epoch * SEQUENCE_LIMIT + seq
    if version > MAX_VERSION:
        raise ValueError(f"epoch {epoch} with seq {seq} gives version {version}, above uint64 ({MAX_VERSION})")
    return version


def split_version(version: int) -> tuple[int, int]:
    """(epoch, seq) of a version: the inverse of `compose_version`.

    Raises:
        ValueError: for a non-int, negative or above-uint64 version.
    """
    _check_int("version", version)
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"version must be in [0, {MAX_VERSION}] (uint64), got {version}")
    epoch, seq = divmod(version, SEQUENCE_LIMIT)
    return epoch, seq
