"""The serve process's garbage-collector settings (process-wide, so checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

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
