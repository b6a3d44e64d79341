"""The demo's live view (controlplane/cli/demo_view.py) rendered at 80 and 120 columns, and the command its hint
names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controlplane.cli.demo import listening_line
from controlplane.cli.demo_view import LEGEND, EngineRow, Status, ctl_program, pool_labels, render_view
from controlplane.protocol import compose_version

EPOCH = 1_796_550_928


def _row(engine_id: str, accelerator: str, mode: str, *, k: int, sequence: int, acked: int) -> EngineRow:
    return EngineRow(engine_id=engine_id, model="Qwen/Qwen3-8B", accelerator=accelerator, mode=mode, k=k, n=256,
                     b_max_tokens=8192, b_cap_tokens=2048, version=compose_version(EPOCH, sequence),
                     acked_version=compose_version(EPOCH, acked) if acked else 0, p0_per_token=0.00372,
                     theta_star=0.0565 if mode == "EB" else 0.0320,
                     lhs_minus_rhs_s_per_token=5.18e-05 if mode == "EB" else -1.74e-06,
                     reason="crossover_eb" if mode == "EB" else "crossover_mb")


ROWS = [
    _row("sim-1-0003", "NVIDIA RTX PRO 6000", "EB", k=14, sequence=3, acked=3),
    _row("sim-0-0000", "NVIDIA H200", "MB", k=8, sequence=3, acked=3),
    _row("sim-1-0001", "NVIDIA RTX PRO 6000", "EB", k=14, sequence=4, acked=3),  # the newest not ACKed yet
    _row("sim-0-0002", "NVIDIA H200", "MB", k=8, sequence=2, acked=0),
]
STATUS = Status(listening=listening_line("127.0.0.1", 50151, ".venv/bin/controlplane"),
                redis_url="unix:///var/lib/controlplane/redis.sock", up_s=8.2,
                num_connected=4, num_engines=4, num_batches_sent=63, num_decisions_applied=12,
                num_completed=26_640)
# engine, pool, mode, k, N, [B_max, B_cap,] ver, [ack,] p0, θ*, LHS−RHS, reason
NARROW_ROW = re.compile(r"^(?P<engine>sim-\d-\d{4}) +(?P<pool>H200|RTX PRO 6000) +(?P<mode>MB|EB) +(?P<k>\S+) "
                        r"+(?P<n>\d+) +(?P<ver>\d+\*?) +(?P<p0>0\.\d{5}) +(?P<theta>0\.\d{3}) "
                        r"+(?P<margin>[+-]\d\.\de-\d\d) +(?P<reason>\S+)$")
WIDE_ROW = re.compile(r"^(?P<engine>sim-\d-\d{4}) +(?P<pool>H200|RTX PRO 6000) +(?P<mode>MB|EB) +(?P<k>\S+) "
                      r"+(?P<n>\d+) +(?P<b_max>\d+) +(?P<b_cap>\d+) +(?P<ver>\d+) +(?P<ack>\S+) +(?P<p0>0\.\d{5}) "
                      r"+(?P<theta>0\.\d{3}) +(?P<margin>[+-]\d\.\de-\d\d) +(?P<reason>\S+)$")


@pytest.mark.parametrize(("width", "pattern", "columns"), [
    (80, NARROW_ROW, ["engine", "pool", "mode", "k", "N", "ver", "p0", "θ*", "LHS−RHS", "reason"]),
    (120, WIDE_ROW, ["engine", "pool", "mode", "k", "N", "B_max", "B_cap", "ver", "ack", "p0", "θ*", "LHS−RHS",
                     "reason"]),
])
def test_the_view_fits_its_width_with_short_cells(width: int, pattern: re.Pattern[str], columns: list[str]) -> None:
    lines = render_view(STATUS, ROWS, width=width).splitlines()
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    assert lines[0] == "controller listening on 127.0.0.1:50151 — try: .venv/bin/controlplane ctl list"
    assert not re.search(r"\d{10,}", "\n".join(lines)), "a 19-digit version reached the view"
    header = next(i for i, line in enumerate(lines) if line.startswith("engine "))
    assert lines[header].split() == columns
    rows = {m["engine"]: m for m in (pattern.match(line) for line in lines[header + 1:header + 5]) if m}
    assert sorted(rows) == ["sim-0-0000", "sim-0-0002", "sim-1-0001", "sim-1-0003"], "\n".join(lines)
    assert [m["engine"] for m in rows.values()] == ["sim-0-0000", "sim-0-0002", "sim-1-0001", "sim-1-0003"]
    assert {e: m["pool"] for e, m in rows.items()} == {"sim-0-0000": "H200", "sim-0-0002": "H200",
                                                       "sim-1-0001": "RTX PRO 6000", "sim-1-0003": "RTX PRO 6000"}
    assert {e: m["k"] for e, m in rows.items()} == {"sim-0-0000": "–", "sim-0-0002": "–", "sim-1-0001": "14",
                                                    "sim-1-0003": "14"}  # k only where EB runs
    assert rows["sim-1-0003"]["margin"] == "+5.2e-05" and rows["sim-0-0000"]["margin"] == "-1.7e-06"
    if width == 80:
        assert [rows[e]["ver"] for e in sorted(rows)] == ["3", "2*", "4*", "3"]
    else:
        assert [(rows[e]["ver"], rows[e]["ack"]) for e in sorted(rows)] == [("3", "✓"), ("2", "–"), ("4", "3"),
                                                                           ("3", "✓")]
    assert lines.count(LEGEND) == 1 and len(LEGEND) <= 80
    assert "pools: Qwen/Qwen3-8B on NVIDIA H200, NVIDIA RTX PRO 6000" in " ".join(lines)


def test_long_cells_are_cut_not_overflowing() -> None:
    long = [EngineRow(**{**{f: getattr(ROWS[0], f) for f in EngineRow.__slots__},
                         "engine_id": "qwen3-8b-7c9d5b7f4-x2x9q-dp0-with-a-very-long-name-indeed",
                         "reason": "rollout_hold_for_a_very_long_reason"})]
    for width in (60, 80, 120):
        lines = render_view(STATUS, long, width=width).splitlines()
        assert max(len(line) for line in lines) <= width
        assert any(line.startswith("qwen3-8b-") for line in lines)


def test_pool_labels_tell_pools_apart() -> None:
    assert set(pool_labels(ROWS).values()) == {"H200", "RTX PRO 6000"}
    one = [ROWS[1]]
    assert pool_labels(one) == {("Qwen/Qwen3-8B", "NVIDIA H200"): "NVIDIA H200"}
    other_model = [ROWS[1], EngineRow(**{**{f: getattr(ROWS[0], f) for f in EngineRow.__slots__},
                                         "model": "Qwen/Qwen3-30B-A3B"})]
    assert set(pool_labels(other_model).values()) == {"Qwen/Qwen3-8B|NVIDIA H200",
                                                      "Qwen/Qwen3-30B-A3B|NVIDIA RTX PRO 6000"}


def _script(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_hint_names_the_command_that_runs_from_the_working_directory(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    script = _script(clone / ".venv" / "bin" / "controlplane")
    elsewhere = _script(tmp_path / "usr" / "bin" / "controlplane")
    # `make run`: .venv/bin/controlplane demo in the clone, the venv not on PATH.
    assert ctl_program(argv0=".venv/bin/controlplane", executable="python3", cwd=clone,
                       path=str(elsewhere.parent)) == ".venv/bin/controlplane"
    assert ctl_program(argv0=str(script), executable="python3", cwd=clone, path="") == ".venv/bin/controlplane"
    # The venv activated: PATH finds this very script.
    assert ctl_program(argv0=str(script), executable="python3", cwd=clone,
                       path=f"{script.parent}:{elsewhere.parent}") == "controlplane"
    # Started from another directory: the full path.
    assert ctl_program(argv0=str(script), executable="python3", cwd=tmp_path / "usr", path="") == str(script)
    # python -m controlplane.
    assert ctl_program(argv0=str(clone / "controlplane" / "__main__.py"), executable=".venv/bin/python",
                       cwd=clone, path="") == ".venv/bin/python -m controlplane"
    assert listening_line("127.0.0.1", 50999, ".venv/bin/controlplane") == (
        "controller listening on 127.0.0.1:50999 — try: .venv/bin/controlplane ctl --address 127.0.0.1:50999 list")
