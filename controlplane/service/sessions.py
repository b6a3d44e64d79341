"""Agent stream bindings: who holds an engine id, and the mailbox its decisions are pushed to.

Rules for a new stream of an engine id that already has a live stream (fencing):
- another identity (agent token) never takes it: PERMISSION_DENIED;
- the same agent instance (same non-empty instance id) replaces its own older stream (a reconnect);
- another instance wins only if it started at or after the holder (instance_started_at_s), else the new
  stream is refused with ALREADY_EXISTS;
- a stream without an instance id never displaces a live stream (ALREADY_EXISTS): it cannot prove it is
  the holder's reconnect. (A start time more than MAX_CLOCK_SKEW_S in the controller's future is refused
  before this rule: `check_started_at`.)
One identity shared by many engines can take over any engine id of that identity by these rules (a newer
instance start is all it takes); per-engine identities (a token per pod, or mTLS certificates per workload)
with `CP_AGENT_SCOPES` patterns confine each identity to its own engine ids.
The losing stream's mailbox is closed with ABORTED and a message naming the winner; the engine is never
left without a stream that receives its decisions.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections import deque
from dataclasses import dataclass, field

import grpc

from controlplane.api.v1 import common_pb2
from controlplane.loop.ingest import EngineHello

_MAILBOX_DEPTH = 8
# How far an agent's clock may run ahead of the controller's for its instance start time.
MAX_CLOCK_SKEW_S = 60.0


class StreamRefusedError(Exception):
    """A stream may not hold the engine id; `code` is the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Mailbox:
    """Decisions waiting to be written to one stream (bounded: the oldest unsent are dropped, since only
    the newest instruction matters), or the reason the stream must end."""

    def __init__(self) -> None:
        self._items: deque[common_pb2.Decision] = deque(maxlen=_MAILBOX_DEPTH)
        self._ready = asyncio.Event()
        # (status, message) once closed; status None: the stream ended normally (the reader finished).
        self.closed: tuple[grpc.StatusCode | None, str] | None = None

    def put(self, decision: common_pb2.Decision) -> None:
        if self.closed is None:
            self._items.append(decision)
            self._ready.set()

    def close(self, code: grpc.StatusCode | None, message: str) -> None:
        if self.closed is None:
            self.closed = (code, message)
            self._ready.set()

    def pending(self) -> int:
        """Decisions waiting to be written."""
        return len(self._items)

    async def get(self) -> common_pb2.Decision | None:
        """The next decision, or None once the mailbox is closed."""
        while True:
            if self.closed is not None:
                return None
            if self._items:
                return self._items.popleft()
            self._ready.clear()
            await self._ready.wait()


@dataclass(eq=False)
class Session:
    """One open agent stream holding an engine id."""

    hello: EngineHello
    identity: str
    mailbox: Mailbox = field(default_factory=Mailbox)
    last_message_s: float = 0.0  # controller time of the stream's latest message (set by the servicer)

    @property
    def engine_id(self) -> str:
        return self.hello.engine_id


def check_engine_allowed(engine_id: str, identity: str, scopes: dict[str, tuple[str, ...]]) -> None:
    """Raises StreamRefusedError(PERMISSION_DENIED) when the identity's engine-id patterns exclude engine_id.

    An identity without patterns may serve any engine id.
    """
    patterns = scopes.get(identity)
    if patterns and not any(fnmatch.fnmatchcase(engine_id, p) for p in patterns):
        raise StreamRefusedError(grpc.StatusCode.PERMISSION_DENIED,
                            f"identity {identity!r} may not serve engine id {engine_id!r}")


def check_started_at(hello: EngineHello, now_s: float) -> None:
    """Refuse (INVALID_ARGUMENT) a stream whose instance claims to start more than MAX_CLOCK_SKEW_S after
    now_s: a start time from the future would win every takeover."""
    ahead_s = hello.instance_started_at_s - now_s
    if ahead_s > MAX_CLOCK_SKEW_S:
        raise StreamRefusedError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"hello.instance_started_at_s is {ahead_s:.0f} s in the controller's future (at "
                                 f"most {MAX_CLOCK_SKEW_S:.0f} s of clock skew is allowed)")


def resolve_takeover(holder: Session, newcomer: Session) -> None:
    """Decide between a live holder and a newcomer for one engine id (see the module docstring).

    Returns when the newcomer wins (the caller closes the holder); raises StreamRefusedError when it loses.
    """
    if holder.identity != newcomer.identity:
        raise StreamRefusedError(grpc.StatusCode.PERMISSION_DENIED,
                            f"engine id {newcomer.engine_id!r} is held by another identity")
    old, new = holder.hello, newcomer.hello
    if not new.instance_id:
        raise StreamRefusedError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"engine id {new.engine_id!r} is held by a live stream (instance "
                                 f"{old.instance_id or 'unnamed'!r}); a stream without an instance id never "
                                 f"takes over a live one")
    if new.instance_id == old.instance_id:
        return
    if new.instance_started_at_s < old.instance_started_at_s:
        raise StreamRefusedError(grpc.StatusCode.ALREADY_EXISTS,
                            f"engine id {new.engine_id!r} is held by instance {old.instance_id!r}, which started "
                            f"after instance {new.instance_id!r}")
