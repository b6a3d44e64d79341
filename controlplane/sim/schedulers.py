"""The schedulers the twin compares, each expressed as what the real system would do: an engine start-up
shape plus a control (no decision, one fixed decision, or the core policy online).

Spellings (`parse_scheduler`):
  v1               stock vLLM v1: mixed batching, decodes first, chunked prefill fills the budget.
  v0               exclusive batching with k = 1 (vLLM v0 under saturation), N = max_num_seqs.
  eb:K[:N]         exclusive batching with a fixed k (and N; default max_num_seqs).
  eb-kstar         EB(k̂*): the core policy online, mode pinned to EB (OperatorIntent pin).
  eb+[:DELTA]      EB+: the core policy online choosing EB or MB (δ in s/token, default 0).
  mbt:B            stock vLLM with a start-up token budget of B tokens (fixed MBT).
  ppas:BMAX:BCAP[:NTH]   P-PAS: MB with B_max/B_cap and N_th (default 2), start-up budget B_max.
  ppas+:BMAX:BCAP[:NTH]  P-PAS+: also the large-residual-prefill condition, T_large = max_model_len / 2.
Every option may be followed by "@n=<max_num_seqs>" and/or "@b=<start-up budget>", e.g. "v1@n=512"; the
online ones also by "@tmin=<θ_min>" (the policy's θ clip floor, default PolicyConfig's 0.01),
"@guard=off" (no memory guard: N̂* in force even while the engine preempts) and "@role=producer|consumer|both"
(the engine's role in disaggregated prefill/decode, as its Hello would report it: `controlplane.core.kv_role`).

Every decision goes through `Enforcer.apply`, exactly as the agent receives it. Pure; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from controlplane.api.v1 import common_pb2
from controlplane.core.types import Mode, ModePin, OperatorIntent, PolicyConfig
from controlplane.loop.buckets import BucketStats
from controlplane.protocol import KvRole
from controlplane.sim.control import OnlineControl, OnlineSettings, StaticControl
from controlplane.sim.profiles import EngineShape, SimProfile

STATIC_TTL_S = 1e9


@dataclass(frozen=True, slots=True)
class SchedulerSpec:
    """One scheduler: `kind` in {stock, eb, online-eb, online-ebplus, mb}, its parameters, and start-up
    overrides (0: the profile's). warm_start: for the online kinds, a persisted pool window to start from
    (`RunResult.pool_window` of an earlier run; None: a pool with no history). kv_role: for the online kinds,
    the engine's KV-transfer role (NONE: a whole engine)."""

    name: str
    kind: str
    k: int = 0
    n: int = 0
    b_max_tokens: int = 0
    b_cap_tokens: int = 0
    n_th: int = 2
    ppas_plus: bool = False
    delta_s_per_token: float | None = None
    max_num_seqs: int = 0
    budget_tokens: int = 0
    policy: PolicyConfig | None = None
    warm_start: BucketStats | None = None
    kv_role: KvRole = KvRole.NONE

    def shape_for(self, profile: SimProfile) -> EngineShape:
        """The engine's start-up limits under this scheduler."""
        shape = profile.shape
        if self.max_num_seqs:
            shape = replace(shape, max_num_seqs=self.max_num_seqs)
        budget = self.budget_tokens or (self.b_max_tokens if self.kind == "mb" else 0)
        if budget:
            shape = replace(shape, max_num_batched_tokens=budget)
        return shape

    def create_control(self, profile: SimProfile, shape: EngineShape) -> StaticControl | OnlineControl:
        """A fresh control for one run. Raises ValueError for parameters the engine cannot hold."""
        if self.kind == "stock":
            return StaticControl(None)
        if self.kind in ("online-eb", "online-ebplus"):
            pin = ModePin(mode=Mode.EB) if self.kind == "online-eb" else ModePin()
            intent = OperatorIntent(delta_s_per_token=self.delta_s_per_token, pin=pin)
            return OnlineControl(profile.costs, OnlineSettings(intent=intent, policy=self.policy or PolicyConfig(),
                                                               warm_start=self.warm_start, kv_role=self.kv_role))
        n = self.n or shape.max_num_seqs
        if self.kind == "eb":
            if not 1 <= self.k <= n <= shape.max_num_seqs:
                raise ValueError(f"{self.name}: need 1 ≤ k ≤ N ≤ max_num_seqs ({shape.max_num_seqs})")
            return StaticControl(common_pb2.Decision(version=1, mode=common_pb2.MODE_EB, k=self.k, n=n,
                                                     ttl_s=STATIC_TTL_S, reason="sim_fixed"))
        t_large = shape.max_model_len_tokens // 2 if self.ppas_plus else 0
        budget = common_pb2.BudgetPolicy(b_max_tokens=self.b_max_tokens, b_cap_tokens=self.b_cap_tokens,
                                         n_th=self.n_th, t_large_tokens=t_large, n_d_large=2)
        return StaticControl(common_pb2.Decision(version=1, mode=common_pb2.MODE_MB, k=1, n=n, budget=budget,
                                                 ttl_s=STATIC_TTL_S, reason="sim_fixed"))


def _ints(parts: list[str], what: str) -> list[int]:
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{what}: expected integers, got {':'.join(parts)!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{what}: values must be ≥ 1")
    return values


def parse_scheduler(text: str) -> SchedulerSpec:
    """Parse a scheduler spelling (see the module docstring). Raises ValueError naming the problem."""
    base, *options = text.strip().split("@")
    overrides: dict[str, object] = {}
    policy: dict[str, object] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if key not in ("n", "b", "tmin", "guard", "role") or not sep:
            raise ValueError(f"scheduler {text!r}: options are @n=<max_num_seqs>, @b=<budget tokens>, @tmin=<θ_min>, "
                             "@guard=on|off, @role=producer|consumer|both")
        if key == "tmin":
            try:
                policy["theta_min"] = float(value)
            except ValueError:
                raise ValueError(f"scheduler {text!r}: θ_min must be a number") from None
        elif key == "role":
            if value not in ("producer", "consumer", "both"):
                raise ValueError(f"scheduler {text!r}: @role takes producer, consumer or both")
            overrides["kv_role"] = KvRole(value)
        elif key == "guard":
            if value not in ("on", "off"):
                raise ValueError(f"scheduler {text!r}: @guard takes on or off")
            policy["memory_guard"] = value == "on"
        else:
            overrides["max_num_seqs" if key == "n" else "budget_tokens"] = _ints([value], f"scheduler {text!r}")[0]
    if policy:
        try:
            overrides["policy"] = PolicyConfig(**policy)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ValueError(f"scheduler {text!r}: {exc}") from None
    head, *args = base.split(":")
    head = head.lower()
    name = text.strip()
    if head == "v1" and not args:
        spec = SchedulerSpec(name, "stock")
    elif head == "v0" and not args:
        spec = SchedulerSpec(name, "eb", k=1)
    elif head == "eb" and 1 <= len(args) <= 2:
        values = _ints(args, f"scheduler {text!r}")
        spec = SchedulerSpec(name, "eb", k=values[0], n=values[1] if len(values) == 2 else 0)
    elif head == "eb-kstar" and not args:
        spec = SchedulerSpec(name, "online-eb")
    elif head == "eb+" and len(args) <= 1:
        delta = None
        if args:
            try:
                delta = float(args[0])
            except ValueError:
                raise ValueError(f"scheduler {text!r}: δ must be a number (s/token)") from None
            if not math.isfinite(delta):
                raise ValueError(f"scheduler {text!r}: δ must be finite")
        spec = SchedulerSpec(name, "online-ebplus", delta_s_per_token=delta)
    elif head == "mbt" and len(args) == 1:
        spec = SchedulerSpec(name, "stock", budget_tokens=_ints(args, f"scheduler {text!r}")[0])
    elif head in ("ppas", "ppas+") and len(args) in (2, 3):
        values = _ints(args, f"scheduler {text!r}")
        if values[1] > values[0]:
            raise ValueError(f"scheduler {text!r}: B_cap must be ≤ B_max")
        spec = SchedulerSpec(name, "mb", b_max_tokens=values[0], b_cap_tokens=values[1],
                             n_th=values[2] if len(values) == 3 else 2, ppas_plus=head == "ppas+")
    else:
        raise ValueError(f"unknown scheduler {text!r}: v1, v0, eb:K[:N], eb-kstar, eb+[:DELTA], mbt:B, "
                         "ppas:BMAX:BCAP[:NTH], ppas+:BMAX:BCAP[:NTH]")
    if ("policy" in overrides or "kv_role" in overrides) and not spec.kind.startswith("online"):
        raise ValueError(f"scheduler {text!r}: @tmin, @guard and @role apply to eb-kstar and eb+ only")
    return replace(spec, **overrides) if overrides else spec  # type: ignore[arg-type]
