"""Process and HTTP helpers for the deployment tests: binaries, free ports, polling, JSON over HTTP, a
Prometheus server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from controlplane.store.embedded import stop_process
from testbench.net import free_port
from tests.deploy.paths import HEALTH_CHECK_SCRIPT

T = TypeVar("T")


def require_binary(name: str, *, package: str) -> str:
    """The path of `name`; fails (never skips) naming the set-up step that installs it."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is not installed: `make system-deps` installs Debian's {package} package")
    return path


def wait_for(probe: Callable[[], T | None], *, timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """Call `probe` until it returns something other than None (or raises no OSError); TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = probe()
        except (OSError, ValueError) as exc:
            last_error = exc
            result = None
        if result is not None:
            return result
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s} s (last error: {last_error})")


def http_text(url: str, *, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # loopback URLs only
        return response.read().decode("utf-8")


def prometheus_api(base_url: str, path: str, **params: str) -> Any:
    """GET a Prometheus HTTP API path; returns `data`, raises ValueError with Prometheus' error otherwise."""
    url = f"{base_url}{path}?{urllib.parse.urlencode(params)}" if params else f"{base_url}{path}"
    try:
        body = json.loads(http_text(url))
    except urllib.error.HTTPError as exc:
        body = json.loads(exc.read().decode("utf-8"))
    if body.get("status") != "success":
        raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
    return body["data"]


@contextmanager
def prometheus_server(config: Path, workdir: Path, *, timeout_s: float = 30.0) -> Iterator[str]:
    """Debian's Prometheus server on a free loopback port with `config` (TSDB and log under workdir); yields
    its base URL once /-/ready answers, and stops it (SIGTERM, then SIGKILL) on the way out."""
    port = free_port()
    command = [require_binary("prometheus", package="prometheus"), f"--config.file={config}",
               f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_text(f"{base_url}/-/ready") or None, timeout_s=timeout_s, what="Prometheus ready")
        yield base_url
    finally:
        stop_process(process, timeout_s=10.0)


def health_check(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the image's cp-grpc-health script (deploy/docker/grpc_health_check.py) with `args`."""
    return subprocess.run([sys.executable, str(HEALTH_CHECK_SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)
