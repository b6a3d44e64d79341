"""Single-flight reads (`service.shared_reads`): callers asking at once share one read, and nothing is kept."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.service.shared_reads import SharedReads


class _Source:
    """A read that counts its calls and answers when released."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()
        self.fail: Exception | None = None

    async def fetch(self) -> list[int]:
        self.calls += 1
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [self.calls]


async def test_callers_asking_at_once_share_one_read_and_a_later_caller_reads_again() -> None:
    shared, source = SharedReads(), _Source()
    callers = [asyncio.create_task(shared.read("registry", source.fetch)) for _ in range(20)]
    other = asyncio.create_task(shared.read("history", source.fetch))  # another key: its own read
    await asyncio.sleep(0)
    source.release.set()
    assert await asyncio.gather(*callers) == [[1]] * 20
    assert await other == [2]
    assert (source.calls, shared.joined) == (2, 19)
    assert await shared.read("registry", source.fetch) == [3]  # nothing kept once answered


async def test_a_failed_read_fails_every_caller_and_is_not_kept() -> None:
    shared, source = SharedReads(), _Source()
    source.fail = RuntimeError("store down")
    callers = [asyncio.create_task(shared.read("registry", source.fetch)) for _ in range(3)]
    await asyncio.sleep(0)
    source.release.set()
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert [str(r) for r in results] == ["store down"] * 3
    source.fail = None
    assert await shared.read("registry", source.fetch) == [2]


async def test_a_cancelled_caller_leaves_the_read_running_for_the_others() -> None:
    shared, source = SharedReads(), _Source()
    first = asyncio.create_task(shared.read("registry", source.fetch))
    second = asyncio.create_task(shared.read("registry", source.fetch))
    await asyncio.sleep(0)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    source.release.set()
    assert await second == [1] and source.calls == 1


async def test_a_read_whose_callers_all_left_is_forgotten_when_it_ends() -> None:
    shared, source = SharedReads(), _Source()
    source.fail = RuntimeError("store down")
    caller = asyncio.create_task(shared.read("registry", source.fetch))
    await asyncio.sleep(0)
    caller.cancel()
    source.release.set()
    for _ in range(5):
        await asyncio.sleep(0)
    source.fail = None
    assert await shared.read("registry", source.fetch) == [2]  # a new read, not the failed one
