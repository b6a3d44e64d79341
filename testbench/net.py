"""Loopback ports for tests and benchmarks: free ones to start servers on, and one nobody answers at."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: bound to port 0, read back, closed again.

    Only a hint: any process may take it before the caller binds it (use `refused_port` for one held bound)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int, *, attempts: int = 200) -> int:
    """The first of `count` consecutive TCP ports on 127.0.0.1 that were all free a moment ago.

    Each candidate run starts at a `free_port()` and is checked by binding all `count` ports at once (then
    closing them), so the same caveat holds for every port of it. Runs that would pass 65535 or hit a taken
    port are skipped; RuntimeError after `attempts` candidates."""
    for _ in range(attempts):
        first = free_port()
        if first + count - 1 > 65535:
            continue
        with ExitStack() as held:
            try:
                for port in range(first, first + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {count} consecutive free loopback ports in {attempts} attempts")


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection for as long as the block runs: bound, never listening.

    Holding it bound matters: a port merely found free and closed again can be taken by any server started
    meanwhile (another test's controller on a parallel worker), which an agent meant to be unreachable would
    then reach."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
