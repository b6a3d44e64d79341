"""`controlplane demo`: the controller on its embedded Redis plus a synthetic fleet, with a live view.

Two pools (Qwen3-8B on H200 and on RTX PRO 6000, the EB paper's published cost profiles) of twin
engines (`controlplane.sim.engine`, scheduled by the agent's own enforcement code) stream telemetry over
real gRPC; the controller decides from it and the engines apply and ACK
the decisions. The terminal shows every engine's decision as it changes, laid out for its width
(`controlplane.cli.demo_view`). Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from controlplane.api.v1 import common_pb2
from controlplane.cli.ctl import DEFAULT_ADDRESS
from controlplane.cli.demo_view import EngineRow, Status, ctl_program, render_view
from controlplane.cli.serve import add_server_arguments, config_from_args
from controlplane.fleet import FleetPool, SyntheticFleet
from controlplane.fleet.profiles import (
    H200_QWEN3_8B,
    H200_QWEN3_8B_SHAPE,
    RTX_PRO_6000_QWEN3_8B,
    RTX_PRO_6000_QWEN3_8B_SHAPE,
)
from controlplane.loop.codec import cost_model_to_calibration
from controlplane.observability.tracing import create_tracer_provider, tracing_settings_from_env
from controlplane.service.app import ControllerApp

MODEL = "Qwen/Qwen3-8B"
DEMO_PORT = 50151  # the port `controlplane ctl` reaches by default
POOLS = (
    FleetPool(model=MODEL, accelerator="NVIDIA H200", cost_model=H200_QWEN3_8B, shape=H200_QWEN3_8B_SHAPE),
    FleetPool(model=MODEL, accelerator="NVIDIA RTX PRO 6000", cost_model=RTX_PRO_6000_QWEN3_8B,
              shape=RTX_PRO_6000_QWEN3_8B_SHAPE),
)


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("demo", help="controller + synthetic fleet with a live view", description=__doc__)
    add_server_arguments(parser)
    parser.add_argument("--engines", type=int, default=4,
                        help="simulated engines, split over two pools (default %(default)s)")
    parser.add_argument("--workload", default="geometric:256/uniform:512/closed:192",
                        help="output/prompt[/closed:concurrency] (default %(default)s)")
    parser.add_argument("--speed", type=float, default=40.0,
                        help="simulated seconds per wall second (default %(default)s)")
    parser.add_argument("--duration-s", type=float, default=0.0,
                        help="stop after this many seconds (default %(default)s: run until Ctrl-C)")
    parser.add_argument("--refresh-s", type=float, default=1.0,
                        help="live view refresh period, s (default %(default)s)")
    # The server flags' help shows these defaults (argparse's %(default)s), so --help states what the demo uses.
    parser.set_defaults(run=run, port=DEMO_PORT, decision_interval_s=2.0, cooldown_s=10.0)


def listening_line(host: str, port: int, program: str = "controlplane") -> str:
    """Where the demo's controller listens and the ctl command that reaches it (`program`: how to run
    `controlplane` from here, `demo_view.ctl_program`)."""
    address = f"{host}:{port}"
    ctl = f"{program} ctl list" if address == DEFAULT_ADDRESS else f"{program} ctl --address {address} list"
    return f"controller listening on {address} — try: {ctl}"


def _program() -> str:
    return ctl_program(argv0=sys.argv[0], executable=sys.executable, cwd=Path.cwd(), path=os.environ.get("PATH"))


def _rows(app: ControllerApp) -> list[EngineRow]:
    assert app.controller is not None
    rows = []
    for info in app.controller.engine_infos():
        view = app.controller.decision_view(info.engine_id)
        if view is None:
            continue
        d = view.decision
        diag = d.diagnostics
        rows.append(EngineRow(
            engine_id=info.engine_id, model=view.pool.model, accelerator=view.pool.accelerator,
            mode=common_pb2.Mode.Name(d.mode).removeprefix("MODE_"), k=d.k, n=d.n,
            b_max_tokens=d.budget.b_max_tokens, b_cap_tokens=d.budget.b_cap_tokens, version=d.version,
            acked_version=info.acked_version, p0_per_token=diag.p0, theta_star=diag.theta_star,
            lhs_minus_rhs_s_per_token=diag.lhs_s_per_token - diag.rhs_s_per_token, reason=d.reason))
    return rows


def _view(app: ControllerApp, fleet: SyntheticFleet, started_s: float, *, width: int) -> str:
    stats = fleet.stats()
    status = Status(listening=listening_line(app.config.host, app.port, _program()), redis_url=app.redis_url,
                    up_s=time.monotonic() - started_s, num_connected=stats.num_connected,
                    num_engines=stats.num_engines, num_batches_sent=stats.num_batches_sent,
                    num_decisions_applied=stats.num_decisions_applied, num_completed=stats.num_completed)
    return render_view(status, _rows(app), width=width)


async def _demo(args: argparse.Namespace, app: ControllerApp) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await app.start()
    except BaseException:
        await app.stop(grace_s=0.5)  # the embedded Redis may already run
        raise
    try:
        assert app.controller is not None
        print(listening_line(app.config.host, app.port, _program()), flush=True)
        for pool in POOLS:
            await app.controller.put_calibration(cost_model_to_calibration(
                pool.cost_model, common_pb2.Pool(model=pool.model, accelerator=pool.accelerator),
                source="EB paper reference profile"))
        fleet = SyntheticFleet(f"127.0.0.1:{app.port}", num_engines=args.engines, workload=args.workload,
                               pools=POOLS, speed=args.speed, batch_interval_s=args.speed * 0.5)
        await fleet.start()
        started_s = time.monotonic()
        tty = sys.stdout.isatty()
        try:
            while not stop.is_set():
                if args.duration_s and time.monotonic() - started_s >= args.duration_s:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.refresh_s)
                # The terminal's width (COLUMNS when set; 120 when the output is not a terminal).
                text = _view(app, fleet, started_s, width=shutil.get_terminal_size((120, 24)).columns)
                print(("\x1b[H\x1b[2J" if tty else "\n") + text, flush=True)
        finally:
            await fleet.stop()
    finally:
        await app.stop()


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.engines < 1:
        parser.error(f"--engines must be ≥ 1, got {args.engines}")
    try:
        config = config_from_args(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    app = ControllerApp(config, tracer_provider=create_tracer_provider(tracing_settings_from_env(os.environ)))
    try:
        asyncio.run(_demo(args, app))
    except RuntimeError as exc:
        if "bind" not in str(exc).lower():
            raise
        print(f"error: cannot listen on {config.host}:{config.port} (in use?): pass --port N (0 picks a free "
              f"port) — {exc}", file=sys.stderr)
        return 1
    return 0
