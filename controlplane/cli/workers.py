"""`controlplane serve --workers N`: N controller processes on one host sharing one gRPC port.

One Python process runs its event loop on one core; a host with more cores serves more engines with more
processes. Each worker is a full controller replica (`controlplane serve` with one worker), named
`<controller_id>-w<i>`, with /metrics on `metrics_port + i`. The kernel spreads incoming connections over
the workers (SO_REUSEPORT, which gRPC sets on Linux); an agent's stream stays on the worker that accepted
its connection. The workers share one Redis — the configured `redis_url`, or an embedded redis-server this
process starts in the data directory and restarts when it dies — so they are replicas of one another in the
ordinary sense: they exchange pool buckets (equal pool terms), fence each engine's versions, propagate
overrides and calibrations, and answer ListEngines / GetDecision for the whole fleet.

This process serves nothing itself. It restarts a worker that exits (after a back-off that doubles up to
`MAX_BACKOFF_S` while the worker keeps failing within `STABLE_AFTER_S` of its start), and on SIGTERM or
SIGINT passes the signal on, waits for the workers to drain and stop, then stops the embedded Redis. The
workers and the embedded Redis get SIGTERM from the kernel when this process dies any other way (kill -9
included: the parent-death signal), so a restarted supervisor never finds orphans holding its port.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.store.embedded import EmbeddedRedis, tied_to_this_process

logger = logging.getLogger(__name__)

MAX_WORKERS = 64
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0
STOP_TIMEOUT_S = 30.0
_POLL_S = 0.5


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started_at_s: float = 0.0
    backoff_s: float = 0.0
    restart_at_s: float = 0.0


def worker_id(controller_id: str, index: int) -> str:
    return f"{controller_id}-w{index}"


def worker_argv(cli_args: Sequence[str], *, index: int, controller_id: str, redis_url: str,
                metrics_port: int) -> list[str]:
    """The command line of worker `index`: this command's own arguments (a flag given twice counts once, the
    last), then the worker's overrides, which therefore win over flags, environment and file."""
    return [sys.executable, "-m", "controlplane", *cli_args, "--workers", "1",
            "--controller-id", worker_id(controller_id, index), "--redis-url", redis_url,
            "--metrics-port", str(metrics_port + index if metrics_port else 0)]


def check_workers(workers: int, *, port: int, metrics_port: int) -> None:
    """Raises ValueError when N workers cannot run with these ports."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must be in [1, {MAX_WORKERS}], got {workers}")
    if workers > 1 and port == 0:
        raise ValueError("workers > 1 share one port: give a fixed --port (0 would give each its own)")
    if workers > 1 and metrics_port and metrics_port + workers - 1 > 65535:
        raise ValueError(f"metrics ports {metrics_port}..{metrics_port + workers - 1} (one per worker) exceed 65535")


class WorkerSupervisor:
    """Runs and supervises the workers; `run()` blocks until stopped (see the module docstring)."""

    def __init__(self, cli_args: Sequence[str], *, workers: int, controller_id: str, redis_url: str,
                 data_dir: Path | None, metrics_port: int) -> None:
        self._cli_args = list(cli_args)
        self._controller_id = controller_id
        self._redis_url = redis_url
        self._data_dir = data_dir
        self._metrics_port = metrics_port
        self._workers = [_Worker(index=i) for i in range(workers)]
        self._embedded: EmbeddedRedis | None = None
        self._stop = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def run(self) -> int:
        """Start Redis (embedded, when no URL) and the workers; supervise until `request_stop`. Returns 0."""
        url = self._redis_url
        if not url:
            if self._data_dir is None:
                raise ValueError("give a redis_url or a data_dir")
            self._embedded = EmbeddedRedis(self._data_dir)
            self._embedded.start()
            url = self._embedded.url
        try:
            for worker in self._workers:
                self._start(worker, url)
            while not self._stop.wait(_POLL_S):
                self._supervise(url)
        finally:
            self._stop_workers()
            if self._embedded is not None:
                self._embedded.stop()
        return 0

    def _start(self, worker: _Worker, url: str) -> None:
        argv = worker_argv(self._cli_args, index=worker.index, controller_id=self._controller_id, redis_url=url,
                           metrics_port=self._metrics_port)
        # Tied to this process (the main thread starts every worker): a supervisor killed with SIGKILL takes
        # its workers with it (SIGTERM: they drain and stop) instead of leaving them serving the port.
        worker.process = subprocess.Popen(tied_to_this_process(argv))
        worker.started_at_s = time.monotonic()
        logger.info("worker %s started (pid %d)", worker_id(self._controller_id, worker.index), worker.process.pid)

    def _supervise(self, url: str) -> None:
        if self._embedded is not None and not self._embedded.alive():
            logger.warning("the embedded redis-server is gone; restarting it from its append-only file")
            try:
                self._embedded.restart()
            except Exception as exc:
                logger.error("could not restart the embedded redis-server: %s", exc)
        now = time.monotonic()
        for worker in self._workers:
            process = worker.process
            if process is not None and process.poll() is not None:
                stable = now - worker.started_at_s >= STABLE_AFTER_S
                worker.backoff_s = 0.0 if stable else min(MAX_BACKOFF_S, max(1.0, 2.0 * worker.backoff_s))
                worker.restart_at_s = now + worker.backoff_s
                worker.process = None
                logger.error("worker %s exited with status %s; restarting in %.0f s",
                             worker_id(self._controller_id, worker.index), process.returncode, worker.backoff_s)
            if worker.process is None and now >= worker.restart_at_s:
                self._start(worker, url)

    def _stop_workers(self) -> None:
        running = [w.process for w in self._workers if w.process is not None and w.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in running:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("worker pid %d did not stop within %.0f s; killing it", process.pid, STOP_TIMEOUT_S)
                process.kill()
                process.wait()


def run_workers(cli_args: Sequence[str], *, workers: int, controller_id: str, redis_url: str,
                data_dir: Path | None, metrics_port: int) -> int:
    """Run the supervisor in the foreground until SIGTERM or SIGINT."""
    supervisor = WorkerSupervisor(cli_args, workers=workers, controller_id=controller_id, redis_url=redis_url,
                                  data_dir=data_dir, metrics_port=metrics_port)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: supervisor.request_stop())
    return supervisor.run()
