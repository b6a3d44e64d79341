"""Who runs the embedded redis-server of a data directory: the owner record and the process facts it is checked by.

A started `EmbeddedRedis` writes `<data_dir>/embedded-owner.json` (mode 600): the server's Redis `run_id` (40
random hex characters Redis draws at each start, readable with INFO), its pid and kernel start time, and the
pid and start time of the process that owns it. A later process proves that a server still answering on the
data directory's socket is the one in the record (same pid and start time, and INFO returns that run_id and
process_id) and whether its owner still lives (a pid with that start time). The start time defeats pid reuse.

This module reads /proc and files; it starts, signals and stops nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

OWNER_RECORD_NAME = "embedded-owner.json"
_FILE_MODE = 0o600
_GONE_STATES = ("Z", "X")  # zombie, dead: the process holds no files any more


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """The embedded server of a data directory and the process that started it.

    Attributes:
        run_id: Redis's run_id of the server (INFO server), drawn at random at each server start.
        redis_pid: the server's pid.
        redis_start_ticks: the server's start time, clock ticks after boot (/proc/<pid>/stat field 22).
        owner_pid: pid of the process that started the server.
        owner_start_ticks: that process's start time, clock ticks after boot.
    """

    run_id: str
    redis_pid: int
    redis_start_ticks: int
    owner_pid: int
    owner_start_ticks: int


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live process, in clock ticks after boot; None when no such process runs.

    A zombie counts as gone: it has released its files, and only its parent can reap it.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces and parentheses.
    fields = stat[stat.rfind(")") + 2:].split()
    if len(fields) < 20 or fields[0] in _GONE_STATES:
        return None
    return int(fields[19])


def process_is(pid: int, start_ticks: int) -> bool:
    """True while the process `pid` that started at `start_ticks` still runs (false after pid reuse)."""
    return process_start_ticks(pid) == start_ticks


def write_private_file(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, mode 600 whatever the umask (a temporary file, then rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, _FILE_MODE)
    try:
        os.fchmod(fd, _FILE_MODE)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_owner_record(data_dir: Path, record: OwnerRecord) -> None:
    """Record the server of `data_dir` (mode 600)."""
    write_private_file(data_dir / OWNER_RECORD_NAME, json.dumps(asdict(record)) + "\n")


def read_owner_record(data_dir: Path) -> OwnerRecord | None:
    """The recorded server of `data_dir`; None when there is no record or it is unreadable or malformed
    (nothing can then be proven about a server answering there)."""
    try:
        raw = json.loads((data_dir / OWNER_RECORD_NAME).read_text())
        return OwnerRecord(run_id=str(raw["run_id"]), redis_pid=int(raw["redis_pid"]),
                           redis_start_ticks=int(raw["redis_start_ticks"]), owner_pid=int(raw["owner_pid"]),
                           owner_start_ticks=int(raw["owner_start_ticks"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
