"""The command line against real processes: the demo (the README's main job) and `controlplane ctl` against it
(the README's operator commands as written, tables, `-o json|yaml`, errors, watch), serve + ctl with tokens."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from controlplane.cli.demo import listening_line
from controlplane.cli.main import build_parser
from controlplane.cli.serve import config_from_args, parse_tokens
from testbench.net import free_port
from tests.integration.controller_harness import COLD_START_REASONS

ROOT = Path(__file__).resolve().parents[2]
LIST_COLUMNS = ["ENGINE", "POOL", "CONNECTED", "VLLM", "MODE", "K", "N", "B_MAX", "B_CAP", "δ", "VERSION",
                "ACKED", "TELEMETRY AGE"]


def _run(*args: str, timeout_s: float = 60, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "controlplane", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False, env=env, cwd=cwd)


def ctl_json(*args: str, env: dict[str, str]) -> dict:
    """`controlplane ctl ARGS -o json`, which must succeed, parsed."""
    result = _run("ctl", *args, "-o", "json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_clean_error(result: subprocess.CompletedProcess[str], *, code: int, status: str) -> str:
    """A failed ctl call: exit `code`, nothing on stdout, one line on stderr naming the status."""
    assert result.returncode == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {status}"), result.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------------- demo


def test_demo_listens_on_the_ctl_default_and_its_help_states_its_defaults() -> None:
    args = build_parser().parse_args(["demo"])
    assert (args.port, args.decision_interval_s, args.cooldown_s) == (50151, 2.0, 10.0)
    assert build_parser().parse_args(["ctl", "list"]).address is None  # resolved at run: CP_ADDRESS, then default
    assert listening_line("127.0.0.1", 50151) == "controller listening on 127.0.0.1:50151 — try: controlplane ctl list"
    assert listening_line("127.0.0.1", 50999, ".venv/bin/controlplane").endswith(
        "try: .venv/bin/controlplane ctl --address 127.0.0.1:50999 list")
    result = _run("demo", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "gRPC port (default 50151; 0 picks a free one)" in text
    assert "recompute period, s (default 2.0)" in text
    assert "EB+ minimum time between switches, s (default 10.0)" in text
    # serve's own defaults are not claimed for the demo.
    assert "(default 5.0)" not in text and "(default 30.0)" not in text
    serve_help = " ".join(_run("serve", "--help").stdout.split())
    assert "recompute period, s (default 5.0)" in serve_help and "switches, s (default 30.0)" in serve_help


def test_demo_runs_decisions_through_the_fleet(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run([sys.executable, "-m", "controlplane", "demo", "--data-dir", str(tmp_path / "data"),
                             "--port", str(port), "--duration-s", "12", "--refresh-s", "1"], capture_output=True,
                            text=True, timeout=90, check=False, env={**os.environ, "COLUMNS": "120"})
    assert result.returncode == 0, result.stderr[-2000:]
    program = f"{Path(sys.executable).relative_to(ROOT)}" if Path(sys.executable).is_relative_to(ROOT) \
        else sys.executable
    assert result.stdout.splitlines()[0] == (f"controller listening on 127.0.0.1:{port} — try: {program} -m "
                                             f"controlplane ctl --address 127.0.0.1:{port} list")
    last = result.stdout.strip().split("\n\n")[-1].splitlines()
    assert last[0].startswith(f"controller listening on 127.0.0.1:{port}")
    assert any("engines 4/4" in line for line in last[1:3])  # [2]: the first line wrapped (a long interpreter path)
    assert max(len(line) for line in last) <= 120
    header = next(i for i, line in enumerate(last) if line.startswith("engine "))
    assert last[header].split() == ["engine", "pool", "mode", "k", "N", "B_max", "B_cap", "ver", "ack", "p0", "θ*",
                                    "LHS−RHS", "reason"]
    rows = [line.split() for line in last[header + 1:header + 5]]
    assert all(row[0].startswith("sim-") for row in rows)
    pools = {row[0]: row[1] for row in rows}
    # The H200 pool stays on mixed batching, the bandwidth-bound RTX PRO 6000 pool goes exclusive.
    assert {pools[e] for e in pools if e.startswith("sim-0-")} == {"H200"}
    assert {pools[e] for e in pools if e.startswith("sim-1-")} == {"RTX"}  # RTX PRO 6000, split on spaces
    for row in rows:
        cells = row[:2] + row[4:] if row[1] == "RTX" else row  # the pool's label as one cell
        mode, k, version, ack = cells[2], cells[3], cells[7], cells[8]
        assert mode == ("MB" if row[0].startswith("sim-0-") else "EB")
        assert (k == "–") == (mode == "MB")
        assert ack == "✓" and 2 <= int(version) < 10**6  # the version's sequence, ACKed


def test_the_demos_hint_runs_as_printed(tmp_path: Path) -> None:
    """The command the demo's first line suggests works from the directory the demo was started in."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("CP_ADDRESS", "CP_OPERATOR_TOKEN")}
    process = subprocess.Popen([sys.executable, "-m", "controlplane", "demo", "--data-dir", str(tmp_path / "data"),
                                "--port", str(port), "--duration-s", "60"], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        hint = first.split(" — try: ", 1)[1]
        result = subprocess.run(shlex.split(hint), capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
        assert result.returncode == 0, (hint, result.stderr)
        assert result.stdout.split()[:2] == ["ENGINE", "POOL"]
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=30)


def test_demo_on_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _run("demo", "--data-dir", str(tmp_path / "data"), "--port", str(port), "--duration-s", "5",
                      timeout_s=60)
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"error: cannot listen on 127.0.0.1:{port} (in use?): pass --port N" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------------------------------------- ctl vs the demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running demo on a free port whose four engines have data-driven decisions; the env to reach it."""
    data = tmp_path_factory.mktemp("demo")
    port = free_port()
    log = (data / "demo.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "controlplane", "demo", "--data-dir", str(data / "redis"),
                                "--port", str(port), "--refresh-s", "5"], stdout=log, stderr=subprocess.STDOUT)
    env = {**os.environ, "CP_ADDRESS": f"127.0.0.1:{port}"}
    try:
        deadline = time.monotonic() + 90
        while True:
            result = _run("ctl", "list", "-o", "json", env=env)
            if result.returncode == 0:
                engines = json.loads(result.stdout)["engines"]
                if len(engines) == 4 and all(e["reason"] not in (None, *COLD_START_REASONS) for e in engines):
                    break
            assert time.monotonic() < deadline, (data / "demo.log").read_text()[-3000:]
            assert process.poll() is None, (data / "demo.log").read_text()[-3000:]
            time.sleep(1.0)
        yield env
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_readme_operator_commands_run_as_written(demo: dict[str, str], tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("export CP_ADDRESS=127.0.0.1:50151"):]
    block = block[:block.index("```")].replace("\\\n", " ")
    commands = [shlex.split(line, comments=True)[1:] for line in block.splitlines()
                if line.startswith(".venv/bin/controlplane ctl ")]
    assert [c[1] for c in commands] == ["list", "explain", "get", "set-delta", "pin", "overrides", "clear", "audit",
                                        "calibration", "report", "watch"]
    engine_id = ctl_json("list", env=demo)["engines"][0]["engine_id"]
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the README's relative paths, report.html in tmp
    for argv in commands[:-1]:
        argv = [arg.replace("ENGINE_ID", engine_id) for arg in argv]
        result = _run(*argv, env=demo, cwd=tmp_path)
        assert result.returncode == 0, (argv, result.stdout, result.stderr)
        assert result.stdout or argv[1] == "report"
    assert (tmp_path / "report.html").stat().st_size > 1000
    calibration = ctl_json("calibration", "get", "--pool", "Qwen/Qwen3-8B|NVIDIA H200", env=demo)
    assert calibration["source"] == "pd_calibration_Qwen3-8B_H200.json,beta_mb_Qwen3-8B_H200.json"
    assert calibration["alpha_p_s"] == 0.0012785933415095027 and calibration["set_by"] == "anonymous"
    # The last one, watch, runs until interrupted: it prints the current decisions first.
    watch = _interruptible([sys.executable, "-X", "faulthandler", "-m", "controlplane", *commands[-1]], env=demo,
                           cwd=tmp_path)
    assert watch.stdout is not None
    header = watch.stdout.readline().split()
    assert header[:3] == ["EVENT", "ENGINE", "MODE"]
    snapshot = [watch.stdout.readline().split() for _ in range(4)]
    assert {row[0] for row in snapshot} == {"snapshot"} and len({row[1] for row in snapshot}) == 4
    watch.send_signal(signal.SIGINT)
    try:
        _, err = watch.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        watch.send_signal(signal.SIGABRT)  # -X faulthandler: every thread's stack on stderr
        _, err = watch.communicate(timeout=10)
        raise AssertionError(f"ctl watch still running 20 s after SIGINT:\n{err[-6000:]}") from None
    assert watch.returncode == 130 and "Traceback" not in err


def _interruptible(argv: list[str], **kwargs) -> subprocess.Popen[str]:
    """Start argv as a terminal starts a foreground command: SIGINT at its default disposition. A child inherits an
    ignored SIGINT, and Python then leaves it ignored; this process's may not be the default. (A `ctl watch` that
    outlived its SIGINT by 20 s in some suites had another cause: the signal handed to one of its gRPC threads,
    `tests/integration/test_ctl_interrupt.py`.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    finally:
        if previous is not None:  # None: set outside Python, and it cannot be restored from here
            signal.signal(signal.SIGINT, previous)


def test_list_table_and_data_formats(demo: dict[str, str]) -> None:
    table = _run("ctl", "list", env=demo)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.rstrip().splitlines()
    assert re.split(r"\s{2,}", lines[0].strip()) == LIST_COLUMNS
    assert len(lines) == 5 and all(line.startswith("sim-") for line in lines[1:])
    as_json = ctl_json("list", env=demo)
    as_yaml = yaml.safe_load(_run("ctl", "-o", "yaml", "list", env=demo).stdout)
    assert [e["engine_id"] for e in as_yaml["engines"]] == [e["engine_id"] for e in as_json["engines"]]
    for engine in as_json["engines"]:
        assert isinstance(engine["decision_version"], int) and isinstance(engine["acked_version"], int)
        assert isinstance(engine["num_completions"], int) and engine["num_completions"] > 0
        assert engine["mode"] in ("mb", "eb") and engine["connected"] is True
        assert isinstance(engine["limits"]["kv_capacity_tokens"], int)
        assert engine["pool"]["model"] == "Qwen/Qwen3-8B"
        assert isinstance(engine["telemetry_age_s"], float) and engine["telemetry_age_s"] >= 0
        assert engine["decided_at"].endswith("Z") and isinstance(engine["decided_at_s"], float)
        # Zero values are present, not omitted.
        assert "num_sequence_gaps" in engine and "excluded_from_pool" in engine and "delta_s_per_token" in engine
    by_pool = ctl_json("list", "--pool", "Qwen/Qwen3-8B|NVIDIA H200", env=demo)
    assert {e["pool"]["accelerator"] for e in by_pool["engines"]} == {"NVIDIA H200"}


def test_get_and_explain(demo: dict[str, str]) -> None:
    engines = ctl_json("list", env=demo)["engines"]
    engine_id = next(e["engine_id"] for e in engines if e["mode"] == "eb")
    view = ctl_json("get", engine_id, env=demo)
    assert view["engine_id"] == engine_id and view["engine"]["engine_id"] == engine_id
    decision = view["decision"]
    assert isinstance(decision["version"], int) and decision["mode"] == "eb"
    assert decision["decided_at"].endswith("Z") and decision["decided_at_s"] > 0
    assert isinstance(decision["flags"], list) and isinstance(decision["diagnostics"]["n_star"], int)
    explained = ctl_json("explain", engine_id, env=demo)
    terms, rule = explained["terms"], explained["rule"]
    assert rule["evaluated"] is True
    assert rule["verdict"] == ("mb" if terms["lhs_s_per_token"] < terms["rhs_s_per_token"]
                               + terms["delta_s_per_token"] else "eb")
    assert rule["delta_flip_s_per_token"] == terms["lhs_s_per_token"] - terms["rhs_s_per_token"]
    assert terms["k_star_requests"] <= terms["n_star_requests"] and 0 < terms["theta_star"] < 1
    table = _run("ctl", "explain", engine_id, env=demo).stdout
    for symbol in ("p0", "η", "μ_L", "μ_O", "θ0", "Δθ", "θ̂*", "N̂*", "k̂*", "LHS", "RHS", "δ", "δ_flip", "rule",
                   "flags"):
        assert re.search(rf"^{re.escape(symbol)}\s", table, re.MULTILINE), symbol
    assert f"→ {rule['verdict'].upper()}" in table


def test_override_commands_and_their_data(demo: dict[str, str]) -> None:
    scope = "pool:Qwen/Qwen3-8B|NVIDIA RTX PRO 6000"
    result = _run("ctl", "set-delta", "-2e-5", "--scope", scope, "--reason", "throughput", "-o", "json", env=demo)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["scope"] == scope and record["kind"] == "delta" and record["delta_s_per_token"] == -2e-5
    assert record["warnings"] == [] and record["expires_at"] is None and record["expires_at_s"] == 0.0
    assert record["set_at"].endswith("Z")
    engines = ctl_json("list", env=demo)["engines"]
    engine = next(e for e in engines if e["pool"]["accelerator"] == "NVIDIA RTX PRO 6000")
    engine_id, max_num_seqs = engine["engine_id"], engine["limits"]["max_num_seqs"]
    result = _run("ctl", "pin", "eb", "--scope", f"engine:{engine_id}", "--n", "5000", "-o", "json", env=demo)
    assert result.returncode == 0, result.stderr
    warning = (f"n=5000 exceeds max_num_seqs={max_num_seqs} of engine '{engine_id}': the pin's n is ignored there "
               f"(flag pin_invalid)")
    assert json.loads(result.stdout)["warnings"] == [warning]
    assert result.stderr == f"warning: {warning}\n"
    overrides = ctl_json("overrides", env=demo)["overrides"]
    assert ("pool:Qwen/Qwen3-8B|NVIDIA RTX PRO 6000", "delta") in {(o["scope"], o["kind"]) for o in overrides}
    table = _run("ctl", "overrides", env=demo).stdout
    assert "δ=-2e-05 s/token" in table and "eb n=5000" in table
    assert _run("ctl", "clear", "pin", "--scope", f"engine:{engine_id}", env=demo).returncode == 0
    assert _run("ctl", "clear", "delta", "--scope", scope, env=demo).returncode == 0
    audit = ctl_json("audit", "--limit", "3", env=demo)["entries"]
    assert [(a["action"], a["kind"]) for a in audit] == [("clear", "delta"), ("clear", "pin"), ("set", "pin")]
    assert audit[0]["old"]["delta_s_per_token"] == -2e-5 and audit[0]["new"] is None
    assert audit[0]["at"].endswith("Z") and audit[0]["target"] == scope


def test_a_scope_no_engine_reported_warns_and_strict_refuses_it(demo: dict[str, str]) -> None:
    typo = "pool:Qwen/Qwen3-8B|NVIDIA-H200"
    unknown = ("pool 'Qwen/Qwen3-8B|NVIDIA-H200' has no engine the controller knows (connected or remembered; known "
               "pools: 'Qwen/Qwen3-8B|NVIDIA H200', 'Qwen/Qwen3-8B|NVIDIA RTX PRO 6000')")
    before = ctl_json("overrides", env=demo)["overrides"]
    for change in (("set-delta", "1e-5"), ("pin", "eb"), ("clear", "delta")):
        line = assert_clean_error(_run("ctl", *change, "--scope", typo, "--strict", env=demo), code=1,
                                  status="--strict")
        assert line == f"error: --strict: {unknown}; nothing was changed"
    line = assert_clean_error(_run("ctl", "pin", "mb", "--scope", "engine:sim-9-9", "--strict", env=demo), code=1,
                              status="--strict")
    assert line.startswith("error: --strict: engine 'sim-9-9' is not an engine the controller knows")
    assert ctl_json("overrides", env=demo)["overrides"] == before
    # Without --strict the change is made, and the warning printed (stderr) and returned (data).
    warning = f"{unknown}: the override is kept and applies only if such an engine connects"
    result = _run("ctl", "set-delta", "1e-5", "--scope", typo, "-o", "json", env=demo)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["warnings"] == [warning] and result.stderr == f"warning: {warning}\n"
    result = _run("ctl", "clear", "delta", "--scope", typo, env=demo)
    assert result.returncode == 0 and result.stderr == f"warning: {warning}\n"
    # A known scope passes --strict, without a warning.
    for change in (("set-delta", "1e-5"), ("clear", "delta")):
        result = _run("ctl", *change, "--scope", "pool:Qwen/Qwen3-8B|NVIDIA RTX PRO 6000", "--strict", env=demo)
        assert result.returncode == 0 and result.stderr == "", result.stderr


def test_ctl_errors_are_one_line_on_stderr(demo: dict[str, str], tmp_path: Path) -> None:
    line = assert_clean_error(_run("ctl", "get", "no-such-engine", env=demo), code=1, status="NOT_FOUND")
    assert "no decision for engine 'no-such-engine'" in line
    assert_clean_error(_run("ctl", "clear", "pin", "--scope", "fleet", env=demo), code=1, status="NOT_FOUND")
    line = assert_clean_error(_run("ctl", "set-delta", "0.5", "--scope", "fleet", env=demo), code=1,
                              status="INVALID_ARGUMENT")
    assert "0.01" in line
    closed = {**demo, "CP_ADDRESS": f"127.0.0.1:{free_port()}"}
    assert_clean_error(_run("ctl", "list", "--timeout-s", "3", env=closed), code=1, status="UNAVAILABLE")
    line = assert_clean_error(_run("ctl", "calibration", "put", "--pool", "m|a", "--file",
                                   str(tmp_path / "missing.json"), env=demo), code=2, status="--file")
    assert "cannot read" in line
    # Usage errors: the scope is required, never defaulted to the fleet.
    result = _run("ctl", "set-delta", "1e-5", env=demo)
    assert result.returncode == 2 and "the following arguments are required: --scope" in result.stderr
    result = _run("ctl", "pin", "eb", "--scope", "everywhere", env=demo)
    assert result.returncode == 2
    assert "scope must be fleet, pool:MODEL|ACCELERATOR[|ROLE] or engine:ENGINE_ID" in result.stderr
    result = _run("ctl", "pin", "eb", "--scope", "fleet", "--n", "1e7", env=demo)
    assert result.returncode == 2 and "argument --n: must be between 0 and 1048576" in result.stderr


def test_watch_prints_a_snapshot_then_pushed_decisions(demo: dict[str, str]) -> None:
    watch = subprocess.Popen([sys.executable, "-m", "controlplane", "ctl", "watch", "-o", "json", "--max-events",
                              "1", "--pool", "Qwen/Qwen3-8B|NVIDIA H200"], env=demo, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert watch.stdout is not None
    snapshot = [json.loads(watch.stdout.readline()) for _ in range(2)]
    assert {e["event"] for e in snapshot} == {"snapshot"}
    assert {e["pool"]["accelerator"] for e in snapshot} == {"NVIDIA H200"}
    # A new δ for the pool changes its engines' instruction: a new version is pushed.
    result = _run("ctl", "set-delta", "3e-5", "--scope", "pool:Qwen/Qwen3-8B|NVIDIA H200", env=demo)
    assert result.returncode == 0, result.stderr
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == 0, err
    pushed = [json.loads(line) for line in out.splitlines()]
    assert len(pushed) == 1 and pushed[0]["event"] == "pushed"
    assert pushed[0]["delta_s_per_token"] == 3e-5
    before = next(e for e in snapshot if e["engine_id"] == pushed[0]["engine_id"])
    assert pushed[0]["decision_version"] > before["decision_version"]
    assert _run("ctl", "clear", "delta", "--scope", "pool:Qwen/Qwen3-8B|NVIDIA H200", env=demo).returncode == 0


def test_help_names_units_and_environment_variables() -> None:
    text = " ".join(_run("ctl", "--help").stdout.split())
    for name in ("CP_ADDRESS", "CP_OPERATOR_TOKEN", "CP_TLS_CA", "CP_TLS_CERT", "CP_TLS_KEY", "127.0.0.1:50151"):
        assert name in text
    for command in ("list", "get", "explain", "overrides", "audit", "set-delta", "pin", "clear", "watch",
                    "calibration", "report"):
        assert command in text
    text = " ".join(_run("ctl", "set-delta", "--help").stdout.split())
    assert "δ in seconds per token" in text and "(required)" in text and "env CP_ADDRESS" in text
    assert "seconds until the override lapses" in text
    text = " ".join(_run("ctl", "pin", "--help").stdout.split())
    assert "batch size cap N, requests" in text and "at most 1048576" in text


# ------------------------------------------------------------------------------------------- serve + ctl


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
    port = free_port()
    env = {**os.environ, "CP_OPERATOR_TOKENS": "bob:operator-token-0123456789"}
    server = subprocess.Popen([sys.executable, "-m", "controlplane", "serve", "--port", str(port),
                               "--redis-url", redis_url], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            result = _run("ctl", "--address", address, "--token", "operator-token-0123456789", "list")
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert result.returncode == 0, result.stdout + result.stderr
        assert re.split(r"\s{2,}", result.stdout.splitlines()[0].strip()) == LIST_COLUMNS
        assert json.loads(_run("ctl", "--address", address, "--token", "operator-token-0123456789", "list",
                               "-o", "json").stdout) == {"engines": []}
        # The token from the environment, the options after the command.
        token_env = {**os.environ, "CP_OPERATOR_TOKEN": "operator-token-0123456789"}
        result = _run("ctl", "set-delta", "2e-5", "--scope", "pool:Qwen/Qwen3-8B|NVIDIA H200", "--reason",
                      "ttft slo", "--address", address, "-o", "json", env=token_env)
        assert result.returncode == 0, result.stdout + result.stderr
        record = json.loads(result.stdout)
        assert record["set_by"] == "bob" and record["delta_s_per_token"] == pytest.approx(2e-5)
        audit = json.loads(_run("ctl", "audit", "-o", "json", "--address", address, env=token_env).stdout)
        assert audit["entries"][0]["actor"] == "bob" and audit["entries"][0]["reason"] == "ttft slo"
        line = assert_clean_error(_run("ctl", "--address", address, "--token", "operator-token-0123456789",
                                       "set-delta", "0.5", "--scope", "fleet"), code=1, status="INVALID_ARGUMENT")
        assert "0.01" in line
        assert_clean_error(_run("ctl", "--address", address, "set-delta", "1e-5", "--scope", "fleet"), code=1,
                           status="UNAUTHENTICATED")
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_objective_commands_set_list_and_clear(demo: dict[str, str]) -> None:
    scope = "pool:Qwen/Qwen3-8B|NVIDIA RTX PRO 6000"
    result = _run("ctl", "set-objective", "--scope", scope, "--ttft-quantile", "0.99", "--ttft-target-s", "2",
                  "--budget-min", "512", "--budget-max", "8192", "--reason", "chat", "-o", "json", env=demo)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["kind"] == "objective" and record["objective"]["ttft_target_s"] == 2.0
    assert (record["objective"]["budget_min_tokens"], record["objective"]["budget_max_tokens"]) == (512, 8192)
    crossed = _run("ctl", "set-objective", "--scope", scope, "--ttft-quantile", "0.99", "--ttft-target-s", "2",
                   "--budget-min", "9000", "--budget-max", "8192", env=demo)
    assert crossed.returncode != 0 and "budget_min_tokens 9000 exceeds budget_max_tokens 8192" in crossed.stderr
    assert "TTFT p99 ≤ 2 s" in _run("ctl", "objectives", env=demo).stdout
    bad = _run("ctl", "set-objective", "--scope", scope, "--ttft-quantile", "0.99", env=demo)
    assert bad.returncode != 0 and "ttft_target_s" in bad.stderr
    assert _run("ctl", "clear", "objective", "--scope", scope, env=demo).returncode == 0
    assert ctl_json("objectives", env=demo)["objectives"] == []
    audit = ctl_json("audit", "--limit", "2", env=demo)["entries"]
    assert [(a["action"], a["kind"]) for a in audit] == [("clear", "objective"), ("set", "objective")]


def test_rollout_commands_list_and_refuse_a_pool_without_one(demo: dict[str, str]) -> None:
    listed = ctl_json("rollouts", env=demo)
    assert set(listed) == {"rollouts", "recent"}
    assert all(r["state"] == "running" for r in listed["rollouts"])
    table = _run("ctl", "rollouts", env=demo).stdout
    assert "POOL" in table and "CHANGE" in table
    missing = _run("ctl", "rollout", "abort", "--pool", "no/such|pool", "--reason", "test", env=demo)
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
