"""The Hello's support verdict at the controller: validation of hostile fields, the registry entry other
replicas read, and how `ctl list` and `ctl get` show it."""

from __future__ import annotations

import pytest

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.cli.rows import engine_row, get_fields, list_cells, vllm_cell
from controlplane.loop.ingest import EngineSupport, TelemetryError, validate_hello
from controlplane.protocol import MAX_SUPPORT_DETAIL_CHARS, MAX_SUPPORT_MISSING, MAX_SUPPORT_NAME_CHARS
from controlplane.service.fleet_view import engine_info_from_registry, registry_fields, support_message

LIMITS = agent_pb2.EngineLimits(max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=4096,
                                block_size_tokens=16, max_model_len_tokens=1024)
STOCK = agent_pb2.SUPPORT_LEVEL_STOCK


def _hello(**support: object) -> agent_pb2.Hello:
    hello = agent_pb2.Hello(engine_id="e-1", pool=common_pb2.Pool(model="m", accelerator="gpu"),
                            vllm_version="0.33.0", agent_version="0.1.0", limits=LIMITS)
    if support:
        hello.support.CopyFrom(agent_pb2.AgentSupport(**support))
    return hello


def test_an_agent_that_sends_no_verdict_is_served_as_before() -> None:
    assert validate_hello(_hello()).support is None


@pytest.mark.parametrize(("level", "name"), [(agent_pb2.SUPPORT_LEVEL_FULL, "full"),
                                             (agent_pb2.SUPPORT_LEVEL_DEGRADED, "degraded"), (STOCK, "stock")])
def test_each_level_is_kept_by_name(level: int, name: str) -> None:
    missing = [] if name == "full" else ["Scheduler.max_num_active_reqs"]
    support = validate_hello(_hello(level=level, missing=missing, detail="d")).support
    assert support == EngineSupport(level=name, missing=tuple(missing), detail="d")
    assert support.stock == (name == "stock")


def test_the_largest_verdict_the_bounds_allow_is_accepted() -> None:
    missing = [f"{i:03d}" + "n" * (MAX_SUPPORT_NAME_CHARS - 3) for i in range(MAX_SUPPORT_MISSING)]
    support = validate_hello(_hello(level=STOCK, missing=missing, detail="é" * MAX_SUPPORT_DETAIL_CHARS)).support
    assert support is not None and len(support.missing) == MAX_SUPPORT_MISSING


@pytest.mark.parametrize(("field", "support"), [
    ("hello.support.level", {"level": 0}),
    ("hello.support.level", {"level": 7}),
    ("hello.support.missing", {"level": STOCK, "missing": ["X.y"] * (MAX_SUPPORT_MISSING + 1)}),
    ("hello.support.missing", {"level": STOCK, "missing": ["X.y"] * 100_000}),
    ("hello.support.missing[1]", {"level": STOCK, "missing": ["X.y", "n" * (MAX_SUPPORT_NAME_CHARS + 1)]}),
    ("hello.support.missing[0]", {"level": STOCK, "missing": ["m" * 1_000_000]}),
    ("hello.support.missing[0]", {"level": STOCK, "missing": [""]}),
    ("hello.support.missing[0]", {"level": STOCK, "missing": ["Scheduler.\x1b[31mred"]}),
    ("hello.support.missing[0]", {"level": STOCK, "missing": ["a\nforged log line"]}),
    ("hello.support.missing[0]", {"level": STOCK, "missing": ["nul\x00"]}),
    ("hello.support.missing", {"level": agent_pb2.SUPPORT_LEVEL_FULL, "missing": ["X.y"]}),
    ("hello.support.detail", {"level": STOCK, "detail": "d" * (MAX_SUPPORT_DETAIL_CHARS + 1)}),
    ("hello.support.detail", {"level": STOCK, "detail": "line one\nline two"}),
    ("hello.support.detail", {"level": STOCK, "detail": "\x07bell"}),
], ids=["unspecified", "unknown_level", "65_names", "100k_names", "long_name", "1mb_name", "empty_name",
        "escape_sequence", "newline", "nul", "full_with_missing", "long_detail", "detail_newline", "detail_bell"])
def test_a_hostile_verdict_refuses_the_hello_with_a_bounded_message(field: str, support: dict[str, object]) -> None:
    with pytest.raises(TelemetryError) as caught:
        validate_hello(_hello(**support))
    assert caught.value.field == field and caught.value.cause == "bad_hello"
    assert str(caught.value).startswith(field) and len(str(caught.value)) <= 200
    assert "\n" not in str(caught.value) and "\x1b" not in str(caught.value)


def _info(support: agent_pb2.AgentSupport | None) -> operator_pb2.EngineInfo:
    info = operator_pb2.EngineInfo(engine_id="e-1", pool=common_pb2.Pool(model="m", accelerator="gpu"),
                                   connected=True, vllm_version="0.33.0", agent_version="0.1.0", limits=LIMITS,
                                   controller_id="cp-0", telemetry_age_s=-1.0)
    if support is not None:
        info.support.CopyFrom(support)
    return info


def test_the_registry_carries_the_verdict_to_the_other_replicas() -> None:
    support = support_message(EngineSupport(level="stock", missing=("Scheduler.max_num_active_reqs",), detail="d"))
    fields = registry_fields(_info(support), now_s=100.0)
    seen = engine_info_from_registry("e-1", fields, now_s=101.0)
    assert seen.support == support and seen.vllm_version == "0.33.0"
    # An entry of a replica that does not write it, or writes what cannot be read: no verdict.
    for text in (None, "", "not json", '{"level": "sideways"}', '{"level": "stock", "missing": "abc"}', "[]"):
        entry = {k: v for k, v in fields.items() if k != "support"}
        if text is not None:
            entry["support"] = text
        assert not engine_info_from_registry("e-1", entry, now_s=101.0).HasField("support"), text
    assert "support" not in registry_fields(_info(None), now_s=100.0)


@pytest.mark.parametrize(("support", "cell"), [
    (agent_pb2.AgentSupport(level=STOCK, missing=["Scheduler.max_num_active_reqs"]), "0.33.0 stock"),
    (agent_pb2.AgentSupport(level=agent_pb2.SUPPORT_LEVEL_FULL), "0.33.0 full"),
    (None, "0.33.0"),
])
def test_list_shows_the_version_and_the_level(support: agent_pb2.AgentSupport | None, cell: str) -> None:
    row = engine_row(_info(support), None)
    assert vllm_cell(row) == cell and list_cells(row)[3] == cell
    fields = dict(get_fields({"engine_id": "e-1", "pool": row["pool"], "decision": None, "latest": None,
                              "acked_version": 0, "engine": row}))
    assert fields["support"] == (cell.split()[1] if " " in cell else None)
    if support is not None and support.missing:
        assert fields["support_missing"] == ["Scheduler.max_num_active_reqs"]
    assert vllm_cell({"engine_id": "x", "pool": row["pool"]}) is None  # an engine known only by its decision
