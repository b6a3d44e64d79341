"""`controlplane ctl report` draws each pool's TTFT and TPOT quantiles beside its decision timelines, against a
real controller fed by engines that stamp their requests: two samples taken while the latencies change carry
the quantiles of what was sent (within the sketch's 1%), sit on labelled axes in the right unit and on the
decision timelines' time axis, the pool's objective is drawn at its target, and a pool whose agents send no
stamps says so. (The samples the controller records are left out here: test_latency_history.py.)"""

from __future__ import annotations

import asyncio
import sys
from html.parser import HTMLParser
from pathlib import Path

import grpc
import numpy as np
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from testbench.messages import stamped_batch
from tests.integration.controller_harness import (
    AgentStream,
    geometric_batch,
    make_config,
    operator_stub,
    running_controller,
)

STAMPED = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
PLAIN = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
SAMPLE_EVERY_S = 8.0  # the second phase's latencies settle in the pool's window well within this


def _key(pool: common_pb2.Pool) -> str:
    return f"{pool.model}|{pool.accelerator}"


def _exact(values: np.ndarray, quantile: float) -> float:
    return float(np.sort(values)[int(np.floor(quantile * (values.size - 1)))])


class LatencyDom(HTMLParser):
    """The latency timelines (by pool and kind: unit, axis, title, samples, lines, objective), the latency
    sections' texts and tables, and the decision markers' (time, x) by pool."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[tuple[str, str], dict] = {}
        self.sections: dict[str, list[str]] = {}
        self.table_rows: dict[tuple[str, str], list[str]] = {}
        self.decision_x: dict[str, list[tuple[float, float]]] = {}
        self._chart: dict | None = None
        self._text: list[str] | None = None
        self._section: str | None = None
        self._row: list[str] | None = None
        self._table_pool = ""
        self._timeline_pool: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        v = {k: value or "" for k, value in attrs}
        classes = v.get("class", "").split()
        if tag == "section" and "latency" in classes:
            self._section = v["data-pool"]
            self.sections[self._section] = []
        elif tag == "svg" and "latency" in classes:
            self._chart = {"unit": v["data-unit"], "ticks": {}, "samples": [], "lines": {}, "objective": None,
                           "titles": []}
            self.charts[(v["data-pool"], v["data-kind"])] = self._chart
        elif tag == "svg" and "timeline" in classes:
            self._timeline_pool = v["data-pool"]
        elif self._timeline_pool is not None and tag == "circle" and "decision" in classes:
            self.decision_x.setdefault(self._timeline_pool, []).append((float(v["data-decided-at-s"]), float(v["cx"])))
        elif self._chart is not None and tag == "g" and "axis-latency" in classes:
            self._chart["max_s"] = float(v["data-max-s"])
        elif self._chart is not None and tag == "text" and "tick" in classes:
            self._chart["ticks"][float(v["data-value-s"])] = float(v["y"]) - 3
        elif self._chart is not None and tag == "text" and "axis-title" in classes:
            self._text = []
        elif self._chart is not None and tag == "circle" and "sample" in classes:
            assert v["data-source"] == "read", v  # the report read it (none recorded is drawn here)
            self._chart["samples"].append({k.removeprefix("data-"): float(x) for k, x in v.items()
                                           if (k.startswith("data-") and k != "data-source") or k in ("cx", "cy")})
        elif self._chart is not None and tag == "polyline":
            self._chart["lines"][classes[0]] = [tuple(map(float, p.split(","))) for p in v["points"].split()]
        elif self._chart is not None and tag == "line" and "objective" in classes:
            self._chart["objective"] = (float(v["data-quantile"]), float(v["data-target-s"]), float(v["y1"]))
        elif tag == "table" and "latency" in classes:
            self._table_pool = v["data-pool"]
        elif tag == "tr" and self._table_pool and "data-kind" in v:
            self._row = []
            self.table_rows[(self._table_pool, v["data-kind"])] = self._row
        elif tag == "td" and self._row is not None:
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "text" and self._text is not None and self._chart is not None:
            self._chart["titles"].append("".join(self._text))
            self._text = None
        elif tag == "td" and self._text is not None and self._row is not None:
            self._row.append("".join(self._text))
            self._text = None
        elif tag == "svg":
            self._chart = self._timeline_pool = None
        elif tag == "section":
            self._section = None
        elif tag == "table":
            self._table_pool, self._row = "", None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)
        if self._section is not None:
            self.sections[self._section].append(data)


async def _settled(stub, engine_id: str, num_requests: int) -> None:
    """Wait until the engine's pool window holds num_requests TTFTs (its buckets closed and settled)."""
    for _ in range(100):
        view = await stub.GetDecision(operator_pb2.GetDecisionRequest(engine_id=engine_id))
        if view.outcomes.ttft.num_requests == num_requests:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the pool window never held {num_requests} TTFTs: {view.outcomes}")


async def test_report_draws_each_pools_latency_timeline_with_the_sampled_quantiles(redis_url: str,
                                                                                   tmp_path: Path) -> None:
    rng = np.random.default_rng(21)
    out = tmp_path / "report.html"
    phases: list[tuple[np.ndarray, np.ndarray]] = []
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        await stub.SetObjective(operator_pb2.SetObjectiveRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=STAMPED),
            objective=operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=20.0), reason="chat"))
        stamped = [await AgentStream(channel, f"stamped-{i}", STAMPED).open() for i in range(2)]
        plain = await AgentStream(channel, "plain", PLAIN).open()
        for agent in (*stamped, plain):
            await agent.next_decision()
        await plain.send_batch(geometric_batch(1, rng, num=200))

        async def send_phase(first_seq: int, median_ttft_s: float) -> None:
            ttfts, tpots = [], []
            for seq in range(first_seq, first_seq + 2):
                for agent in stamped:
                    batch, ttft, tpot = stamped_batch(seq, rng, num=150, median_ttft_s=median_ttft_s)
                    ttfts.append(ttft)
                    tpots.append(tpot)
                    await agent.send_batch(batch)
            phases.append((np.concatenate(ttfts), np.concatenate(tpots)))
            await _settled(stub, "stamped-0", sum(t.size for t, _ in phases))

        await send_phase(1, median_ttft_s=0.3)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controlplane", "ctl", "--address", ctl.address, "report", "--out", str(out),
            "--latency-samples", "2", "--latency-every-s", str(SAMPLE_EVERY_S), "--latency-history-s", "0",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        first_line = await asyncio.wait_for(process.stderr.readline(), 60)
        assert b"latency sample 1 of 2 taken" in first_line, first_line
        sent_at = asyncio.get_running_loop().time()
        await send_phase(3, median_ttft_s=1.5)  # slower first tokens: the second sample's quantiles rise
        assert asyncio.get_running_loop().time() - sent_at < SAMPLE_EVERY_S, "settled after the second sample"
        _, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, err.decode()
        for agent in (*stamped, plain):
            await agent.close()

    page = out.read_text(encoding="utf-8")
    assert "<td>TTFT p99 ≤ 20 s</td>" in page  # the objective, in the overrides table
    dom = LatencyDom()
    dom.feed(page)
    key = _key(STAMPED)
    sent = [(phases[0][0], phases[0][1]), tuple(np.concatenate(parts) for parts in zip(*phases, strict=True))]
    for kind, index, unit in (("ttft", 0, "s"), ("tpot", 1, "ms")):
        chart = dom.charts[(key, kind)]
        assert chart["unit"] == unit and f"{kind.upper()} ({unit})" in chart["titles"][0]
        samples = sorted(chart["samples"], key=lambda s: s["at-s"])
        assert len(samples) == 2
        for sample, values in zip(samples, (s[index] for s in sent), strict=True):
            assert sample["num-requests"] == values.size and sample["window-s"] == 60.0
            for quantile in (0.5, 0.9, 0.99):
                exact = _exact(values, quantile)
                assert sample[f"p{round(quantile * 100)}-s"] == pytest.approx(exact, rel=0.0101), (kind, quantile)
            assert sample["mean-s"] == pytest.approx(values.mean(), rel=1e-9)
        # On the axis: 0 at the bottom tick, the axis maximum at the top one, the p99 line through the markers.
        bottom, top = chart["ticks"][0.0], chart["ticks"][chart["max_s"]]
        assert chart["max_s"] >= max(s["p99-s"] for s in samples)
        for sample in samples:
            assert sample["cy"] == pytest.approx(bottom - sample["p99-s"] / chart["max_s"] * (bottom - top), abs=0.02)
        assert chart["lines"]["p99-line"] == [(s["cx"], s["cy"]) for s in samples]
        assert len(chart["lines"]["p50-line"]) == 2
    ttft = sorted(dom.charts[(key, "ttft")]["samples"], key=lambda s: s["at-s"])
    assert ttft[1]["p99-s"] > ttft[0]["p99-s"]
    # One time axis: the decisions stand where the samples' axis puts their times (the samples are seconds
    # apart, so their axis is known to a small fraction of a pixel).
    (t0, x0), (t1, x1) = ((s["at-s"], s["cx"]) for s in ttft)
    assert dom.decision_x[key]
    for decided_at_s, x in dom.decision_x[key]:
        assert x == pytest.approx(x0 + (decided_at_s - t0) / (t1 - t0) * (x1 - x0), abs=0.05)
    # The objective at its target on the TTFT chart alone; the newest quantiles in the table, in ms.
    quantile, target_s, y_target = dom.charts[(key, "ttft")]["objective"]
    assert (quantile, target_s) == (0.99, 20.0)
    ttft_chart = dom.charts[(key, "ttft")]
    bottom, top = ttft_chart["ticks"][0.0], ttft_chart["ticks"][ttft_chart["max_s"]]
    assert y_target == pytest.approx(bottom - 20.0 / ttft_chart["max_s"] * (bottom - top), abs=0.02)
    assert dom.charts[(key, "tpot")]["objective"] is None
    row = dom.table_rows[(key, "ttft")]
    assert row[1] == str(sent[1][0].size)
    assert float(row[4]) == pytest.approx(ttft[1]["p99-s"] * 1e3, rel=1e-3)
    # The pool without stamps: its section says so, with no chart.
    assert not {k for k in dom.charts if k[0] == _key(PLAIN)}
    assert "no latency data" in "".join(dom.sections[_key(PLAIN)])
