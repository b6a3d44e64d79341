"""A closed-loop engine paced in wall time, and its Connect stream to a real controller: the load of
`benchmarks/shift_e2e.py`.

`ClosedLoopEngine` holds `num_slots` requests in flight. Each step every running request generates one token; a
request finishes at the step where it reaches its drawn output length and is replaced in that step by a request
whose length is drawn from the law in force (`law`, which the caller may change at any instant): right after a
change, the completions are the old law's requests draining, length-biased.

Pacing: real time, by completions. `advance(now_s)` runs the steps that bring the engine's completions to
`rate_per_s` per second of wall time since it started (a fraction carried to the next advance), and spreads
those steps evenly over the wall time since the last step: the engine completes `rate_per_s` requests per second
under any law and through a change of law, and its step rate is whatever that takes (after a shift to longer
outputs the steps speed up as the short requests drain). Steps run event by event (a slot's finish step is known
when its request is admitted), so an advance costs a few vectorised passes, not one per step. The engine starts
in the stationary state of its first law: lengths drawn length-biased, each request's age uniform over its
length, admissions back-dated at the stationary step rate.

`drain()` returns what finished since the previous drain; `telemetry(drained, seq, sent_at_s)` is the
TelemetryBatch an agent would send: the completions (admission times included), the running requests' histogram
binned as `agents.running_lengths` bins it, a few steps timed by the H200 Qwen3-8B calibration, the scheduler state
and KV use. `stream_engine` runs one engine's stream: Hello, a batch every `interval_s`, an ACK (applied) per
decision pushed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
import numpy as np

from agents.running_lengths import running_length_entries
from controlplane.api.v1 import agent_pb2, agent_pb2_grpc
from controlplane.core.types import CostModel
from controlplane.sim.profiles import H200_QWEN3_8B
from testbench.messages import LIMITS

PROMPT_LOW_TOKENS, PROMPT_HIGH_TOKENS = 256, 768
MAX_OUTPUT_TOKENS = LIMITS.max_model_len_tokens - PROMPT_HIGH_TOKENS
DECODE_STEPS_SHOWN = 4
MAX_PREFILL_STEP_TOKENS = LIMITS.max_num_batched_tokens // 2
_EMPTY = np.zeros(0)


class LengthLaw(Protocol):
    """An output-length law: `controlplane.sim.lengths`' distributions are ones."""

    @property
    def mean_tokens(self) -> float: ...

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Drained:
    """Requests finished since the previous drain (columns; wall-clock seconds), and the steps run and requests
    admitted meanwhile."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    finish_s: np.ndarray
    admitted_s: np.ndarray
    num_steps: int
    num_admitted: int


class ClosedLoopEngine:
    """`num_slots` requests in flight under `law`, completing `rate_per_s` requests per second of wall time."""

    def __init__(self, law: LengthLaw, *, num_slots: int, rate_per_s: float, rng: np.random.Generator,
                 now_s: float) -> None:
        if num_slots < 1 or not rate_per_s > 0:
            raise ValueError(f"need num_slots ≥ 1 and rate_per_s > 0, got {num_slots}, {rate_per_s}")
        self.law = law
        self.num_slots = num_slots
        self.rate_per_s = rate_per_s
        self.step = 0
        self.now_s = now_s
        self._rng = rng
        self._due = 0.0
        self._length, ages = self._stationary(num_slots)
        self._start = -ages
        steps_per_s = rate_per_s * law.mean_tokens / num_slots
        oldest = max(1, int(ages.max()))
        self._anchor_steps = [-oldest, 0]
        self._anchor_s = [now_s - oldest / steps_per_s, now_s]
        self._prompt = self._prompts(num_slots)
        self._done: list[tuple[np.ndarray, ...]] = []
        self._steps_since = 0
        self._admitted_since = 0

    def _draw(self, size: int) -> np.ndarray:
        return np.clip(self.law.sample(self._rng, size), 1, MAX_OUTPUT_TOKENS).astype(np.int64)

    def _prompts(self, size: int) -> np.ndarray:
        return self._rng.integers(PROMPT_LOW_TOKENS, PROMPT_HIGH_TOKENS + 1, size=size, dtype=np.int64)

    def _stationary(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """Lengths of the requests in flight in a stationary closed loop (length-biased) and their ages."""
        drawn = self._draw(64 * size)
        lengths = self._rng.choice(drawn, size=size, p=drawn / drawn.sum())
        ages = np.minimum((self._rng.random(size) * lengths).astype(np.int64), lengths - 1)
        return lengths, ages

    def wall_s(self, steps: np.ndarray) -> np.ndarray:
        """Wall-clock time of each step (the steps of one advance are spread evenly over it)."""
        return np.interp(steps, self._anchor_steps, self._anchor_s)

    def _finish_through(self, last: int) -> int:
        """Finish every request due by step `last` (a replacement due by then too); the number finished."""
        finished = 0
        while True:
            finish = self._start + self._length
            due = np.flatnonzero(finish <= last)
            if due.size == 0:
                return finished
            self._done.append((self._prompt[due], self._length[due], finish[due], self._start[due]))
            finished += due.size
            self._start[due] = finish[due]
            self._length[due] = self._draw(due.size)
            self._prompt[due] = self._prompts(due.size)

    def advance(self, now_s: float) -> None:
        """Run the steps that bring the completions to `rate_per_s` per second by `now_s` (wall clock)."""
        if now_s <= self.now_s:
            return
        self._due += (now_s - self.now_s) * self.rate_per_s
        self.now_s = now_s
        first, finished = self.step, 0
        while finished < int(self._due):
            finish = self._start + self._length
            need = int(self._due) - finished
            last = int(np.partition(finish, need - 1)[need - 1]) if need <= finish.size else int(finish.max())
            finished += self._finish_through(last)
            self.step = last
        self._due -= finished
        if self.step > first:
            self._anchor_steps.append(self.step)
            self._anchor_s.append(now_s)
            self._steps_since += self.step - first
            self._admitted_since += finished

    def drain(self) -> Drained:
        """What finished since the previous drain, with wall-clock finish and admission times."""
        prompts, outputs, finish, admitted = ([np.concatenate(c) for c in zip(*self._done, strict=True)]
                                              if self._done else [_EMPTY] * 4)
        drained = Drained(prompts, outputs, self.wall_s(finish), self.wall_s(admitted), num_steps=self._steps_since,
                          num_admitted=self._admitted_since)
        self._done.clear()
        self._steps_since = self._admitted_since = 0
        return drained

    def running_tokens(self) -> np.ndarray:
        """Output tokens generated so far by each running request."""
        return self.step - self._start

    def telemetry(self, drained: Drained, *, seq: int, sent_at_s: float,
                  costs: CostModel = H200_QWEN3_8B) -> agent_pb2.TelemetryBatch:
        tokens = self.running_tokens()
        lengths, counts, earliest = running_length_entries(tokens.tolist(), self.wall_s(self._start).tolist())
        decodes = min(drained.num_steps, DECODE_STEPS_SHOWN)
        decode_s = costs.alpha_d_s + costs.beta_d_s_per_request * self.num_slots
        prefill_tokens = min(drained.num_admitted * (PROMPT_LOW_TOKENS + PROMPT_HIGH_TOKENS) // 2,
                             MAX_PREFILL_STEP_TOKENS)
        prefills = 1 if prefill_tokens > 0 else 0
        num = drained.output_tokens.size
        return agent_pb2.TelemetryBatch(
            seq=seq,
            completions=agent_pb2.Completions(
                prompt_tokens=drained.prompt_tokens.tolist(), output_tokens=drained.output_tokens.tolist(),
                finish_time_s=drained.finish_s.tolist(), aborted=[False] * num,
                admitted_time_s=drained.admitted_s.tolist()),
            steps=agent_pb2.Steps(
                prefill_tokens=[prefill_tokens] * prefills + [0] * decodes,
                decode_tokens=[0] * prefills + [self.num_slots] * decodes,
                decode_requests=[0] * prefills + [self.num_slots] * decodes,
                duration_s=[costs.alpha_p_s + costs.beta_p_s_per_token * prefill_tokens] * prefills
                + [decode_s] * decodes),
            kv_used_tokens=min(int(self._prompt.sum() + tokens.sum()), LIMITS.kv_capacity_tokens),
            kv_total_tokens=LIMITS.kv_capacity_tokens,
            scheduler=agent_pb2.SchedulerState(num_running_decodes=self.num_slots),
            sent_at_s=sent_at_s,
            running=agent_pb2.RunningLengths(output_tokens=lengths, num_requests=counts, admitted_time_s=earliest),
        )


@dataclass
class StreamTally:
    """What one engine's stream saw: batches sent, decisions received (keep-alives included), how late its
    batches went out at worst (event-loop lag), and the error that ended it (None: ended by us)."""

    batches: int = 0
    decisions: int = 0
    max_lag_s: float = 0.0
    error: str | None = None


async def stream_engine(channel: grpc.aio.Channel, hello: agent_pb2.Hello, engine: ClosedLoopEngine, *,
                        until_s: float, interval_s: float, changes: Sequence[tuple[float, LengthLaw]] = (),
                        record: Callable[[Drained], None] = lambda drained: None,
                        first_batch_s: float | None = None) -> StreamTally:
    """Stream `engine` until wall time `until_s`: Hello, then a batch every `interval_s` (the first at
    `first_batch_s`); each (at_s, law) of `changes` puts `law` in force at wall time at_s. Every decision is
    ACKed as applied."""
    outgoing: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
    tally = StreamTally()
    pending = sorted(changes, key=lambda change: change[0])

    async def requests() -> AsyncIterator[agent_pb2.AgentMessage]:
        while (message := await outgoing.get()) is not None:
            yield message

    call = agent_pb2_grpc.AgentServiceStub(channel).Connect(requests())

    async def read() -> None:
        async for message in call:
            tally.decisions += 1
            ack = agent_pb2.DecisionAck(version=message.decision.version, applied=True)
            await outgoing.put(agent_pb2.AgentMessage(ack=ack))

    await outgoing.put(agent_pb2.AgentMessage(hello=hello))
    reader = asyncio.create_task(read())
    next_s = first_batch_s if first_batch_s is not None else time.time() + interval_s
    try:
        while next_s <= until_s and not reader.done():
            await asyncio.sleep(max(0.0, next_s - time.time()))
            now_s = time.time()
            tally.max_lag_s = max(tally.max_lag_s, now_s - next_s)
            while pending and pending[0][0] <= now_s:
                at_s, law = pending.pop(0)
                engine.advance(at_s)
                engine.law = law
            engine.advance(now_s)
            drained = engine.drain()
            record(drained)
            tally.batches += 1
            await outgoing.put(agent_pb2.AgentMessage(
                telemetry=engine.telemetry(drained, seq=tally.batches, sent_at_s=now_s)))
            next_s += interval_s
        if reader.done() and reader.exception() is not None:
            tally.error = repr(reader.exception())
    finally:
        await outgoing.put(None)
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader
        call.cancel()
    return tally
