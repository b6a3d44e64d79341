"""The serve process's garbage-collector settings (process-wide, so checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

from controlplane.service import memory
from controlplane.service.memory import GC_FULL_EVERY, GC_YOUNG_THRESHOLD


def test_settling_freezes_start_up_objects_and_spaces_full_collections() -> None:
    script = (
        "import gc, json\n"
        "from controlplane.service.memory import settle_garbage_collector\n"
        "before = gc.get_threshold()\n"
        "frozen = settle_garbage_collector()\n"
        "print(json.dumps({'frozen': frozen, 'count': gc.get_freeze_count(), 'before': before,\n"
        "                  'after': gc.get_threshold()}))\n"
    )
    result = json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                       text=True).stdout)
    assert result["frozen"] == result["count"] > 1000  # the imported modules' objects
    assert result["before"] == [700, 10, 10]
    assert result["after"] == [GC_YOUNG_THRESHOLD, 10, GC_FULL_EVERY]


def test_the_trim_schedule_runs_after_a_wave_ends_or_a_thousand_are_freed(monkeypatch) -> None:
    runs: list[int] = []
    monkeypatch.setattr(memory, "collect_and_release", lambda: runs.append(1) or True)
    schedule = memory.TrimSchedule()
    assert not schedule.release_if_due(1_000.0)  # nothing freed: never
    schedule.note_freed(10, now_s=0.0)
    assert not schedule.release_if_due(memory.TRIM_QUIET_S - 0.1)  # the wave may go on
    assert schedule.release_if_due(memory.TRIM_QUIET_S)
    assert not schedule.release_if_due(memory.TRIM_QUIET_S + 60.0)  # once per wave
    for second in range(memory.TRIM_AFTER_EVICTIONS):
        schedule.note_freed(1, now_s=100.0 + second * 0.001)
    assert schedule.release_if_due(101.0)  # a long wave is trimmed while it lasts
    assert runs == [1, 1]
