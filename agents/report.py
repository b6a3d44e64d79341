"""The agent's JSON report file (CP_AGENT_REPORT), written on a timer, at shutdown and at interpreter exit.

`vllm serve --shutdown-timeout 0` kills the EngineCore process before the scheduler's `shutdown()` runs, so a
report written only at exit (or every few hundred steps) is lost or stale. `ReportWriter` rewrites the file
from its own daemon thread every `interval_s` seconds (also while the engine is idle), and on `write()`.
Every write is atomic: the JSON goes to a temporary file in the same directory, then `os.replace` renames
it over the report, so a reader never sees a partial file.

The snapshot callable runs on the writer's thread: it must only read plain counters and copy lists (never
iterate scheduler state). A failing write is logged once and never raises into the caller.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ReportWriter:
    """Periodic, atomic JSON writes of `snapshot()` to `path`; start() once, stop() at shutdown."""

    def __init__(self, path: Path, *, interval_s: float, snapshot: Callable[[], dict[str, Any]]) -> None:
        """
        Args:
            path: the report file; its directory must exist.
            interval_s: seconds between writes (> 0).
            snapshot: returns the report as JSON-serialisable data.

        Raises:
            ValueError: interval_s ≤ 0.
        """
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.path = path
        self._interval_s = interval_s
        self._snapshot = snapshot
        self._tmp_path = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controlplane-report", daemon=True)
        self._failed = False
        self.num_writes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, timeout_s: float = 2.0) -> None:
        """Stop the timer and write once more (the final state)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self.write()

    def write(self) -> bool:
        """Write the report now (thread-safe). Returns False when it failed (logged once), never raises."""
        try:
            text = json.dumps(self._snapshot())
            with self._lock:
                self._tmp_path.write_text(text)
                os.replace(self._tmp_path, self.path)
                self.num_writes += 1
            return True
        except Exception:
            if not self._failed:
                self._failed = True
                logger.exception("control-plane agent report %s could not be written", self.path)
            return False

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.write()
