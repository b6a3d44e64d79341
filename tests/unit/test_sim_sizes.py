"""The twin's sizes from the command line: `sim run|sweep --requests`, `--duration-s` and `--max-num-seqs`, and
`scenarios.resize` behind the first two."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from controlplane.cli.main import main
from controlplane.sim.arrivals import materialize
from controlplane.sim.scenarios import DIST_SHIFT_REQUESTS_PER_PHASE, parse_scenario, resize


def test_resize_spreads_requests_over_closed_loop_phases() -> None:
    assert [p.num_requests for p in parse_scenario("dist-shift").phases] == [DIST_SHIFT_REQUESTS_PER_PHASE] * 3
    workload = resize(parse_scenario("dist-shift"), num_requests=1000)
    assert [p.num_requests for p in workload.phases] == [334, 333, 333]
    assert [p.concurrency for p in workload.phases] == [2048] * 3
    assert workload.name == "dist-shift n=1000"
    single = resize(parse_scenario("closed:balanced:c=64:n=50"), num_requests=120)
    assert materialize(single, seed=0).num_requests == 120


def test_resize_scales_open_loop_phases_to_the_duration() -> None:
    bursty = resize(parse_scenario("bursty:balanced:burst=2"), duration_s=25.0)
    assert [p.duration_s for p in bursty.phases] == [5.0] * 5
    assert [p.rate_per_s for p in bursty.phases] == [0.2, 2.0, 0.2, 2.0, 0.2]
    poisson = resize(parse_scenario("poisson:balanced:rate=40:for=100"), duration_s=2.0)
    assert poisson.phases[0].duration_s == 2.0 and poisson.name.endswith(" for=2s")
    assert float(materialize(poisson, seed=1).arrival_s.max()) < 2.0


def test_resize_leaves_a_workload_alone_without_sizes() -> None:
    workload = parse_scenario("closed:balanced:c=8")
    assert resize(workload) is workload


@pytest.mark.parametrize(("spelling", "sizes", "message"), [
    ("poisson:balanced:rate=1:for=5", {"num_requests": 10}, "sizes a closed-loop scenario"),
    ("closed:balanced:c=8", {"duration_s": 10.0}, "sizes an open-loop scenario"),
    ("conc-shift", {"num_requests": 4}, "4 requests for 5 phases"),
    ("poisson:balanced:rate=1:for=5", {"duration_s": math.nan}, "positive number of seconds"),
    ("poisson:balanced:rate=1:for=5", {"duration_s": -1.0}, "positive number of seconds"),
])
def test_resize_refuses_sizes_that_do_not_fit(spelling: str, sizes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resize(parse_scenario(spelling), **sizes)


def _rows(directory: Path) -> list[dict[str, str]]:
    with (directory / "table.csv").open() as file:
        return list(csv.DictReader(file))


def test_run_takes_requests_and_max_num_seqs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = tmp_path / "steps.jsonl"
    assert main(["sim", "run", "--scenario", "closed:uniform-200-60:c=256", "--scheduler", "v1",
                 "--scheduler", "eb:2@n=32", "--requests", "400", "--max-num-seqs", "48", "--no-plots",
                 "--out", str(tmp_path), "--steps-out", str(steps)]) == 0
    assert "closed:uniform-200-60:c=256 n=400" in capsys.readouterr().out
    rows = _rows(tmp_path)
    assert [(row["scheduler"], row["num_completed"]) for row in rows] == [("v1", "400"), ("eb:2@n=32", "400")]
    # v1 ran on 48 sequences at most (the flag; 256 requests wanted in), and was held there.
    running = [json.loads(line)["decode_requests"] for line in steps.read_text().splitlines()]
    assert max(running) == 48


def test_sweep_takes_a_duration_for_open_loop_scenarios(tmp_path: Path) -> None:
    assert main(["sim", "sweep", "--scenario", "poisson:uniform-100-20:rate=20:for=600", "--scheduler", "v1",
                 "--duration-s", "3", "--no-plots", "--out", str(tmp_path)]) == 0
    [row] = _rows(tmp_path)
    assert row["scenario"] == "poisson:uniform-100-20:rate=20:for=600 for=3s"
    assert 20 <= int(row["num_completed"]) <= 120  # about 60 arrivals in 3 s, not 12,000 in 600 s


@pytest.mark.parametrize(("argv", "message"), [
    (["--scenario", "poisson:balanced:rate=1:for=5", "--requests", "10"], "sizes a closed-loop scenario"),
    (["--scenario", "closed:balanced:c=8", "--requests", "0"], "--requests must be ≥ 1, got 0"),
    (["--scenario", "closed:balanced:c=8", "--max-num-seqs", "0"], "--max-num-seqs must be ≥ 1, got 0"),
    (["--scenario", "closed:balanced:c=8", "--duration-s", "5"], "sizes an open-loop scenario"),
])
def test_sizes_that_do_not_fit_are_usage_errors(argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["sim", "run", *argv, "--scheduler", "v1", "--no-plots"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: controlplane sim run ") and message in err


def test_help_documents_the_size_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--requests N", "--duration-s S", "--max-num-seqs N"):
        assert flag in text
    assert "closed:SHAPE:c=C[:n=N]" in text and "poisson:SHAPE:rate=R:for=S" in text
