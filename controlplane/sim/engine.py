"""The twin's engine: a deterministic step simulator of one vLLM v1 engine, scheduled by the agent's own
enforcement code (`agents.enforcement.Enforcer`).

Pure: no I/O, no clock, no threads. Simulated time advances only by the step durations of the cost model
(`controlplane.sim.costs`), so one seed and one sequence of calls always give the same result.

Model (the subset of vLLM v1 that decides throughput and latency):
- Slots and KV: at most `max_num_seqs` running requests; KV in blocks of `block_size_tokens` out of
  `kv_capacity_tokens` (whole blocks). A running request holds the blocks of its computed tokens plus the
  one it computes in the step.
- Request life: chunked prefill of the prompt under the step's token budget (a prompt's cached prefix, a
  multi-turn request's history, is a prefix-cache hit: its blocks are allocated at admission and only the
  rest is computed); the final chunk samples the first output token (TTFT); then one decode token per step
  until the output length (fixed at arrival, cut at max_model_len). Prompts of max_model_len tokens or more
  are refused with a ValueError, as vLLM refuses them.
- Preemption (recompute): when a request cannot get the blocks it needs, the latest-admitted running
  request not yet scheduled in this step is preempted (partial prefills first, then decodes from the end;
  possibly the request itself, which ends that pass, as in vLLM). Its KV is freed and it returns to the
  front of the waiting queue; on resume it prefills prompt + generated tokens again.
- Every step is planned by `Enforcer.plan_step` with the counts the real adapter reads
  (agents/vllm/runtime.py), and the plan is applied the way that adapter maps it onto vLLM's scheduler:
    STOCK         decodes first (in admission order, within the budget), then running prefill chunks, then
                  admissions (FIFO) while running < max_num_active_reqs, all within token_budget_tokens.
    DECODE_ONLY   decodes only; nothing admitted. When nothing can decode vLLM's throttle is inert: the
                  step is STOCK under the plan's cap.
    PREFILL_ONLY  no decodes; running partial prefills first, then at most num_new_reqs_max admissions while
                  running < max_num_active_reqs.
  `Enforcer.observe_step` is told what was scheduled. A plan that schedules nothing is re-planned at once
  (no time passes); after three empty plans in a row one stock step runs (`num_fallback_steps`), so the
  engine never wedges whatever the plans.
- The KV gate's headroom per new request is an EMA (weight 0.05) of finished prompts + one block, as the
  real adapter computes it.

Per-request state lives in numpy arrays indexed by request id and the decode pass is vectorised, so a step
costs a few tens of microseconds at a thousand running requests.

Not thread-safe; one owner drives it.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from agents.enforcement.enforcer import Enforcer
from agents.enforcement.plan import StepKind, StepPlan
from controlplane.sim.costs import StepCosts, attention_pairs
from controlplane.sim.profiles import EngineShape, SimProfile

_STOCK = StepKind.STOCK
_DECODE_ONLY = StepKind.DECODE_ONLY
_PREFILL_ONLY = StepKind.PREFILL_ONLY
KIND_CODES = {_STOCK: 0, _DECODE_ONLY: 1, _PREFILL_ONLY: 2}
_MAX_EMPTY_PLANS = 3
_PROMPT_EMA_WEIGHT = 0.05
_EMPTY = np.empty(0, dtype=np.int64)


class SimStep:
    """What one executed step did. `finished` holds the ids of requests that completed in it."""

    __slots__ = ("decode_context_tokens", "duration_s", "end_s", "finished", "kind", "num_decodes",
                 "prefill_tokens", "token_budget_tokens")

    def __init__(self, kind: StepKind, token_budget_tokens: int, prefill_tokens: int, num_decodes: int,
                 decode_context_tokens: int, duration_s: float, end_s: float, finished: np.ndarray) -> None:
        self.kind = kind
        self.token_budget_tokens = token_budget_tokens
        self.prefill_tokens = prefill_tokens
        self.num_decodes = num_decodes
        self.decode_context_tokens = decode_context_tokens
        self.duration_s = duration_s
        self.end_s = end_s
        self.finished = finished


class StepLog:
    """Columns of every executed step (appended per step; `arrays()` converts once at the end)."""

    __slots__ = ("budget_tokens", "decode_context_tokens", "duration_s", "end_s", "kind", "kv_used_tokens",
                 "num_decodes", "num_running", "num_seqs_cap", "num_waiting", "prefill_attention_pairs",
                 "prefill_tokens")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [])

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: np.asarray(getattr(self, name)) for name in self.__slots__}


class SimEngine:
    """One simulated vLLM engine (see the module docstring for the model)."""

    def __init__(self, profile: SimProfile, *, shape: EngineShape | None = None, seed: int = 0,
                 duration_jitter_rel: float = 0.0, record_steps: bool = True, start_s: float = 0.0) -> None:
        """
        Args:
            profile: step costs (and the default shape).
            shape: start-up limits; None = the profile's.
            seed: seeds the duration jitter.
            duration_jitter_rel: σ of multiplicative log-normal noise on step durations (0: exact).
            record_steps: keep a `StepLog` of every step (timeline plots, telemetry, fits).
            start_s: engine clock at start, seconds.

        Raises:
            ValueError: a negative or non-finite jitter.
        """
        if not (math.isfinite(duration_jitter_rel) and duration_jitter_rel >= 0.0):
            raise ValueError(f"duration_jitter_rel must be finite and ≥ 0, got {duration_jitter_rel}")
        self.profile = profile
        self.shape = shape = shape or profile.shape
        self.enforcer = Enforcer(max_num_seqs=shape.max_num_seqs, max_num_batched_tokens=shape.max_num_batched_tokens)
        self._costs = StepCosts(profile)
        self._use_context = self._costs.context_s_per_token > 0.0
        self._use_attention = self._costs.attention_s_per_pair > 0.0
        self._jitter = duration_jitter_rel
        self._jitter_rng = np.random.default_rng(seed)
        self._block = shape.block_size_tokens
        self._total_blocks = shape.kv_capacity_tokens // shape.block_size_tokens
        self._free_blocks = self._total_blocks
        self._max_len = shape.max_model_len_tokens
        self._stock_plan = StepPlan(_STOCK, shape.max_num_batched_tokens, shape.max_num_seqs, shape.max_num_seqs,
                                    shape.max_num_seqs)
        self._num_requests = 0
        capacity = 1024
        self._prompt = np.zeros(capacity, dtype=np.int64)
        self._output = np.zeros(capacity, dtype=np.int64)
        self._cached = np.zeros(capacity, dtype=np.int64)
        self._computed = np.zeros(capacity, dtype=np.int64)
        self._generated = np.zeros(capacity, dtype=np.int64)
        self._blocks = np.zeros(capacity, dtype=np.int64)
        self._arrival = np.full(capacity, np.nan)
        self._first_token = np.full(capacity, np.nan)
        self._admitted = np.full(capacity, np.nan)  # when first scheduled
        self._finish = np.full(capacity, np.nan)
        self._waiting: deque[int] = deque()
        self._prefilling: list[int] = []
        self._decoding = _EMPTY
        self._prompt_ema = 0.0
        self.now_s = float(start_s)
        self.num_steps = 0
        self.num_completed = 0
        self.num_preemptions = 0
        self.num_fallback_steps = 0
        self.num_empty_plans = 0
        self.log: StepLog | None = StepLog() if record_steps else None

    # ------------------------------------------------------------------------------------------- state

    @property
    def num_running(self) -> int:
        return self._decoding.size + len(self._prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running_prefills(self) -> int:
        return len(self._prefilling)

    @property
    def num_running_decodes(self) -> int:
        return self._decoding.size

    @property
    def num_requests(self) -> int:
        """Requests added so far (ids are 0 … num_requests − 1)."""
        return self._num_requests

    @property
    def kv_used_tokens(self) -> int:
        """KV in use, tokens (whole blocks)."""
        return (self._total_blocks - self._free_blocks) * self._block

    @property
    def kv_total_tokens(self) -> int:
        """KV capacity, tokens (whole blocks)."""
        return self._total_blocks * self._block

    @property
    def is_idle(self) -> bool:
        """Nothing running or waiting."""
        return not self._waiting and not self._prefilling and self._decoding.size == 0

    def largest_remaining_prefill_tokens(self) -> int:
        """R_p: the largest remaining prefill among running partial prefills, tokens (0 when none)."""
        largest = 0
        prompt, generated, computed = self._prompt, self._generated, self._computed
        for rid in self._prefilling:
            remaining = int(prompt[rid] + generated[rid] - computed[rid])
            largest = max(largest, remaining)
        return largest

    def running_output_tokens(self) -> np.ndarray:
        """Output tokens generated so far by each running request (what an agent reports as running lengths)."""
        return self._generated[np.concatenate((self._decoding, np.asarray(self._prefilling, dtype=np.int64)))]

    def running_admitted_s(self) -> np.ndarray:
        """When each running request was first scheduled, in the order of `running_output_tokens`."""
        return self._admitted[np.concatenate((self._decoding, np.asarray(self._prefilling, dtype=np.int64)))]

    def admitted_of(self, ids: np.ndarray) -> np.ndarray:
        """When the requests `ids` were first scheduled (NaN: not yet)."""
        return self._admitted[ids]

    def stamps_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(arrival, first token) times of the requests `ids`, seconds (NaN: not reached)."""
        return self._arrival[ids], self._first_token[ids]

    def lengths_of(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(prompt tokens, output tokens) of the requests `ids` (after truncation to the engine)."""
        return self._prompt[ids], self._output[ids]

    def request_arrays(self) -> dict[str, np.ndarray]:
        """Per-request columns (copies, ids 0 … num_requests − 1): prompt and output tokens, arrival,
        first-token and finish times (seconds; NaN while not reached)."""
        n = self._num_requests
        return {"prompt_tokens": self._prompt[:n].copy(), "output_tokens": self._output[:n].copy(),
                "arrival_s": self._arrival[:n].copy(), "first_token_s": self._first_token[:n].copy(),
                "finish_s": self._finish[:n].copy(), "generated_tokens": self._generated[:n].copy()}

    # ------------------------------------------------------------------------------------------- requests

    def add_requests(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray, arrival_s: np.ndarray, *,
                     cached_prompt_tokens: np.ndarray | None = None) -> np.ndarray:
        """Queue requests (FIFO, after those already waiting); returns their ids.

        `cached_prompt_tokens` (optional, per request): leading prompt tokens served from the prefix cache (a
        multi-turn request's history); admission allocates their blocks and computes only the rest, as vLLM's
        prefix caching does on a hit. Outputs are cut where prompt + output would pass max_model_len (vLLM's
        length stop). Arrival times are recorded for the latency metrics; the caller adds a request when it
        has arrived.

        Raises:
            ValueError: a prompt of max_model_len tokens or more (vLLM refuses it), naming its length and the
                limit; a cached prefix longer than its prompt.
        """
        prompts = np.maximum(np.asarray(prompt_tokens, dtype=np.int64), 1)
        too_long = prompts >= self._max_len
        if too_long.any():
            raise ValueError(f"a prompt of {int(prompts[too_long].max())} tokens does not fit max_model_len "
                             f"{self._max_len} of profile {self.profile.name} (vLLM refuses prompts of "
                             f"max_model_len tokens or more)")
        count = prompts.size
        cached = (np.zeros(count, dtype=np.int64) if cached_prompt_tokens is None
                  else np.asarray(cached_prompt_tokens, dtype=np.int64))
        if cached.shape != prompts.shape or (cached < 0).any() or (cached >= prompts).any():
            raise ValueError("cached_prompt_tokens must give, per request, 0 ≤ cached < prompt tokens")
        outputs = np.clip(np.asarray(output_tokens, dtype=np.int64), 1, None)
        outputs = np.maximum(1, np.minimum(outputs, self._max_len - prompts))
        start = self._num_requests
        self._ensure_capacity(start + count)
        end = start + count
        self._prompt[start:end] = prompts
        self._output[start:end] = outputs
        self._cached[start:end] = cached
        self._arrival[start:end] = np.broadcast_to(np.asarray(arrival_s, dtype=np.float64), (count,))
        self._num_requests = end
        ids = np.arange(start, end, dtype=np.int64)
        self._waiting.extend(ids.tolist())
        return ids

    def _ensure_capacity(self, size: int) -> None:
        capacity = self._prompt.size
        if size <= capacity:
            return
        while capacity < size:
            capacity *= 2
        for name in ("_prompt", "_output", "_cached", "_computed", "_generated", "_blocks"):
            old = getattr(self, name)
            new = np.zeros(capacity, dtype=np.int64)
            new[: old.size] = old
            setattr(self, name, new)
        for name in ("_arrival", "_first_token", "_admitted", "_finish"):
            old = getattr(self, name)
            new = np.full(capacity, np.nan)
            new[: old.size] = old
            setattr(self, name, new)

    # ------------------------------------------------------------------------------------------- stepping

    def step(self) -> SimStep | None:
        """Plan (through the enforcer), schedule and execute one step; None when idle (no time passes)."""
        if self.is_idle:
            return None
        enforcer = self.enforcer
        for _ in range(_MAX_EMPTY_PLANS):
            plan = enforcer.plan_step(
                num_running=self.num_running, num_running_prefills=len(self._prefilling),
                num_running_decodes=self._decoding.size, num_waiting=len(self._waiting),
                free_kv_tokens=self._free_blocks * self._block,
                kv_tokens_per_new_request=int(self._prompt_ema) + self._block,
                largest_remaining_prefill_tokens=self.largest_remaining_prefill_tokens() if self._prefilling else 0,
            )
            scheduled = self._schedule(plan)
            num_tokens = scheduled[0].size + sum(scheduled[3])
            enforcer.observe_step(num_scheduled_tokens=num_tokens)
            if num_tokens:
                break
            self.num_empty_plans += 1
            if self.is_idle:
                return None
        else:
            plan = self._stock_plan
            scheduled = self._schedule(plan)
            self.num_fallback_steps += 1
            if scheduled[0].size + sum(scheduled[3]) == 0:  # pragma: no cover - KV ≥ max_model_len forbids it
                raise RuntimeError("engine cannot schedule anything: KV capacity below one request")
        return self._execute(plan, *scheduled)

    def run_until(self, end_s: float, *, max_steps: int | None = None) -> int:
        """Step while the clock is before `end_s` (the last step may end after it); returns steps run."""
        num = 0
        while self.now_s < end_s and (max_steps is None or num < max_steps):
            if self.step() is None:
                break
            num += 1
        return num

    # ------------------------------------------------------------------------------------------- internals

    def _schedule(self, plan: StepPlan) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
        """Allocate KV for one step under `plan`. Returns (decode ids, their computed tokens before the step,
        prefill request ids, prefill token counts)."""
        kind = plan.kind
        budget = plan.token_budget_tokens
        max_new = plan.num_new_reqs_max if kind is _PREFILL_ONLY else plan.max_num_active_reqs
        decode_ids, decode_computed = _EMPTY, _EMPTY
        dec = self._decoding
        do_prefills = kind is not _DECODE_ONLY or dec.size == 0
        if kind is not _PREFILL_ONLY and dec.size:
            decode_ids, decode_computed = self._schedule_decodes(budget)
            budget -= decode_ids.size
        chunk_ids: list[int] = []
        chunk_tokens: list[int] = []
        if do_prefills and budget > 0:
            budget = self._schedule_prefills(budget, decodes_scheduled=decode_ids.size > 0, chunk_ids=chunk_ids,
                                             chunk_tokens=chunk_tokens)
            if budget > 0:
                self._admit(budget, plan.max_num_active_reqs, max_new, chunk_ids, chunk_tokens)
        return decode_ids, decode_computed, chunk_ids, chunk_tokens

    def _schedule_decodes(self, budget: int) -> tuple[np.ndarray, np.ndarray]:
        dec = self._decoding
        ids = dec if dec.size <= budget else dec[:budget]
        block = self._block
        computed = self._computed[ids]
        need = (computed + block) // block - self._blocks[ids]
        total = int(need.sum())
        while total > self._free_blocks:
            # Preempt from the end of the running order: partial prefills (admitted last), then decodes.
            if self._prefilling:
                self._preempt(self._prefilling.pop())
                continue
            victim = int(self._decoding[-1])
            self._decoding = self._decoding[:-1]
            if ids.size > self._decoding.size:
                total -= int(need[-1])
                ids, computed, need = ids[:-1], computed[:-1], need[:-1]
            self._preempt(victim)
        self._free_blocks -= total
        self._blocks[ids] += need
        return ids, computed

    def _schedule_prefills(self, budget: int, *, decodes_scheduled: bool, chunk_ids: list[int],
                           chunk_tokens: list[int]) -> int:
        block = self._block
        prompt, generated, computed, blocks = self._prompt, self._generated, self._computed, self._blocks
        index = 0
        while index < len(self._prefilling) and budget > 0:
            rid = self._prefilling[index]
            done = int(computed[rid])
            want = min(int(prompt[rid] + generated[rid]) - done, budget)
            need = -(-(done + want) // block) - int(blocks[rid])
            if need > self._free_blocks and not self._make_room(need, index, decodes_scheduled):
                break
            self._free_blocks -= need
            blocks[rid] += need
            chunk_ids.append(rid)
            chunk_tokens.append(want)
            budget -= want
            index += 1
        return budget

    def _make_room(self, need: int, index: int, decodes_scheduled: bool) -> bool:
        """Preempt unscheduled running requests, latest admitted first, until `need` blocks are free.
        False when the prefill at `index` had to preempt itself."""
        while self._free_blocks < need:
            if len(self._prefilling) - 1 > index:
                self._preempt(self._prefilling.pop())
            elif not decodes_scheduled and self._decoding.size:
                victim = int(self._decoding[-1])
                self._decoding = self._decoding[:-1]
                self._preempt(victim)
            else:
                self._preempt(self._prefilling.pop())
                return False
        return True

    def _admit(self, budget: int, max_active: int, max_new: int, chunk_ids: list[int], chunk_tokens: list[int]) -> None:
        block = self._block
        waiting = self._waiting
        running = self.num_running
        admitted = 0
        while waiting and budget > 0 and running < max_active and admitted < max_new:
            rid = waiting[0]
            cached = int(self._cached[rid])
            want = min(int(self._prompt[rid] + self._generated[rid]) - cached, budget)
            need = -(-(cached + want) // block)
            if need > self._free_blocks:
                break
            waiting.popleft()
            if math.isnan(self._admitted[rid]):
                self._admitted[rid] = self.now_s
            self._free_blocks -= need
            self._blocks[rid] = need
            self._computed[rid] = cached
            self._prefilling.append(rid)
            chunk_ids.append(rid)
            chunk_tokens.append(want)
            budget -= want
            running += 1
            admitted += 1

    def _preempt(self, rid: int) -> None:
        self._free_blocks += int(self._blocks[rid])
        self._blocks[rid] = 0
        self._computed[rid] = 0
        self._waiting.appendleft(rid)
        self.num_preemptions += 1

    def _execute(self, plan: StepPlan, decode_ids: np.ndarray, decode_computed: np.ndarray, chunk_ids: list[int],
                 chunk_tokens: list[int]) -> SimStep:
        num_decodes = decode_ids.size
        prefill_tokens = sum(chunk_tokens)
        log = self.log
        context = int(decode_computed.sum()) if num_decodes and (self._use_context or log is not None) else 0
        pairs = 0
        if chunk_ids and (self._use_attention or log is not None):
            computed = self._computed
            pairs = sum(attention_pairs(count, int(computed[rid])) for rid, count in zip(chunk_ids, chunk_tokens,
                                                                                        strict=True))
        duration = self._costs.duration_s(prefill_tokens, num_decodes, context, pairs)
        if self._jitter > 0.0:
            duration *= math.exp(self._jitter * float(self._jitter_rng.standard_normal()))
        end = self.now_s + duration
        finished_parts: list[np.ndarray] = []
        if num_decodes:
            self._computed[decode_ids] = decode_computed + 1
            generated = self._generated[decode_ids] + 1
            self._generated[decode_ids] = generated
            done = generated >= self._output[decode_ids]
            if done.any():
                finished = decode_ids[done]
                self._release(finished, end)
                finished_parts.append(finished)
                self._decoding = np.concatenate((decode_ids[~done], self._decoding[num_decodes:]))
        if chunk_ids:
            prompt, generated_all, computed = self._prompt, self._generated, self._computed
            completed: list[int] = []
            new_decodes: list[int] = []
            for rid, count in zip(chunk_ids, chunk_tokens, strict=True):
                total = int(computed[rid]) + count
                computed[rid] = total
                if total != prompt[rid] + generated_all[rid]:
                    continue
                completed.append(rid)
                generated_all[rid] += 1
                if math.isnan(self._first_token[rid]):
                    self._first_token[rid] = end
                if generated_all[rid] >= self._output[rid]:
                    one = np.array([rid], dtype=np.int64)
                    self._release(one, end)
                    finished_parts.append(one)
                else:
                    new_decodes.append(rid)
            if completed:
                gone = set(completed)
                self._prefilling = [r for r in self._prefilling if r not in gone]
            if new_decodes:
                self._decoding = np.concatenate((self._decoding, np.asarray(new_decodes, dtype=np.int64)))
        finished = finished_parts[0] if len(finished_parts) == 1 else (
            np.concatenate(finished_parts) if finished_parts else _EMPTY)
        self.now_s = end
        self.num_steps += 1
        if log is not None:
            log.end_s.append(end)
            log.decode_context_tokens.append(context)
            log.prefill_attention_pairs.append(pairs)
            log.duration_s.append(duration)
            log.prefill_tokens.append(prefill_tokens)
            log.num_decodes.append(num_decodes)
            log.kind.append(KIND_CODES[plan.kind])
            log.budget_tokens.append(plan.token_budget_tokens)
            log.num_seqs_cap.append(plan.num_seqs_cap)
            log.num_running.append(self.num_running)
            log.num_waiting.append(len(self._waiting))
            log.kv_used_tokens.append((self._total_blocks - self._free_blocks) * self._block)
        return SimStep(plan.kind, plan.token_budget_tokens, prefill_tokens, num_decodes, context, duration, end,
                       finished)

    def _release(self, finished: np.ndarray, end_s: float) -> None:
        """Free the KV of finished requests and record their finish time and prompt (KV-gate EMA)."""
        self._free_blocks += int(self._blocks[finished].sum())
        self._blocks[finished] = 0
        self._finish[finished] = end_s
        self.num_completed += finished.size
        ema = self._prompt_ema
        for prompt in self._prompt[finished].tolist():
            ema += _PROMPT_EMA_WEIGHT * (prompt - ema)
        self._prompt_ema = ema
