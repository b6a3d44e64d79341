"""A queueing estimate of TTFT and TPOT per candidate configuration (mode and token budget) of one engine.

The objective loop (`controlplane.loop.objective`) asks, for a pool under a latency objective, which way to move:
which mode, and which P-PAS budget under pressure (B_cap), gives the lower TTFT or TPOT at the pool's measured
load. This module predicts both from the cost model (`CostModel`) and the load of one engine: its arrival rate λ
(requests/s), the mean prompt and output lengths μ_L and μ_O (tokens), its admission cap N, EB's threshold k and
the budgets B_max and B_cap. The prediction is a first-order estimate, not a simulation; the loop corrects it by the
quantiles it measures (a factor per mode, `Correction`), so what must hold is the order of the candidates and
the order of magnitude, which `benchmarks/latency_model.py` checks against the twin.

Mixed batching (MB, P-PAS budget). Two kinds of step: chunk steps carry `room` prompt tokens beside each
decoding request's next token (room = budget − decoding requests n, the budget B_cap while prefills queue beside
decodes, P-PAS's pressure, and B_max otherwise, weighted by the chance of pressure), and between prompts the engine
runs decode-only steps. A chunk step takes τ_c = α_MB + β_MB^e(r_c)·(n + room) at its own decode ratio
r_c = n / (n + room); a decode-only step τ_d = α_d + β_d·n (the decode line: those steps are fitted there, not in
the mixed fit, so the mixed fit is read only where its steps are and never extrapolated to r = 1, where on long
prompts its quadratic says nothing: read there, it called MB unstable where MB served). The prompts need
c = λ·μ_L / room chunk steps a second, the share ρ = c·τ_c of the engine's time; the rest runs decode-only steps,
so the engine makes S = c + (1 − ρ)/τ_d steps a second, each giving every running request a token:
    n = λ·μ_O / S,  TPOT = 1/S  (n, room, τ_c, τ_d solved by fixed-point iteration).
A request's TTFT is the rest of the step it arrives in, its own prompt (its chunks of `room` tokens, or one step
when shorter: max(1, L_q/room) mixed steps carrying L_q tokens in all beside the n decodes), and the wait behind
other prompts, an M/G/1 queue whose service is a prompt token's share of a chunk step, τ_c / room:
    TTFT_q = 1/S + max(1, L_q/room)·τ_c(L_q / max(1, L_q/room)) + W_q(ρ).
Exclusive batching (EB). Decode-only steps τ_d = α_d + β_d·n alternate with prefill-only steps at B_max; a refill
starts at the next step boundary when k slots are idle (N − n ≥ k: the usual case below saturation), and loads the
m ≈ 1 + λ·τ_d prompts that arrived meanwhile in one step. Prefills take the share f = λ·(β_p·μ_L + α_p/m) of the
engine's time, so n = λ·μ_O·τ_d / (1 − f) (solved by fixed-point iteration) and
    TTFT_q = q·τ_d + α_p + β_p·(L_q + (m − 1)·μ_L) + f/(1 − f)·(α_p + β_p·μ_L)·ln(1/(1 − q)),
    TPOT = τ_d / (1 − f).
When fewer than k slots are idle on average (N − n < k), a refill waits for k completions (k/λ seconds): the
quantile q of that wait is added. A candidate is unstable (its latencies infinite) when the work it must do
per second reaches the engine's time (ρ ≥ 1, f ≥ 1) or it would need more than N running requests.

L_q, the prompt length at quantile q, is not measured per pool: the model takes an exponential tail,
L_q = μ_L·ln(1/(1 − q)) (capped at the prompt cap when given), one of the errors the correction absorbs.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controlplane.core.types import CostModel, Mode

FIXED_POINT_ITERATIONS = 32
DEFAULT_N_TH = 2  # P-PAS's pressure: at least this many prefills running beside a decode
PROMPT_SECOND_MOMENT = 2.0  # E[L²] / μ_L², the exponential tail's


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one engine of the pool carries and is limited by.

    arrival_rate_per_s: requests arriving per second at this engine (≥ 0). mu_l_tokens / mu_o_tokens: mean
    prompt and output lengths (> 0). max_running: the admission cap N (≥ 1). k: EB's phase-switch threshold
    (1 ≤ k ≤ N). b_max_tokens / b_cap_tokens: P-PAS's budgets without and under pressure (≥ 1).
    max_prompt_tokens: the longest prompt the engine accepts (0: unknown), caps L_q.
    """

    arrival_rate_per_s: float
    mu_l_tokens: float
    mu_o_tokens: float
    max_running: int
    k: int
    b_max_tokens: int
    b_cap_tokens: int
    max_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class LatencyPrediction:
    """The model's TTFT at quantile q and mean TPOT (s) for one configuration; inf when unstable.

    step_s: the mean step time the estimate rests on; running: decoding requests on average; utilisation: the
    busiest resource's share (prompt room for MB, prefill time for EB), < 1 when stable.
    """

    mode: Mode
    b_cap_tokens: int
    ttft_s: float
    tpot_s: float
    step_s: float
    running: float
    utilisation: float

    @property
    def stable(self) -> bool:
        return math.isfinite(self.ttft_s) and math.isfinite(self.tpot_s)

    def latency_s(self, name: str) -> float:
        """`ttft_s` for "ttft", `tpot_s` for "tpot"."""
        return self.ttft_s if name == "ttft" else self.tpot_s


def load_problem(load: EngineLoad) -> str | None:
    """What makes `load` unusable for a prediction, in words; None when usable."""
    rate, mu_l, mu_o = load.arrival_rate_per_s, load.mu_l_tokens, load.mu_o_tokens
    if not (math.isfinite(rate) and rate >= 0.0):
        return f"arrival rate must be finite and ≥ 0, got {rate}"
    if not (math.isfinite(mu_l) and math.isfinite(mu_o) and mu_l > 0.0 and mu_o > 0.0):
        return f"mean lengths must be finite and > 0, got μ_L {mu_l}, μ_O {mu_o}"
    if not 1 <= load.k <= load.max_running:
        return f"need 1 ≤ k ≤ N, got k {load.k}, N {load.max_running}"
    if load.b_max_tokens < 1 or load.b_cap_tokens < 1:
        return f"budgets must be ≥ 1, got B_max {load.b_max_tokens}, B_cap {load.b_cap_tokens}"
    return None


def prompt_quantile_tokens(load: EngineLoad, quantile: float) -> float:
    """L_q under the exponential-tail assumption, capped by max_prompt_tokens when known."""
    tokens = load.mu_l_tokens * math.log(1.0 / (1.0 - quantile))
    return min(tokens, float(load.max_prompt_tokens)) if load.max_prompt_tokens > 0 else tokens


def predict(mode: Mode, costs: CostModel, load: EngineLoad, *, quantile: float) -> LatencyPrediction:
    """The model's TTFT quantile and mean TPOT for `mode` (EB, or MB with load.b_cap_tokens under pressure).

    Raises ValueError when `load` is unusable (`load_problem`) or quantile is not in (0, 1).
    """
    problem = load_problem(load)
    if problem is not None:
        raise ValueError(problem)
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    if mode == Mode.EB:
        return _predict_eb(costs, load, quantile)
    return _predict_mb(costs, load, quantile)


def _unstable(mode: Mode, load: EngineLoad, utilisation: float) -> LatencyPrediction:
    return LatencyPrediction(mode, load.b_cap_tokens, math.inf, math.inf, math.inf, math.inf, utilisation)


def _predict_mb(costs: CostModel, load: EngineLoad, quantile: float) -> LatencyPrediction:
    rate, mu_l, mu_o = load.arrival_rate_per_s, load.mu_l_tokens, load.mu_o_tokens
    running, steps_per_s, chunk_s, room, chunk_share = 0.0, 0.0, costs.alpha_mb_s, 1.0, 0.0
    for _ in range(FIXED_POINT_ITERATIONS):
        # P-PAS: B_cap while ≥ DEFAULT_N_TH prefills run (Poisson with the mean Little's law gives), else B_max.
        step_s = 1.0 / steps_per_s if steps_per_s > 0.0 else costs.alpha_mb_s
        room_cap = max(1.0, load.b_cap_tokens - running)
        room_max = max(1.0, load.b_max_tokens - running)
        prefills = rate * step_s * max(1.0, mu_l / room_cap)
        pressure = 1.0 - math.exp(-prefills) * (1.0 + prefills)
        room = pressure * room_cap + (1.0 - pressure) * room_max
        # Chunk steps carry `room` prompt tokens (waiting prompts share one; a long prompt takes several) beside the
        # decodes, at the mixed fit read at that step's own mix; the rest of the engine's time runs decode-only
        # steps (the decode line).
        chunk_s = _mixed_step_s(costs, running, room)
        chunks_per_s = rate * mu_l / room
        chunk_share = chunks_per_s * chunk_s
        if chunk_share >= 1.0:
            return _unstable(Mode.MB, load, chunk_share)
        decode_s = costs.alpha_d_s + costs.beta_d_s_per_request * running
        steps_per_s = chunks_per_s + (1.0 - chunk_share) / decode_s
        running = rate * mu_o / steps_per_s  # every step gives each running request a token
        if running > load.max_running:
            return _unstable(Mode.MB, load, running / load.max_running)
    step_s, prompt = 1.0 / steps_per_s, prompt_quantile_tokens(load, quantile)
    # Its own prompt: its chunks of `room` tokens, or one step when shorter; then the wait behind others' chunks.
    chunks = max(1.0, prompt / room)
    ttft_s = step_s + chunks * _mixed_step_s(costs, running, prompt / chunks)
    token_s = chunk_s / room  # a prompt token's share of a chunk step: the prompts' service
    ttft_s += _wait_quantile_s(rate, token_s * token_s * PROMPT_SECOND_MOMENT * mu_l * mu_l, chunk_share, quantile)
    return LatencyPrediction(Mode.MB, load.b_cap_tokens, ttft_s, step_s, step_s, running, chunk_share)


def _mixed_step_s(costs: CostModel, decodes: float, prompt_tokens: float) -> float:
    """A mixed step's time: α_MB + β_MB^e(r)·tokens at its own decode ratio r (the slope never below 0)."""
    tokens = decodes + prompt_tokens
    return costs.alpha_mb_s + max(0.0, costs.beta_mb_e(decodes / tokens)) * tokens


def _wait_quantile_s(rate: float, second_moment_s2: float, utilisation: float, quantile: float) -> float:
    """The q-quantile of an M/G/1 queue's wait: Pollaczek–Khinchine's mean λ·E[S²]/(2(1 − ρ)) for those who
    wait (probability ρ), with an exponential tail."""
    if utilisation <= 0.0 or utilisation <= 1.0 - quantile:
        return 0.0
    mean_s = rate * second_moment_s2 / (2.0 * (1.0 - utilisation))
    return mean_s / utilisation * math.log(utilisation / (1.0 - quantile))


def _predict_eb(costs: CostModel, load: EngineLoad, quantile: float) -> LatencyPrediction:
    rate, mu_l, mu_o = load.arrival_rate_per_s, load.mu_l_tokens, load.mu_o_tokens
    running, decode_s, share, batch = 0.0, costs.alpha_d_s, 0.0, 1.0
    for _ in range(FIXED_POINT_ITERATIONS):
        decode_s = costs.alpha_d_s + costs.beta_d_s_per_request * running
        batch = min(float(load.k), 1.0 + rate * decode_s)
        share = rate * (costs.beta_p_s_per_token * mu_l + costs.alpha_p_s / batch)
        if share >= 1.0:
            return _unstable(Mode.EB, load, share)
        running = rate * mu_o * decode_s / (1.0 - share)
        if running > load.max_running:
            return _unstable(Mode.EB, load, running / load.max_running)
    prefill_s = costs.alpha_p_s + costs.beta_p_s_per_token * (prompt_quantile_tokens(load, quantile)
                                                               + (batch - 1.0) * mu_l)
    ttft_s = quantile * decode_s + prefill_s
    ttft_s += _wait_quantile_s(rate, (costs.beta_p_s_per_token * mu_l) ** 2 * PROMPT_SECOND_MOMENT, share, quantile)
    if load.max_running - running < load.k and rate > 0.0:  # saturated: a refill waits for k completions
        ttft_s += quantile * load.k / rate
    return LatencyPrediction(Mode.EB, load.b_cap_tokens, ttft_s, decode_s / (1.0 - share), decode_s, running, share)
