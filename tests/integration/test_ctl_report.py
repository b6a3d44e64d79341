"""`controlplane ctl report` against a real controller, rendered by headless Chromium: one timeline per engine
with one marker per decision of the history stream, mode bands drawn in their colours, the overrides and
the explain view of each pool; and the file loads nothing from anywhere."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import grpc
import numpy as np
import pytest
from matplotlib import image

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.report import MODE_COLOURS
from tests.integration.controller_harness import (
    RTX_PRO_6000,
    AgentStream,
    geometric_batch,
    make_config,
    operator_stub,
    running_controller,
)

CHROMIUM = Path("/usr/bin/chromium")
POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="RTX PRO 6000")
OTHER_POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")


class TimelineDom(HTMLParser):
    """Collects, from a DOM dump, the timelines and what is inside each, and the tables by class."""

    def __init__(self) -> None:
        super().__init__()
        self.timelines: dict[str, dict[str, object]] = {}
        self.tables: Counter[str] = Counter()
        self.band_area_px: Counter[str] = Counter()
        self.explained: set[str] = set()
        self._current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        classes = (values.get("class") or "").split()
        if tag == "svg" and "timeline" in classes:
            self._current = values["data-engine-id"] or ""
            self.timelines[self._current] = {"pool": values["data-pool"], "markers": [], "bands": []}
        elif self._current is not None and tag == "circle" and "decision" in classes:
            self.timelines[self._current]["markers"].append(values)
        elif self._current is not None and tag == "rect" and "mode-band" in classes:
            self.timelines[self._current]["bands"].append(classes[-1])
            self.band_area_px[classes[-1].removeprefix("mode-")] += float(values["width"] or 0) * float(
                values["height"] or 0)
        elif tag == "table":
            self.tables.update(classes)
            if "explain" in classes:
                self.explained.add(values["data-pool"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._current = None


async def chromium(*args: str, profile: Path) -> str:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install the Debian package 'chromium' (the project's system set-up "
                    f"installs it for this test)")
    process = await asyncio.create_subprocess_exec(
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", f"--user-data-dir={profile}", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 180)
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


async def stored(stub, condition) -> list[operator_pb2.HistoryEntry]:
    """The decision history once an entry satisfies `condition` (within 10 s)."""
    for _ in range(100):
        history = list((await stub.ListHistory(operator_pb2.ListHistoryRequest(limit=2000))).entries)
        if any(condition(h) for h in history):
            return history
        await asyncio.sleep(0.1)
    raise AssertionError("the decision never reached the history stream")


def band_colour(mode: str) -> np.ndarray:
    """The RGB (0..1) of a mode band as drawn: its colour at opacity 0.35 over the #fafafa background."""
    rgb = np.array([int(MODE_COLOURS[mode][i:i + 2], 16) for i in (1, 3, 5)]) / 255.0
    return 0.35 * rgb + 0.65 * np.array([0xFA, 0xFA, 0xFA]) / 255.0


async def test_report_renders_a_timeline_per_engine_in_chromium(redis_url: str, tmp_path: Path) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        stub = operator_stub(channel)
        calibration = operator_pb2.Calibration()
        calibration.CopyFrom(RTX_PRO_6000)
        calibration.pool.CopyFrom(POOL)
        await stub.PutCalibration(operator_pb2.PutCalibrationRequest(calibration=calibration))
        e1 = await AgentStream(channel, "e1", POOL).open()
        e2 = await AgentStream(channel, "e2", OTHER_POOL).open()
        await e1.next_decision()
        await e2.next_decision()
        rng = np.random.default_rng(11)
        for seq in range(1, 9):
            await e1.send_batch(geometric_batch(seq, rng, num=250))
        await e1.next_decision(where=lambda d: d.mode == common_pb2.MODE_EB)
        # The writer stores decisions behind the push (coalescing an engine's decisions in between): wait
        # for the EB decision in the history before pinning MB, so that the timeline holds both modes.
        await stored(stub, lambda h: h.engine_id == "e1" and h.decision.mode == common_pb2.MODE_EB)
        await asyncio.sleep(2.0)  # EB holds for a while, so that its band is wide enough to measure on screen
        await stub.PinMode(operator_pb2.PinModeRequest(
            scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="e1"),
            mode=operator_pb2.PINNED_MODE_MB, reason="compare"))
        await e1.next_decision(where=lambda d: d.reason == "operator_pin")
        history = await stored(stub, lambda h: h.decision.reason == "operator_pin")
        counts = Counter(h.engine_id for h in history)
        assert counts["e1"] >= 2 and counts["e2"] >= 1

        out = tmp_path / "report.html"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "controlplane", "ctl", "--address", ctl.address, "report", "--out", str(out),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, err.decode()
        assert f"wrote {out}: 2 engines, {len(history)} decisions" in err.decode()
        await e1.close()
        await e2.close()

    page = out.read_text()
    # Self-contained: nothing to fetch.
    for needle in ("http:", "https:", "<script", "<link", " src="):
        assert needle not in page

    dom = TimelineDom()
    dom.feed(await chromium("--dump-dom", out.as_uri(), profile=tmp_path / "profile-dom"))
    assert set(dom.timelines) == {"e1", "e2"}
    assert dom.timelines["e1"]["pool"] == "Qwen/Qwen3-8B|RTX PRO 6000"
    for engine_id, timeline in dom.timelines.items():
        markers = timeline["markers"]
        assert len(markers) == counts[engine_id]
        assert len(timeline["bands"]) == counts[engine_id]
        wanted = sorted(h.decision.version for h in history if h.engine_id == engine_id)
        assert sorted(int(m["data-version"]) for m in markers) == wanted
    assert {m["data-mode"] for m in dom.timelines["e1"]["markers"]} == {"mb", "eb"}
    assert {"mode-eb", "mode-mb"} <= set(dom.timelines["e1"]["bands"])
    assert dom.explained == {"Qwen/Qwen3-8B|RTX PRO 6000", "Qwen/Qwen3-8B|NVIDIA H200"}  # one table per pool
    assert dom.tables["overrides"] == 1 and dom.tables["audit"] == 1 and dom.tables["engines"] == 1
    assert "compare" in page  # the pin's reason, in the overrides table

    # Drawn, not only present: the EB and MB band colours are on the screenshot.
    shot = tmp_path / "report.png"
    await chromium(f"--screenshot={shot}", "--window-size=1100,2400", "--hide-scrollbars", out.as_uri(),
                   profile=tmp_path / "profile-shot")
    pixels = image.imread(shot)[:, :, :3]
    for mode in ("eb", "mb"):
        distance = np.abs(pixels - band_colour(mode)).max(axis=2)
        # The drawn band covers most of the area the DOM gives it (lines and markers cross it).
        assert dom.band_area_px[mode] > 500
        assert (distance < 0.03).sum() > 0.5 * dom.band_area_px[mode], f"no {mode} band on the screenshot"
