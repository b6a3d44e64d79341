"""`service.read_gate.ReadGate`: a caller runs at most its share of heavy reads at once (a further one is refused
with RESOURCE_EXHAUSTED naming the method), and all callers together at most the overall bound (the others wait)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from controlplane.service.read_gate import ReadGate


class RefusedError(Exception):
    pass


class Context:
    """What the gate uses of a servicer context: `abort`, which raises as grpc's does."""

    def __init__(self) -> None:
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise RefusedError(details)


async def _hold(gate: ReadGate, caller: str, release: asyncio.Event, entered: asyncio.Event) -> None:
    async with gate.slot(Context(), caller, "ListLatencyHistory"):
        entered.set()
        await release.wait()


def test_a_caller_past_its_share_is_refused_and_others_wait_for_the_overall_bound() -> None:
    async def scenario() -> None:
        gate = ReadGate(per_caller=2, in_all=2)
        release = asyncio.Event()
        entered = [asyncio.Event() for _ in range(3)]
        holders = [asyncio.create_task(_hold(gate, "alice", release, entered[i])) for i in range(2)]
        await asyncio.wait_for(asyncio.gather(entered[0].wait(), entered[1].wait()), 1.0)
        context = Context()

        async def third() -> None:
            async with gate.slot(context, "alice", "ListLatencyHistory"):
                pass  # pragma: no cover - refused before

        with pytest.raises(RefusedError):  # at once: a refusal, not a wait
            await asyncio.wait_for(third(), 1.0)
        assert context.aborted is not None and context.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert context.aborted[1].startswith("ListLatencyHistory: at most 2 ")
        other = asyncio.create_task(_hold(gate, "bob", release, entered[2]))  # not refused: waits its turn
        await asyncio.sleep(0.05)
        assert not entered[2].is_set() and not other.done()
        release.set()
        await asyncio.wait_for(asyncio.gather(*holders, other), 1.0)
        assert entered[2].is_set()
        async with gate.slot(Context(), "alice", "ListHistory"):  # alice's share is free again: not refused
            pass

    asyncio.run(scenario())
