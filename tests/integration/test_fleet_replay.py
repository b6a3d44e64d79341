"""The recorded fleet (`fleet_replay`) replayed through the controller gives the decision sequence recorded
before the controller became a shell around the fleet state machine: every version, mode, k, N, budget, δ,
reason, flag and diagnostic, and every pool membership change (probation, outlier judging, the calibration's
precedence, a δ override, a pin and its clear, a reconnect)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.fleet_replay import replay, replay_machine

GOLDEN = Path(__file__).parent / "data" / "fleet_replay_golden.json"


def _by_second_and_engine(rows: list[list]) -> list[list]:
    """Rows as JSON stores them, ordered by (second, engine) with each engine's own order kept: within one
    second the controller's replay reads the engines' mailboxes one engine after another."""
    rows = json.loads(json.dumps(rows))
    return sorted(rows, key=lambda row: (row[1], row[2]))


async def test_the_recorded_fleet_gives_the_recorded_decisions(redis_url: str) -> None:
    rows = _by_second_and_engine(await replay(redis_url))
    golden = _by_second_and_engine(json.loads(GOLDEN.read_text()))
    assert len(rows) == len(golden)
    for got, want in zip(rows, golden, strict=True):
        assert got == want
    assert any(row[0] == "excluded" for row in golden)
    assert {row[11] for row in golden if row[0] == "decision"} >= {"operator_pin", "crossover_eb", "crossover_mb"}


def test_the_state_machine_alone_gives_the_controllers_decisions() -> None:
    """What the twin runs (the machine, no store, no network) decides exactly as the controller does,
    probation, outlier judging and the calibration's precedence included."""
    rows = _by_second_and_engine(replay_machine())
    golden = _by_second_and_engine(json.loads(GOLDEN.read_text()))
    assert len(rows) == len(golden)
    for got, want in zip(rows, golden, strict=True):
        assert got == want
