"""agents.report.ReportWriter: periodic, atomic JSON writes that never raise."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from agents.report import ReportWriter


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_writes_on_a_timer_and_once_more_at_stop(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    counter = {"n": 0}

    def snapshot() -> dict:
        counter["n"] += 1
        return {"n": counter["n"]}

    writer = ReportWriter(path, interval_s=0.05, snapshot=snapshot)
    writer.start()
    _wait_for(lambda: writer.num_writes >= 3)  # without any other call: the timer writes
    writer.stop()
    final = json.loads(path.read_text())
    assert final["n"] == counter["n"] and writer.num_writes == final["n"]
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left behind


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    payload = {"steps": [{"step": i, "tokens": list(range(20))} for i in range(2000)]}
    writer = ReportWriter(path, interval_s=3600, snapshot=lambda: payload)
    writer.write()
    done = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        while not done.is_set():
            try:
                json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                bad.append(str(exc))

    thread = threading.Thread(target=reader)
    thread.start()
    for _ in range(30):
        writer.write()
    done.set()
    thread.join()
    assert bad == []


def test_a_failing_write_is_logged_once_and_never_raises(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = ReportWriter(tmp_path / "missing-dir" / "report.json", interval_s=1.0, snapshot=lambda: {"a": 1})
    assert writer.write() is False
    assert writer.write() is False
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1
    broken = ReportWriter(tmp_path / "r.json", interval_s=1.0, snapshot=lambda: {"x": object()})
    assert broken.write() is False
    with pytest.raises(ValueError, match="interval_s"):
        ReportWriter(tmp_path / "r.json", interval_s=0, snapshot=dict)
