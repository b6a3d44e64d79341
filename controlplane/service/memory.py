"""Process memory: returning freed heap to the operating system, and the garbage collector's pauses.

- Freed heap (`release_free_memory`): CPython and numpy free an evicted engine's objects into the C
  allocator, which keeps the pages for reuse: after a churn of 100,000 engine ids the process's RSS stayed
  15% above its baseline although no engine state was left. glibc's `malloc_trim(0)` hands the free pages
  back. Elsewhere (no glibc) this is a no-op.
- Churn leaves cycles (`collect_and_release`): a rejected or refused stream ends in exceptions whose
  tracebacks hold the handlers' frames, which hold the exceptions; with the collector's full passes spaced
  out (below) hundreds of them waited, pinning their pages, and RSS kept rising round after round of a fuzz
  soak (+15.5%, +24.9% after two rounds of 10,500 streams). A full collection before the trim freed them:
  +14.8%, +14.9% (what stays is the allocators' high water of the first round).
- Collector pauses (`settle_garbage_collector`): see its docstring.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import math

logger = logging.getLogger(__name__)
_LIBC_NAME = ctypes.util.find_library("c")


def release_free_memory() -> bool:
    """Ask the C allocator to return free memory to the OS; True when it could (glibc)."""
    if _LIBC_NAME is None:
        return False
    try:
        trim = ctypes.CDLL(_LIBC_NAME).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return bool(trim(0))


def collect_and_release() -> bool:
    """A full garbage collection, then `release_free_memory`; True when memory could be handed back.

    Costs a walk of every object not frozen (tens of milliseconds per thousand engines): for the end of an
    eviction wave, not for a hot path.
    """
    gc.collect()
    return release_free_memory()


# Freed memory is handed back (`TrimSchedule`) after this many evictions, or once evictions have stopped for
# TRIM_QUIET_S.
TRIM_AFTER_EVICTIONS = 1000
TRIM_QUIET_S = 5.0


class TrimSchedule:
    """When to run `collect_and_release` during churn: after TRIM_AFTER_EVICTIONS freed engines or streams, or
    once freeing has been quiet for TRIM_QUIET_S (the end of a wave), never while nothing was freed."""

    def __init__(self) -> None:
        self._freed_since_trim = 0
        self._last_freed_s = -math.inf

    def note_freed(self, count: int, now_s: float) -> None:
        """`count` engines forgotten or streams ended before their Hello at `now_s`."""
        self._freed_since_trim += count
        self._last_freed_s = now_s

    def release_if_due(self, now_s: float) -> bool:
        """Collect and trim when due; True when it ran."""
        if not self._freed_since_trim or (self._freed_since_trim < TRIM_AFTER_EVICTIONS
                                          and now_s - self._last_freed_s < TRIM_QUIET_S):
            return False
        self._freed_since_trim = 0
        collect_and_release()
        return True


# Young-generation threshold and full-collection spacing of a long-running controller (CPython's defaults:
# 700 and every 10th middle collection).
GC_YOUNG_THRESHOLD = 10_000
GC_FULL_EVERY = 100


def settle_garbage_collector() -> int:
    """Make the cyclic garbage collector's pauses rare and short in a long-running server; call once, after
    start-up (the modules imported, the state restored). Returns the objects moved out of its reach.

    A full collection walks every tracked object: at 1,000 engines that took 110-150 ms, several times a
    minute, and every message in flight waited for it (the controller's p99 latency). So: collect once, then
    `gc.freeze()` everything alive (modules, start-up state: it lives as long as the process, and the
    collector no longer walks it), and collect the young generation every GC_YOUNG_THRESHOLD allocations
    and the whole heap every GC_FULL_EVERY middle collections. Reference counting still frees everything
    that is not a cycle at once; cycles wait longer. Process-wide: for `controlplane serve`, not for a
    library embedding the controller.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, GC_FULL_EVERY)
    frozen = gc.get_freeze_count()
    logger.debug("garbage collector: %d start-up objects frozen, thresholds %s", frozen, gc.get_threshold())
    return frozen
