"""Memory guard: closes the loop on N̂* with the engine's preemption counter.

N̂* ([EB] Prop. 3.3) is open loop: it is memory-safe only as far as the estimates behind it are right. They
are biased whenever the completion window lags the requests in flight, most of all after a start or a shift
towards longer outputs: the first completions are the short ones, μ̂_O comes out low, N̂* high, and the
KV cache overflows into preemptions (each one recomputes a request's whole context) until long
completions fill the window (measured in the twin: geometric outputs of mean 1,024 on H200, N̂* took the
whole 4,000-request run to settle from 1,024 to 584, with 5,338 preemptions on the way).

The guard is additive-increase / multiplicative-decrease on a cap over the EB batch size:
- preemptions since the last decision (in EB) → cap = ⌊decrease_factor · N in force⌋, ≥ 1, unless the
  engine still runs more requests than the N in force (≤ the cap; admitted under a larger N): then the cap,
  or its absence, stays;
- none → the cap grows by max(1, ⌈increase_fraction · cap⌉) and is released (0) once it reaches N̂*.
N = min(N̂*, cap) while a cap holds: the guard only ever lowers N, never lifts it above N̂* (the operator's ε
stays the bound). The base is the N in force, not the observed running count: an EMA of running requests
lags, and one stray preemption at a low count cut N for minutes in the twin (geometric prefill-heavy: N down
to 329 from 542, warm throughput −7%).

Why the hold. N bounds admissions only: a cap below the running count admits nothing less, and the
preemptions that follow come from requests already running as they grow (vLLM preempts those itself). Cut on
each of them, the cap fell far below what fits: on long outputs (uniform 800–4,000 tokens after 122-token
prompts) the first 1,024 requests fill the KV cache as they grow, no one completes for a minute, and cutting
every decision took N from 1,024 to 34 (RTX PRO 6000, Qwen3-30B-A3B) and to 6 (Qwen3-8B), then the additive
increase took minutes to come back to the ~120–360 that fit. Holding while the engine runs more than the cap,
the cap follows the running count down (cut once it is reached). Over 4,000 requests at c = 2,048 its lowest
went from 6 / 34 / 74 / 169 to 142 / 68 / 213 / 192 (RTX PRO 6000 8B / 30B, H200 8B / 30B), and EB against
v1 from −1.0 / −7.8 / +0.3 / −1.9% to +2.3 / −6.7 / +3.9 / −1.6% (twin_vs_papers.py, [EB] Table 2).

The same holds without a cap when the rule itself lowered N: a cold start admits max_num_seqs, the first
fit asks for fewer, and the requests admitted before still run and preempt. They say nothing about the new
N, so while the engine runs more than the N in force the guard sets no cap. Cut on them, it had set one at
0.85 times a first, low N̂* (ShareGPT on the RTX PRO 6000 with Qwen3-30B-A3B: N̂* 206 at the first decision,
632 from the fifth), and 2% a decision took N from 175 to 336 over the whole run: EB −10.7% against v1,
+39.1% with N at N̂* (twin_vs_papers.py, [EB] Table 2; the paper's −3.1% is another matter, see its note). Pure;
O(1).
"""

from __future__ import annotations

import math


def update_memory_guard(
    *,
    cap: int,
    num_preemptions: int,
    n_in_force: int,
    n_star: int,
    num_running: int = 0,
    decrease_factor: float,
    increase_fraction: float,
) -> int:
    """The new cap on the EB batch size, requests (0: no cap).

    Args:
        cap: the cap in force (0: none). num_preemptions: preemptions since the last decision (≤ 0: none).
        n_in_force: the N the engine ran under since the last decision (≤ 0: unknown, then N̂*).
        n_star: N̂* of this decision (≥ 1 assumed; smaller is treated as 1).
        num_running: the engine's running requests as last reported (≤ 0: unknown).
        decrease_factor: in (0, 1). increase_fraction: in (0, 1] (PolicyConfig validates both).
    """
    n_star = max(1, int(n_star))
    if num_preemptions > 0:
        base = n_in_force if n_in_force > 0 else n_star
        if base < num_running:  # requests admitted under a larger N are still running: N is not yet tested
            return cap
        return max(1, math.floor(decrease_factor * base))
    if cap <= 0:
        return 0
    grown = cap + max(1, math.ceil(increase_fraction * cap))
    return 0 if grown >= n_star else grown
