"""What a process costs, read from Linux's /proc: resident memory and CPU time, for benchmarks that measure a
controller (or its workers, or its redis-server) running as a process of its own."""

from __future__ import annotations

import math
import os
from pathlib import Path


def rss_mib(pid: int) -> float:
    """Resident memory of process `pid` in MiB (VmRSS of /proc/<pid>/status); math.nan when the process is gone
    (/proc unreadable) or has no resident set (a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return math.nan
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0  # kB (KiB) → MiB
    return math.nan


def cpu_s(pid: int) -> float:
    """User + system CPU seconds process `pid` has used, all its threads included and its children not
    (utime + stime of /proc/<pid>/stat); math.nan when the process is gone (/proc unreadable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return math.nan
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
