"""How `ctl` shows engines and decisions: the rows of `list`, the fields of `get`, the lines of `watch`."""

from __future__ import annotations

import json
from typing import Any

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli import output


class WatchPrinter:
    """Rows of `watch`: a fixed-width line per decision (table), or one JSON/YAML document per decision."""

    _COLUMNS = ("EVENT", "ENGINE", "MODE", "K", "N", "B_MAX", "B_CAP", "δ", "VERSION", "REASON", "DECIDED AT")

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._versions: dict[str, int] = {}
        self._header = False

    def seen(self, engine_id: str, version: int) -> bool:
        return version <= self._versions.get(engine_id, 0)

    def show(self, row: dict[str, Any], *, event: str) -> None:
        if row["decision_version"]:
            self._versions[row["engine_id"]] = max(self._versions.get(row["engine_id"], 0), row["decision_version"])
        data = {"event": event, **row}
        if self._fmt == "json":
            print(json.dumps(data, ensure_ascii=False), flush=True)
            return
        if self._fmt == "yaml":
            print("---", flush=True)
            output.print_data(data, "yaml")
            return
        cells = [event, row["engine_id"], row["mode"], row["k"], row["n"], row["b_max_tokens"], row["b_cap_tokens"],
                 row["delta_s_per_token"], row["decision_version"], row["reason"], row["decided_at"]]
        widths = (9, 34, 12, 6, 6, 7, 7, 10, 20, 20, 24)
        if not self._header:
            print("  ".join(f"{c:<{w}}" for c, w in zip(self._COLUMNS, widths, strict=True)).rstrip(), flush=True)
            self._header = True
        print("  ".join(f"{output.cell_text(c):<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip(),
              flush=True)


def engine_info_dict(info: operator_pb2.EngineInfo) -> dict[str, Any]:
    data = output.message_to_dict(info)
    if data["telemetry_age_s"] < 0:
        data["telemetry_age_s"] = None  # no telemetry yet
    return data


def engine_row(info: operator_pb2.EngineInfo | None, view: operator_pb2.DecisionView | None) -> dict[str, Any]:
    """One `list` row: the engine (when known) and the decision in force (null fields when none)."""
    row: dict[str, Any]
    if info is not None:
        row = engine_info_dict(info)
    else:
        assert view is not None
        row = {"engine_id": view.engine_id, "pool": output.message_to_dict(view.pool), "decision_version":
               view.decision.version, "acked_version": view.acked_version}
    decision = view.decision if view is not None else None
    budget = decision.budget if decision is not None else None
    row.update({
        "mode": output.enum_name(common_pb2.Mode.DESCRIPTOR, decision.mode) if decision else None,
        "k": decision.k if decision else None,
        "n": decision.n if decision else None,
        "b_max_tokens": budget.b_max_tokens if budget else None,
        "b_cap_tokens": budget.b_cap_tokens if budget else None,
        "delta_s_per_token": decision.delta_s_per_token if decision else None,
        "delta_source": decision.delta_source if decision else None,
        "reason": decision.reason if decision else None,
        "decided_at": output.iso_utc(decision.decided_at_s) if decision else None,
        "decided_at_s": decision.decided_at_s if decision else None,
    })
    if decision is not None and info is None:
        row["decision_version"] = decision.version
    return row


def vllm_cell(row: dict[str, Any]) -> str | None:
    """The VLLM column of `list`: the engine's vLLM version and its agent's support level ("0.32.0 full",
    "0.33.0 stock"); the version alone when the agent did not report a level; None when neither is known."""
    support = row.get("support") or {}
    parts = [part for part in (row.get("vllm_version"), support.get("level")) if part]
    return " ".join(parts) or None


def list_cells(row: dict[str, Any]) -> list[Any]:
    age = row.get("telemetry_age_s")
    pool = row["pool"]
    return [row["engine_id"], output.pool_text(pool), row.get("connected"), vllm_cell(row),
            row["mode"], row["k"], row["n"], row["b_max_tokens"], row["b_cap_tokens"], row["delta_s_per_token"],
            row["decision_version"], row.get("acked_version"), f"{age:.1f}s" if age is not None else None]


def get_fields(data: dict[str, Any]) -> list[tuple[str, Any]]:
    decision = data["decision"] or {}
    latest = data["latest"] or {}
    budget = decision.get("budget") or {}
    engine = data.get("engine") or {}
    return [
        ("engine", data["engine_id"]), ("pool", output.pool_text(data["pool"])),
        ("connected", engine.get("connected")), ("mode", decision.get("mode")), ("k", decision.get("k")),
        ("n", decision.get("n")), ("b_max_tokens", budget.get("b_max_tokens")),
        ("b_cap_tokens", budget.get("b_cap_tokens")), ("delta_s_per_token", decision.get("delta_s_per_token")),
        ("delta_source", decision.get("delta_source")), ("advisory", decision.get("advisory")),
        ("reason", decision.get("reason")), ("flags", decision.get("flags")), ("version", decision.get("version")),
        ("acked_version", data["acked_version"]), ("decided_at", decision.get("decided_at")),
        ("ttl_s", decision.get("ttl_s")), ("trace_id", decision.get("trace_id")),
        ("latest_reason", latest.get("reason")), ("latest_flags", latest.get("flags")),
        ("computed_at", data.get("computed_at")),
        ("telemetry_age_s", engine.get("telemetry_age_s")), ("vllm_version", engine.get("vllm_version")),
        ("support", (engine.get("support") or {}).get("level")),
        ("support_missing", (engine.get("support") or {}).get("missing")),
        ("max_num_seqs", (engine.get("limits") or {}).get("max_num_seqs")),
    ]
