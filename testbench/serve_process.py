"""`controlplane serve` as a real subprocess on its embedded Redis, for tests that kill, stop and restart it
(and the fuzz soak benchmark).

The port is read from the controller's log line "listening on HOST:PORT" (it runs with --port 0 unless
told otherwise); the embedded redis-server is found as the controller's child process in /proc.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from controlplane.store.embedded import stop_process

CONTROLPLANE = Path(sys.executable).with_name("controlplane")
_LISTENING = re.compile(r"listening on [^\s:]+:(\d+)")


def child_pids(parent_pid: int, *, name: str) -> list[int]:
    """Pids of the live children of `parent_pid` whose command name is `name` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.find("(") + 1:stat.rfind(")")]
        state, ppid = stat[stat.rfind(")") + 2:].split()[:2]
        if int(ppid) == parent_pid and comm == name and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def pid_running(pid: int) -> bool:
    """True while `pid` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] not in ("Z", "X")


@dataclass
class ServeProcess:
    """One `controlplane serve` process; `start` returns once it logged its port."""

    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, data_dir: Path, *, log_path: Path, args: tuple[str, ...] = (), port: int = 0,
              env: dict[str, str] | None = None, timeout_s: float = 90.0) -> ServeProcess:
        """Run `controlplane serve --port PORT --data-dir DATA_DIR ARGS…`, its output appended to log_path.

        Raises:
            RuntimeError: the process exited or logged no port within timeout_s (with the log's tail).
        """
        offset = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [str(CONTROLPLANE), "serve", "--port", str(port), "--data-dir", str(data_dir), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env or dict(os.environ))
        deadline_s = time.monotonic() + timeout_s
        while True:
            text = log_path.read_bytes()[offset:].decode(errors="replace")
            found = _LISTENING.search(text)
            if found:
                return cls(process=process, port=int(found.group(1)), data_dir=data_dir, log_path=log_path)
            if process.poll() is not None or time.monotonic() > deadline_s:
                if process.poll() is None:
                    process.kill()
                    process.wait()
                raise RuntimeError(f"controlplane serve (exit code {process.returncode}) logged no port; "
                                   f"log tail:\n{text[-3000:]}")
            time.sleep(0.05)

    def redis_pid(self) -> int:
        """The embedded redis-server's pid (the controller's only redis-server child)."""
        [pid] = child_pids(self.pid, name="redis-server")
        return pid

    def kill(self) -> None:
        """kill -9, and reap."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, *, timeout_s: float = 20.0) -> int:
        """SIGTERM (SIGCONT first, in case it was stopped), then SIGKILL after timeout_s; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        stop_process(self.process, timeout_s=timeout_s)
        return self.process.returncode
