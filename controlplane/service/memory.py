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
- The allocator's high water after churn (`tune_allocator`): see its docstring.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
from collections.abc import Mapping

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


# glibc's mallopt parameters (malloc.h) and the values `tune_allocator` sets.
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 64 * 1024
ARENA_MAX = 2


def tune_allocator(env: Mapping[str, str] = os.environ) -> bool:
    """Make glibc's heap keep less after a churn of engines; call once at start, before the server's threads
    exist. Returns True when applied (glibc, and the operator set neither MALLOC_MMAP_THRESHOLD_ nor
    MALLOC_ARENA_MAX, which then win). Process-wide: for `controlplane serve`, not for a library.

    - A fixed mmap threshold of MMAP_THRESHOLD_BYTES. By default glibc raises the threshold to the size of
      every mmapped block freed (up to 32 MiB), so after one oversize message the next large buffers come from
      the heap, and the holes they leave are pinned by the small long-lived blocks allocated between them.
      Blocks at or above the threshold are mapped and unmapped on their own (a batch's columns are below it).
    - At most ARENA_MAX arenas: each thread that allocates (gRPC's pollers and executors, the span exporter)
      otherwise gets an arena of its own, with its own high water.

    Measured with `benchmarks/fuzz_soak.py --rounds 4` (105,000 streams; RSS after each round's eviction
    against the baseline): default +9.9 / +11.3 / +12.7 / +11.9%; the threshold alone +6.6 / +7.8 / +10.2 /
    +10.4%; both +5.1 / +6.3 / +6.3 / +7.5% (set from the environment) and +6.0 / +7.4 / +7.8 / +8.1% (set
    here). glibc's in-use bytes rose 1.3 MB over the four default rounds while RSS rose 12 MB: holes, not
    live blocks.
    """
    if _LIBC_NAME is None or "MALLOC_MMAP_THRESHOLD_" in env or "MALLOC_ARENA_MAX" in env:
        return False
    try:
        mallopt = ctypes.CDLL(_LIBC_NAME).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_ARENA_MAX, ARENA_MAX))


def collect_and_release() -> bool:
    """A full garbage collection, then `release_free_memory`; True when memory could be handed back.

    Costs a walk of every object not frozen (tens of milliseconds per thousand engines): for the end of an
    eviction wave, not for a hot path.
    """
    gc.collect()
    return release_free_memory()


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
