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


_MMAP_PROBE = (
    "import ctypes, json, sys\n"
    "from controlplane.service.memory import MMAP_THRESHOLD_BYTES, tune_allocator\n"
    "libc = ctypes.CDLL('libc.so.6')\n"
    "class Info(ctypes.Structure):\n"
    "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks',\n"
    "                                            'fsmblks', 'uordblks', 'fordblks', 'keepcost')]\n"
    "libc.mallinfo2.restype = Info\n"
    "libc.malloc.restype = ctypes.c_void_p\n"
    "libc.malloc.argtypes = [ctypes.c_size_t]\n"
    "libc.free.argtypes = [ctypes.c_void_p]\n"
    "applied = tune_allocator({}) if sys.argv[1] == 'tuned' else False\n"
    "libc.free(libc.malloc(8 << 20))  # an oversize message's buffer, mapped, then freed\n"
    "before = libc.mallinfo2().hblks\n"
    "block = libc.malloc(4 * MMAP_THRESHOLD_BYTES)\n"
    "print(json.dumps({'applied': applied, 'mapped': libc.mallinfo2().hblks - before}))\n"
    "libc.free(block)\n"
)


def _probe(mode: str) -> dict[str, int]:
    return json.loads(subprocess.run([sys.executable, "-c", _MMAP_PROBE, mode], check=True, capture_output=True,
                                     text=True).stdout)


def test_the_tuned_allocator_keeps_mapping_large_blocks_after_a_large_one_was_freed() -> None:
    """glibc raises its mmap threshold to the size of a freed mapped block, so by default the next large
    buffer comes from the heap (where its hole stays); with `tune_allocator` it is mapped on its own."""
    assert _probe("default") == {"applied": False, "mapped": 0}
    assert _probe("tuned") == {"applied": True, "mapped": 1}


def test_an_operators_own_allocator_settings_win() -> None:
    from controlplane.service.memory import tune_allocator

    assert tune_allocator({"MALLOC_ARENA_MAX": "8"}) is False
    assert tune_allocator({"MALLOC_MMAP_THRESHOLD_": "131072"}) is False
