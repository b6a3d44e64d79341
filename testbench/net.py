"""Addresses for tests that need a controller nobody answers at."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def refused_port() -> Iterator[int]:
    """A loopback port that refuses every connection for as long as the block runs: bound, never listening.

    Holding it bound matters: a port merely found free and closed again can be taken by any server started
    meanwhile (another test's controller on a parallel worker), which an agent meant to be unreachable would
    then reach."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]
