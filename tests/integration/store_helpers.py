"""Helpers of the store tests: decisions and overrides to write, unique key prefixes, polling, watching."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.store import RESYNC, OverrideNotice, RedisStore
from testbench.messages import make_decision  # noqa: F401

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
POOL_KEY = "Qwen/Qwen3-8B|NVIDIA H200"
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
POOL_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL)
ENGINE_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="engine-a")
WAIT_S = 5.0


def delta_override(scope: operator_pb2.Scope, delta_s_per_token: float, *, expires_at_s: float = 0.0,
                   reason: str = "") -> operator_pb2.OverrideRecord:
    return operator_pb2.OverrideRecord(
        scope=scope,
        kind=operator_pb2.OVERRIDE_KIND_DELTA,
        delta_s_per_token=delta_s_per_token,
        expires_at_s=expires_at_s,
        reason=reason,
    )


def unique_prefix() -> str:
    """A key prefix no other test uses (the topologies are shared by the session)."""
    return f"t{uuid.uuid4().hex[:12]}"


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float = WAIT_S) -> None:
    """Poll `check` until it returns True; fail after timeout_s."""
    deadline_s = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline_s, "condition not met in time"
        await asyncio.sleep(0.02)


async def collect_notices(store: RedisStore, into: asyncio.Queue[OverrideNotice]) -> None:
    async with contextlib.aclosing(store.watch_overrides(retry_delay_s=0.05)) as stream:
        async for notice in stream:
            await into.put(notice)


@contextlib.asynccontextmanager
async def watching(store: RedisStore) -> AsyncIterator[asyncio.Queue[OverrideNotice]]:
    """The notices `store` receives, while subscribed (the first RESYNC already taken)."""
    notices: asyncio.Queue[OverrideNotice] = asyncio.Queue()
    watcher = asyncio.create_task(collect_notices(store, notices))
    try:
        assert await asyncio.wait_for(notices.get(), WAIT_S) == RESYNC
        yield notices
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
