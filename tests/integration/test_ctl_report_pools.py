"""`controlplane ctl report` for a fleet of several engines in two pools, against a real controller: one explain
table per pool holding the terms its engines share, one table of the terms that differ with a row per engine,
and timelines whose N and k lines stand on labelled axes spanning the pool's values."""

from __future__ import annotations

import asyncio
import sys
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path

import grpc
import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.explain import explain
from controlplane.cli.output import cell_text
from tests.integration.controller_harness import (
    AgentStream,
    calibration_for,
    geometric_batch,
    is_data_driven,
    make_config,
    operator_stub,
    running_controller,
)

RTX = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
H200 = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
# engine id → (pool, running requests it reports): the pools' engines differ in occupancy only.
ENGINES = {"rtx-a": (RTX, 200), "rtx-b": (RTX, 500), "rtx-c": (RTX, 900), "h200-a": (H200, 300),
           "h200-b": (H200, 700)}


def _key(pool: common_pb2.Pool) -> str:
    return f"{pool.model}|{pool.accelerator}"


class ReportDom(HTMLParser):
    """The explain tables (by class and pool: header terms, rows of cell texts with their attributes) and the
    timelines (axes' maxima and tick values, the k-line's points, the decisions' k and N)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[tuple[str, str], dict] = {}
        self.timelines: dict[str, dict] = {}
        self._table: dict | None = None
        self._row: dict | None = None
        self._cell: list[str] | None = None
        self._svg: dict | None = None
        self._axis: dict | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        classes = values.get("class", "").split()
        if tag == "table" and {"explain", "explain-engines"} & set(classes):
            self._table = {"attrs": values, "terms": [], "rows": []}
            self.tables[(classes[0], values.get("data-pool", ""))] = self._table
        elif self._table is not None and tag == "th" and "data-term" in values:
            self._table["terms"].append(values["data-term"])
        elif self._table is not None and tag == "tr" and ("data-term" in values or "data-engine-id" in values):
            self._row = {"attrs": values, "cells": []}
            self._table["rows"].append(self._row)
        elif self._row is not None and tag == "td":
            self._cell = []
        elif tag == "svg" and "timeline" in classes:
            self._svg = {"pool": values["data-pool"], "axes": {}, "k_points": [], "decisions": []}
            self.timelines[values["data-engine-id"]] = self._svg
        elif self._svg is not None and tag == "g" and "axis" in classes:
            self._axis = {"max": int(values["data-max"]), "ticks": {}}
            self._svg["axes"][classes[-1].removeprefix("axis-")] = self._axis
        elif self._axis is not None and tag == "text" and "tick" in classes:
            self._axis["ticks"][int(values["data-value"])] = float(values["y"]) - 3
        elif self._svg is not None and tag == "polyline" and "k-line" in classes:
            self._svg["k_points"] = [tuple(map(float, p.split(","))) for p in values["points"].split()]
        elif self._svg is not None and tag == "circle" and "decision" in classes:
            self._svg["decisions"].append((int(values["data-k"]), int(values["data-n"])))

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._row is not None:
            self._row["cells"].append("".join(self._cell))
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "g":
            self._axis = None
        elif tag == "svg":
            self._svg = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _fits(views: dict[str, dict]) -> dict[str, set]:
    """Per pool, the (window, p0) pairs its engines' decisions stand on."""
    fits = defaultdict(set)
    for engine_id, (pool, _) in ENGINES.items():
        fits[_key(pool)].add((views[engine_id]["window"]["text"], views[engine_id]["terms"]["p0_per_token"]))
    return dict(fits)


async def _views(stub) -> dict[str, dict]:
    """Each engine's explain view, by engine id."""
    return {engine_id: explain(await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id)))
            for engine_id in ENGINES}


async def _fits_once_shared(stub) -> dict[str, set]:
    """The pools' fits once each pool's engines stand on one (within 10 s)."""
    for _ in range(100):
        fits = _fits(await _views(stub))
        if all(len(fit) == 1 for fit in fits.values()):
            return fits
        await asyncio.sleep(0.1)
    raise AssertionError(f"a pool's engines never stood on one fit: {fits}")


async def _fleet_report(redis_url: str, out: Path) -> dict[str, dict]:
    """Run the fleet to data-driven decisions, write the report to `out`; each engine's explain view."""
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        for pool in (RTX, H200):
            await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration_for(pool)))
        agents = {engine_id: await AgentStream(channel, engine_id, pool).open()
                  for engine_id, (pool, _) in ENGINES.items()}
        for agent in agents.values():
            await agent.next_decision()
        for i, (engine_id, (_, running)) in enumerate(ENGINES.items()):
            rng = np.random.default_rng(20 + i)
            for seq in range(1, 9):
                await agents[engine_id].send_batch(geometric_batch(seq, rng, num=250, num_running=running))
        for agent in agents.values():
            await agent.next_decision(where=is_data_driven, timeout_s=20)
        # The history is written behind the push: wait until every engine has a data-driven decision there.
        for _ in range(100):
            history = (await stub.ListHistory(operator_pb2.ListHistoryRequest(limit=2000))).entries
            if {h.engine_id for h in history if is_data_driven(h.decision)} == set(ENGINES):
                break
            await asyncio.sleep(0.1)
        # A pool's engines are decided from its refreshes one by one: on a loaded machine one engine can still carry
        # the previous refresh's window when the report is taken, and a refresh can land while it is taken. Take it
        # once each pool's engines share one fit, and again if any engine's decision moved while it was taken.
        for _ in range(5):
            before = await _fits_once_shared(stub)
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "controlplane", "ctl", "--address", ctl.address, "report", "--out", str(out),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(process.communicate(), 120)
            assert process.returncode == 0, err.decode()
            views = await _views(stub)
            if _fits(views) == before:
                break
        for agent in agents.values():
            await agent.close()
    return views


async def test_report_explains_each_pool_once_with_its_engines_differences(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    views = await _fleet_report(redis_url, out)
    dom = ReportDom()
    dom.feed(out.read_text(encoding="utf-8"))

    pools: dict[str, list[str]] = defaultdict(list)
    for engine_id, (pool, _) in ENGINES.items():
        pools[_key(pool)].append(engine_id)
    assert sorted(key for kind, key in dom.tables if kind == "explain") == sorted(pools)  # one per pool
    for key, engine_ids in pools.items():
        shared = {row["attrs"]["data-term"]: row["cells"] for row in dom.tables[("explain", key)]["rows"]}
        engines_table = dom.tables[("explain-engines", key)]
        differing = engines_table["terms"]
        per_engine = {row["attrs"]["data-engine-id"]: row["cells"] for row in engines_table["rows"]}
        assert sorted(per_engine) == sorted(engine_ids)
        # The pool's fit is shared; the occupancy and what follows from it differ, and nothing is in both tables.
        assert {"p0", "η", "μ_O", "θ0", "window"} <= set(shared)
        assert "N_obs" in differing and not set(shared) & set(differing)
        for engine_id in engine_ids:
            view = views[engine_id]
            assert shared["p0"][1] == cell_text(view["terms"]["p0_per_token"])
            assert shared["μ_O"][1] == cell_text(view["terms"]["mu_o_tokens"])
            n_obs = per_engine[engine_id][1 + differing.index("N_obs")]
            assert n_obs == cell_text(view["terms"]["n_obs_requests"])
        assert len({per_engine[e][1 + differing.index("N_obs")] for e in engine_ids}) == len(engine_ids)

    assert set(dom.timelines) == set(ENGINES)
    for engine_id, timeline in dom.timelines.items():
        pool_decisions = [d for t in dom.timelines.values() if t["pool"] == timeline["pool"] for d in t["decisions"]]
        n_axis, k_axis = timeline["axes"]["n"], timeline["axes"]["k"]
        assert n_axis["max"] == max(n for _, n in pool_decisions)  # the axes span the pool's values
        assert k_axis["max"] == max(k for k, _ in pool_decisions) > 0
        assert {0, n_axis["max"]} <= set(n_axis["ticks"]) and {0, k_axis["max"]} <= set(k_axis["ticks"])
        # The k-line is drawn on the k axis: its largest k at that axis' height for that value.
        top_k = max(k for k, _ in timeline["decisions"])
        y_top = k_axis["ticks"][0] - top_k / k_axis["max"] * (k_axis["ticks"][0] - k_axis["ticks"][k_axis["max"]])
        assert min(y for _, y in timeline["k_points"]) == pytest.approx(y_top, abs=0.02), engine_id
