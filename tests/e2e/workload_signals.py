"""The engine side of the file handshake between an e2e workload process (`engine_workload.py`,
`chaos_workload.py`) and the test that started it: the workload writes a ready file once its engine is built,
then waits for the test's go file (the test sets operator overrides or starts faults meanwhile); after its
result it may wait for a hold file. The test's side is `tests/e2e/conftest.py`'s `EngineRun`.

Imported by the workload scripts once the repository root is on sys.path (they run as `python <script>`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def wait_for_file(path: Path, *, timeout_s: float, poll_s: float) -> bool:
    """Poll every poll_s seconds until `path` exists; True once it does, False when timeout_s seconds
    (time.monotonic) passed without it. Blocks the calling thread (not for an event loop)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def ready_then_wait_for_go(ready_file: Path | None, go_file: Path | None, *, timeout_s: float) -> bool:
    """Write "ready" to ready_file (when given), then wait for go_file (when given) to exist, polling every
    50 ms. False, with "no go file" said on stderr, when go_file did not appear within timeout_s seconds (the
    workload then exits 2); True otherwise."""
    if ready_file:
        ready_file.write_text("ready")
    if go_file and not wait_for_file(go_file, timeout_s=timeout_s, poll_s=0.05):
        print("no go file", file=sys.stderr)
        return False
    return True
