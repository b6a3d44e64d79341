"""The command line against real processes: the demo (the README's main job), serve + ctl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.cli.main import build_parser
from controlplane.cli.serve import config_from_args, parse_tokens


def _run(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def test_demo_runs_decisions_through_the_fleet(tmp_path: Path) -> None:
    result = _run("demo", "--data-dir", str(tmp_path / "data"), "--duration-s", "12", "--refresh-s", "1",
                  timeout_s=90)
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().split("\n\n")[-1].splitlines()
    assert "engines 4/4" in last[0]
    rows = [line.split() for line in last[2:]]
    assert len(rows) == 4
    modes = {row[0]: row[1] for row in rows}
    # The H200 pool stays on mixed batching, the bandwidth-bound RTX PRO 6000 pool goes exclusive.
    assert {modes[e] for e in modes if e.startswith("sim-0-")} == {"MB"}
    assert {modes[e] for e in modes if e.startswith("sim-1-")} == {"EB"}
    for row in rows:
        version, acked = int(row[6]), int(row[7])
        assert acked == version >= 2


def test_serve_refuses_open_address_without_auth() -> None:
    parser = build_parser()
    args = parser.parse_args(["serve", "--host", "0.0.0.0", "--data-dir", "/tmp/x"])
    with pytest.raises(ValueError, match="--insecure"):
        config_from_args(args, {})
    args = parser.parse_args(["serve", "--host", "0.0.0.0", "--data-dir", "/tmp/x", "--insecure"])
    assert config_from_args(args, {}).host == "0.0.0.0"
    with pytest.raises(ValueError, match="CP_AGENT_TOKENS"):
        parse_tokens("agent:short", source="CP_AGENT_TOKENS")


def test_serve_and_ctl_round_trip(tmp_path: Path, redis_url: str) -> None:
    env = {**os.environ, "CP_OPERATOR_TOKENS": "bob:operator-token-0123456789"}
    server = subprocess.Popen([sys.executable, "-m", "controlplane", "serve", "--port", "50177",
                               "--redis-url", redis_url], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            result = _run("ctl", "--address", "127.0.0.1:50177", "--token", "operator-token-0123456789", "list")
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert result.returncode == 0, result.stdout + result.stderr
        result = _run("ctl", "--address", "127.0.0.1:50177", "--token", "operator-token-0123456789",
                      "set-delta", "2e-5", "--scope", "pool:Qwen/Qwen3-8B|NVIDIA H200", "--reason", "ttft slo")
        assert result.returncode == 0, result.stdout + result.stderr
        record = json.loads(result.stdout)
        assert record["set_by"] == "bob" and record["delta_s_per_token"] == pytest.approx(2e-5)
        result = _run("ctl", "--address", "127.0.0.1:50177", "--token", "operator-token-0123456789",
                      "set-delta", "0.5", "--scope", "fleet")
        assert result.returncode == 1 and "INVALID_ARGUMENT" in result.stdout and "0.01" in result.stdout
        result = _run("ctl", "--address", "127.0.0.1:50177", "set-delta", "1e-5")
        assert result.returncode == 1 and "UNAUTHENTICATED" in result.stdout
    finally:
        server.terminate()
        server.wait(timeout=20)
