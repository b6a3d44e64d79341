"""Returning freed heap memory to the operating system after many engines were forgotten.

CPython and numpy free an evicted engine's objects into the C allocator, which keeps the pages for reuse:
after a churn of 100,000 engine ids the process's RSS stayed 15% above its baseline although no engine
state was left. glibc's `malloc_trim(0)` hands the free pages back. Elsewhere (no glibc) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

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
