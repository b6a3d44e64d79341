"""Smoke-test an installed vllm-controlplane: what the release workflow runs against the built wheel, installed
with its `controller` and `sim` extras in a clean virtual environment, from outside the checkout.

    python tools/wheel_smoke.py --bin VENV/bin [--version 0.1.0] [--outside CHECKOUT]

Checks, each through the installed `controlplane` script: the package is imported from the environment (with
--outside: not from that directory), `--version` (with --version: that version), `serve --help` and
`ctl --help`, `plan` on the shipped Qwen3-8B H200 calibrations (a decision with its terms), a small `sim run`,
and a real `serve` on a free loopback port (embedded Redis in a temporary directory) answering `ctl list`.
Needs only the standard library; exit 0 when every check passes, 1 naming the first that failed.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CALIBRATIONS = Path(__file__).resolve().parent.parent / "examples" / "calibrations"
PLAN_WORKLOAD = ["--mu-l", "512", "--mu-o", "256", "--kv-capacity-tokens", "1500000", "--max-num-seqs", "2048",
                 "--n-obs", "512", "--json"]
SERVE_TIMEOUT_S = 60.0


class SmokeError(Exception):
    """A check failed; the message names it."""


def _run(*argv: str | Path, cwd: Path, timeout_s: float = 120.0) -> str:
    """Run `argv` in `cwd`; its stdout, or SmokeError with its exit status and stderr."""
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, timeout=timeout_s,
                            check=False)
    if result.returncode != 0:
        raise SmokeError(f"{' '.join(map(str, argv))}: exit {result.returncode}: {result.stderr.strip()[-2000:]}")
    return result.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_import(python: Path, *, cwd: Path, outside: Path | None) -> str:
    location = _run(python, "-c", "import agents, controlplane; print(controlplane.__file__)", cwd=cwd).strip()
    if outside is not None and Path(location).resolve().is_relative_to(outside.resolve()):
        raise SmokeError(f"controlplane is imported from {location}, inside {outside}: not the installed package")
    return f"imported from {location}"


def check_version(controlplane: Path, *, cwd: Path, expected: str | None) -> str:
    printed = _run(controlplane, "--version", cwd=cwd).strip()
    if expected is not None and printed != f"controlplane {expected}":
        raise SmokeError(f"controlplane --version printed {printed!r}, expected 'controlplane {expected}'")
    return printed


def check_help(controlplane: Path, *, cwd: Path) -> str:
    if "--config FILE" not in _run(controlplane, "serve", "--help", cwd=cwd):
        raise SmokeError("controlplane serve --help does not list --config")
    if "CP_ADDRESS" not in _run(controlplane, "ctl", "--help", cwd=cwd):
        raise SmokeError("controlplane ctl --help does not name CP_ADDRESS")
    return "serve --help, ctl --help"


def check_plan(controlplane: Path, *, cwd: Path) -> str:
    files = [CALIBRATIONS / "pd_calibration_Qwen3-8B_H200.json", CALIBRATIONS / "beta_mb_Qwen3-8B_H200.json"]
    argv = [controlplane, "plan", *(arg for path in files for arg in ("--calibration", path)), *PLAN_WORKLOAD]
    plan = json.loads(_run(*argv, cwd=cwd))
    if plan.get("mode") not in ("mb", "eb") or not plan.get("n_star_requests"):
        raise SmokeError(f"controlplane plan gave no decision: {plan}")
    return f"plan: {plan['mode']} with N̂* {plan['n_star_requests']}"


def check_sim(controlplane: Path, *, cwd: Path) -> str:
    table = _run(controlplane, "sim", "run", "--scenario", "closed:uniform-200-60:c=32", "--requests", "100",
                 "--scheduler", "v1", "--scheduler", "eb-kstar", "--no-plots", cwd=cwd)
    if "eb-kstar" not in table or "tok/s" not in table:
        raise SmokeError(f"controlplane sim run printed no table: {table}")
    return "sim run"


def check_serve(controlplane: Path, *, cwd: Path) -> str:
    port = _free_port()
    address = f"127.0.0.1:{port}"
    log = cwd / "serve.log"
    with log.open("wb") as out:
        server = subprocess.Popen([str(controlplane), "serve", "--port", str(port), "--data-dir", str(cwd / "data")],
                                  stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            deadline = time.monotonic() + SERVE_TIMEOUT_S
            while True:
                if server.poll() is not None:
                    raise SmokeError(f"controlplane serve exited {server.returncode}: {log.read_text()[-2000:]}")
                try:
                    listed = json.loads(_run(controlplane, "ctl", "--address", address, "list", "-o", "json",
                                             cwd=cwd, timeout_s=30))
                    break
                except SmokeError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        finally:
            server.terminate()
            server.wait(timeout=30)
    if listed.get("engines") != []:
        raise SmokeError(f"ctl list against a fresh controller: {listed}")
    return f"serve on {address}, ctl list"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="the environment's bin directory")
    parser.add_argument("--version", help="the version `controlplane --version` must print")
    parser.add_argument("--outside", type=Path, help="fail when the package is imported from under this directory")
    args = parser.parse_args(argv)
    controlplane, python = args.bin.absolute() / "controlplane", args.bin.absolute() / "python"
    with tempfile.TemporaryDirectory(prefix="wheel-smoke-") as work:
        cwd = Path(work)
        checks = [lambda: check_import(python, cwd=cwd, outside=args.outside),
                  lambda: check_version(controlplane, cwd=cwd, expected=args.version),
                  lambda: check_help(controlplane, cwd=cwd), lambda: check_plan(controlplane, cwd=cwd),
                  lambda: check_sim(controlplane, cwd=cwd), lambda: check_serve(controlplane, cwd=cwd)]
        for check in checks:
            try:
                print(f"ok: {check()}", flush=True)
            except (SmokeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
                print(f"FAILED: {exc}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
