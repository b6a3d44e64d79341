"""Operators' overrides: which is in force for one engine (precedence), and what makes one valid (pure)."""

from __future__ import annotations

import math
from dataclasses import replace

from controlplane.api.v1 import operator_pb2
from controlplane.core.types import DELTA_LIMIT_S_PER_TOKEN, DeltaSource, Mode, ModePin, OperatorIntent
from controlplane.loop.objective_records import objective_problem
from controlplane.protocol import pool_key_of_message

PIN_TO_MODE = {operator_pb2.PINNED_MODE_MB: Mode.MB, operator_pb2.PINNED_MODE_EB: Mode.EB,
               operator_pb2.PINNED_MODE_PASSTHROUGH: Mode.PASSTHROUGH}
SCOPE_TO_SOURCE = {operator_pb2.SCOPE_KIND_FLEET: DeltaSource.FLEET, operator_pb2.SCOPE_KIND_POOL: DeltaSource.POOL,
                   operator_pb2.SCOPE_KIND_ENGINE: DeltaSource.ENGINE}
_NO_INTENT = OperatorIntent()
# How specific each scope is: the most specific live override of a kind wins.
SCOPE_RANK = {operator_pb2.SCOPE_KIND_ENGINE: 3, operator_pb2.SCOPE_KIND_POOL: 2, operator_pb2.SCOPE_KIND_FLEET: 1}


def resolve_intent(records: list[operator_pb2.OverrideRecord], *, engine_id: str, pool_key: str,
                   now_s: float, default: OperatorIntent = _NO_INTENT) -> OperatorIntent:
    """The overrides in force for one engine: per kind, the most specific live scope wins (engine > pool > fleet);
    a kind with no live override keeps `default`'s (the twin's own settings; the controller's are empty)."""
    best: dict[int, operator_pb2.OverrideRecord] = {}
    for record in records:
        if record.cleared or (record.expires_at_s > 0 and record.expires_at_s <= now_s):
            continue
        scope = record.scope
        if scope.kind == operator_pb2.SCOPE_KIND_ENGINE and scope.engine_id != engine_id:
            continue
        scope_pool = pool_key_of_message(scope.pool)
        if scope.kind == operator_pb2.SCOPE_KIND_POOL and scope_pool != pool_key:
            continue
        current = best.get(record.kind)
        if current is None or SCOPE_RANK.get(scope.kind, 0) > SCOPE_RANK.get(current.scope.kind, 0):
            best[record.kind] = record
    delta_record = best.get(operator_pb2.OVERRIDE_KIND_DELTA)
    pin_record = best.get(operator_pb2.OVERRIDE_KIND_PIN)
    pin = default.pin
    if pin_record is not None:
        pin = ModePin(
            mode=PIN_TO_MODE.get(pin_record.mode),
            k=pin_record.k or None,
            n=pin_record.n or None,
            advisory=pin_record.mode == operator_pb2.PINNED_MODE_ADVISORY,
        )
    if delta_record is None:  # the default's δ, and its budget: a δ override replaces both (policy.py's precedence)
        return replace(default, pin=pin)
    return OperatorIntent(delta_s_per_token=delta_record.delta_s_per_token,
                          delta_source=SCOPE_TO_SOURCE[delta_record.scope.kind], pin=pin)


# ---- validation: every rule an override must satisfy, checked once, before anything is written ----

# Bounds of a pinned k or n, requests: far above any engine's slot count, far below uint32.
MAX_PINNED_REQUESTS = 1 << 20
MAX_REASON_CHARS = 1024
# The longest an override may be set for (0: never expires): about ten years. Longer lifetimes overflow
# the store's millisecond expiry and say nothing "never" does not.
MAX_EXPIRES_IN_S = 10 * 366 * 24 * 3600.0
PINNABLE_MODES = (operator_pb2.PINNED_MODE_MB, operator_pb2.PINNED_MODE_EB, operator_pb2.PINNED_MODE_PASSTHROUGH,
                  operator_pb2.PINNED_MODE_ADVISORY)
OVERRIDE_KINDS = (operator_pb2.OVERRIDE_KIND_DELTA, operator_pb2.OVERRIDE_KIND_PIN,
                  operator_pb2.OVERRIDE_KIND_OBJECTIVE)


class OverrideError(ValueError):
    """An override request is invalid; the message names the field and what is allowed."""


def expiry_at(expires_in_s: float, now_s: float) -> float:
    """The absolute expiry of an override set at now_s for expires_in_s seconds (0: never, returns 0)."""
    if not (math.isfinite(expires_in_s) and 0.0 <= expires_in_s <= MAX_EXPIRES_IN_S):
        raise OverrideError(f"expires_in_s must be a finite number in [0, {MAX_EXPIRES_IN_S:.0f}] seconds "
                            f"(0: never expires), got {expires_in_s}")
    return now_s + expires_in_s if expires_in_s > 0 else 0.0


def check_reason(reason: str) -> None:
    """A reason is at most MAX_REASON_CHARS printable characters (no newline, tab, NUL or terminal escape:
    it is shown in audit listings and must not forge or corrupt their rows)."""
    if len(reason) > MAX_REASON_CHARS:
        raise OverrideError(f"reason is longer than {MAX_REASON_CHARS} characters ({len(reason)})")
    if not reason.isprintable():
        bad = next(c for c in reason if not c.isprintable())
        raise OverrideError(f"reason must be printable text: it holds the control character U+{ord(bad):04X} "
                            f"(no newline, tab, NUL or escape sequences)")


def check_kind(kind: int) -> None:
    if kind not in OVERRIDE_KINDS:
        raise OverrideError("kind must be OVERRIDE_KIND_DELTA, OVERRIDE_KIND_PIN or OVERRIDE_KIND_OBJECTIVE")


def check_override(record: operator_pb2.OverrideRecord, *, now_s: float) -> None:
    """Raise OverrideError naming the field when `record` may not be stored: an unknown kind, δ outside
    ±DELTA_LIMIT_S_PER_TOKEN, a pin without a defined mode, k or n above MAX_PINNED_REQUESTS, k above n, an
    expiry in the past or beyond MAX_EXPIRES_IN_S, a reason that is not printable text. The scope is checked
    by its key (`store.keys.scope_key`)."""
    check_kind(record.kind)
    if record.kind == operator_pb2.OVERRIDE_KIND_OBJECTIVE:
        problem = objective_problem(record.objective)
        if problem is not None:
            raise OverrideError(problem)
    elif record.kind == operator_pb2.OVERRIDE_KIND_DELTA:
        value = record.delta_s_per_token
        if not (math.isfinite(value) and abs(value) <= DELTA_LIMIT_S_PER_TOKEN):
            raise OverrideError(f"delta_s_per_token must be finite and within ±{DELTA_LIMIT_S_PER_TOKEN} s/token, "
                                f"got {value}")
    else:
        if record.mode not in PINNABLE_MODES:
            raise OverrideError(f"mode {record.mode} is not a mode a pin may take: PINNED_MODE_MB, _EB, "
                                f"_PASSTHROUGH or _ADVISORY")
        for name, value in (("n", record.n), ("k", record.k)):
            if value > MAX_PINNED_REQUESTS:
                raise OverrideError(f"{name}={value} is above the limit of a pin ({MAX_PINNED_REQUESTS} requests)")
        if record.k and record.n and record.k > record.n:
            raise OverrideError(f"k={record.k} must not exceed n={record.n}")
    if record.expires_at_s and not (math.isfinite(record.expires_at_s)
                                     and now_s < record.expires_at_s <= now_s + MAX_EXPIRES_IN_S):
        raise OverrideError(f"expires_at_s {record.expires_at_s} is not within (now, now + {MAX_EXPIRES_IN_S:.0f} s]")
    check_reason(record.reason)
