"""`controlplane` command line: one entry point, one module per subcommand.

Environment and flags are read here and in the subcommand modules only; the core never sees them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from controlplane.cli import ctl, demo, plan, serve, sim
from controlplane.cli.args import ArgumentParser


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="controlplane",
        description="Control plane for vLLM fleets: batching mode, threshold, batch size and token budget.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(commands)
    ctl.register(commands)
    demo.register(commands)
    plan.register(commands)
    sim.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.run(args, parser) or 0)


if __name__ == "__main__":
    sys.exit(main())
