"""The controller image's default command, run as the process the container would run.

No container runtime runs here (deploy/README.md), so the image is reproduced as a process: ENTRYPOINT + CMD
of controller.Dockerfile with every path the image copies mapped to its repository file, the image's ENV with
its absolute paths moved under a temporary directory, run by this checkout's `controlplane`. The default must
get to SERVING (the image's HEALTHCHECK command says so) on loopback only, and refuse a public address given
without TLS and tokens, as deploy/README.md documents.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controlplane.store.embedded import stop_process
from testbench.net import free_port
from tests.deploy.paths import DEPLOY
from tests.deploy.processes import health_check, http_text, wait_for
from tests.deploy.test_dockerfiles import Instruction, image_command, parse

DOCKERFILE = DEPLOY / "docker" / "controller.Dockerfile"


def _final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def image_environment(instructions: list[Instruction], root: Path) -> dict[str, str]:
    """The final stage's ENV (KEY=VALUE pairs), absolute paths moved under `root` (the image's file system)."""
    env: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ENV":
            for pair in shlex.split(ins.arguments):
                key, _, value = pair.partition("=")
                env[key] = str(root / value.lstrip("/")) if value.startswith("/") else value
    for value in env.values():
        if value.startswith(str(root)):
            Path(value).mkdir(parents=True, exist_ok=True)
    return env


def healthcheck_arguments(instructions: list[Instruction], port: int) -> list[str]:
    """The HEALTHCHECK's cp-grpc-health arguments with the gRPC port `port`."""
    healthcheck = next(ins for ins in instructions if ins.keyword == "HEALTHCHECK")
    command = json.loads(healthcheck.arguments.removeprefix("CMD").strip())
    assert command[0] == "cp-grpc-health"
    return [f"127.0.0.1:{port}" if arg.startswith("127.0.0.1:") else arg for arg in command[1:]]


@contextmanager
def image_process(tmp_path: Path, **extra_env: str) -> Iterator[tuple[subprocess.Popen[bytes], Path, list, Path]]:
    """The image's default command as a process; yields it, its log, the final stage's instructions and the
    directory standing for the image's file system.

    The environment is the image's plus `extra_env`, without the caller's CP_* variables (as in a container).
    """
    instructions = _final_stage(parse(DOCKERFILE))
    command = image_command(instructions)
    assert command[0] == "controlplane"
    env = {key: value for key, value in os.environ.items() if not key.startswith("CP_")}
    # The image's file system under a short root: the embedded Redis's unix socket lives under its data
    # directory, and a socket path is at most 107 bytes (pytest's per-worker tmp_path can be longer).
    with tempfile.TemporaryDirectory(prefix="cp-image-", dir="/tmp") as root:
        env.update(image_environment(instructions, Path(root)))
        env.update(extra_env)
        log = tmp_path / "controller.log"
        with log.open("wb") as out:
            process = subprocess.Popen([str(Path(sys.executable).parent / "controlplane"), *command[1:]], env=env,
                                       stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
            try:
                yield process, log, instructions, Path(root)
            finally:
                stop_process(process, timeout_s=10.0)


def test_the_default_command_serves_on_loopback(tmp_path: Path) -> None:
    # Fixed ports may be taken on a test machine: free ones through the environment, which wins over the
    # image's settings file (the override deploy/README.md documents).
    port, metrics_port = free_port(), free_port()
    with image_process(tmp_path, CP_PORT=str(port), CP_METRICS_PORT=str(metrics_port)) as (process, log, ins, root):
        def serving() -> subprocess.CompletedProcess[str] | None:
            if process.poll() is not None:
                raise AssertionError(f"exit {process.returncode}: {log.read_text()[-3000:]}")
            result = health_check(*healthcheck_arguments(ins, port))
            return result if result.returncode == 0 else None

        result = wait_for(serving, timeout_s=60, what="the image's default command SERVING", interval_s=0.5)
        assert result.stdout.strip() == f"127.0.0.1:{port}: SERVING"
        assert "cp_ready 1.0" in http_text(f"http://127.0.0.1:{metrics_port}/metrics")
        data_dir = Path(image_environment(ins, root)["CP_DATA_DIR"])
        assert any(data_dir.iterdir()), "the embedded Redis keeps its data under the image's CP_DATA_DIR"
    assert "refusing" not in log.read_text()


def test_a_public_address_without_tls_and_tokens_is_refused(tmp_path: Path) -> None:
    with image_process(tmp_path, CP_HOST="0.0.0.0", CP_PORT=str(free_port())) as (process, log, _, _):
        assert process.wait(timeout=60) == 2
    text = log.read_text()
    assert "refusing to listen on non-loopback address '0.0.0.0' without TLS and token authentication" in text
    assert "host from env CP_HOST" in text
