"""Decision writes and history entries as the store encodes them. No I/O here.

A decision is kept twice: as the latest of its engine (a hash, version-guarded) and as an entry of its
pool's history stream. Both carry the same fields: version, mode (e.g. "MODE_EB"), k, n, reason,
decided_at_s, pool and the deterministic protobuf payload; history entries add engine_id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.api.v1 import common_pb2
from controlplane.store.records import parse_payload, text, text_fields


@dataclass(frozen=True, slots=True)
class DecisionWrite:
    """One decision to store as the latest of an engine.

    Attributes:
        engine_id: the engine; not empty.
        pool_key: the engine's pool, as `keys.pool_key` renders it (selects the history stream).
        decision: the decision; written only when its version exceeds the stored one.
    """

    engine_id: str
    pool_key: str
    decision: common_pb2.Decision

    def __post_init__(self) -> None:
        if not isinstance(self.engine_id, str) or not self.engine_id:
            raise ValueError(f"a decision write needs a non-empty engine_id, got {self.engine_id!r}")
        if not isinstance(self.pool_key, str):
            raise ValueError(f"pool_key must be a str, got {type(self.pool_key).__name__}")
        if not isinstance(self.decision, common_pb2.Decision):
            raise ValueError(f"decision must be a common_pb2.Decision, got {type(self.decision).__name__}")


def decision_fields(write: DecisionWrite) -> list[str | bytes]:
    """The stored fields' values in the order of the put_decision script's ARGV."""
    decision = write.decision
    return [
        str(decision.version),
        common_pb2.Mode.Name(decision.mode),
        str(decision.k),
        str(decision.n),
        decision.reason,
        repr(decision.decided_at_s),
        write.pool_key,
        decision.SerializeToString(deterministic=True),
    ]


_FIELD_NAMES = ("version", "mode", "k", "n", "reason", "decided_at_s", "pool", "payload")


def history_fields(write: DecisionWrite) -> dict[str, str | bytes]:
    """The fields of the history entry of an accepted write."""
    return {"engine_id": write.engine_id, **dict(zip(_FIELD_NAMES, decision_fields(write), strict=True))}


def history_entry(entry_id: bytes | str, fields: Mapping[bytes, bytes], *, stream: str) -> dict[str, Any]:
    """A history stream entry as `RedisStore.read_history` returns it: text fields, "id", and "decision"
    (the parsed Decision, None when its payload does not parse) instead of the raw "payload"."""
    raw = dict(fields)
    payload = raw.pop(b"payload", None)
    entry: dict[str, Any] = {"id": text(entry_id), **text_fields(raw)}
    entry["decision"] = parse_payload(common_pb2.Decision, payload, key=f"{stream} {entry['id']}")
    return entry


def stream_id_order(entry_id: str) -> tuple[int, int]:
    """A stream id "<ms>-<seq>" as a sortable pair (time order of one server's clock)."""
    ms, _, seq = entry_id.partition("-")
    try:
        return int(ms), int(seq or 0)
    except ValueError:
        return 0, 0
