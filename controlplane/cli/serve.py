"""`controlplane serve`: run one controller.

Every setting is a flag, a CP_* environment variable and a key of the `--config` file (precedence: flag >
environment > file > default; `controlplane/cli/settings.py` holds the model, `controlplane config show`
prints the resolved values and their sources). The tokens come from CP_AGENT_TOKENS and CP_OPERATOR_TOKENS
("identity:token,…") or the file, never from a flag; CP_AGENT_SCOPES ("identity=engine-glob;engine-glob,…")
limits the engine ids an agent identity may hold. The standard OTEL_* variables drive trace export (nothing
is exported unless they ask for it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Mapping

from controlplane.cli.settings import SettingsError, default_data_dir, parse_scopes, parse_tokens
from controlplane.cli.settings_flags import add_settings_arguments, resolve_from_args
from controlplane.cli.workers import check_workers, run_workers
from controlplane.observability.tracing import create_tracer_provider, tracing_settings_from_env
from controlplane.service.app import ControllerApp
from controlplane.service.config import ControllerConfig
from controlplane.service.memory import settle_garbage_collector

__all__ = ["add_server_arguments", "config_from_args", "default_data_dir", "parse_scopes", "parse_tokens"]


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The controller's flags: `--config FILE` and one per setting (see `controlplane.cli.settings`)."""
    add_settings_arguments(parser)


def config_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> ControllerConfig:
    """Build the validated config from the flags, `env` and the settings file.

    Raises:
        SettingsError (a ValueError) naming each bad setting, its value and where it came from.
    """
    return resolve_from_args(args, env).controller_config()


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("serve", help="run the controller", description=__doc__)
    add_server_arguments(parser)
    parser.set_defaults(run=run)


async def serve_until_signalled(app: ControllerApp) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with app:
        settle_garbage_collector()
        await stop.wait()


def _serve_args() -> list[str]:
    """This command's arguments from `serve` on, for the workers' command lines."""
    try:
        return sys.argv[sys.argv.index("serve"):]
    except ValueError:
        raise SystemExit("--workers > 1 needs `controlplane serve` on the command line") from None


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        resolved = resolve_from_args(args, os.environ)
        config = resolved.controller_config()
    except SettingsError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=resolved.settings.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = resolved.settings
    if settings.workers > 1:
        try:
            check_workers(settings.workers, port=config.port, metrics_port=config.metrics_port)
        except ValueError as exc:
            parser.error(str(exc))
        return run_workers(_serve_args(), workers=settings.workers, controller_id=config.controller_id,
                           redis_url=config.redis_url, data_dir=config.data_dir, metrics_port=config.metrics_port)
    provider = create_tracer_provider(tracing_settings_from_env(os.environ))
    asyncio.run(serve_until_signalled(ControllerApp(config, tracer_provider=provider)))
    return 0
