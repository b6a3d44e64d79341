"""Command-line flags of the controller's settings: one flag per setting (`controlplane serve`, `demo`,
`config show`) and the settings given by a parsed command line.

Flags are one source among the environment and the file; `controlplane.cli.settings` merges them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, get_args

from controlplane.cli.settings import (
    CONFIG_ENV,
    FIELDS,
    FlagDefault,
    ResolvedSettings,
    default_text,
    env_of,
    flag_of,
    resolve_controller_settings,
    rule_text,
)


def _flag_type(annotation: Any) -> Callable[[str], Any] | None:
    """The argparse type of a setting's flag (None for a boolean); pydantic validates the value after."""
    kinds = [a for a in (get_args(annotation) or (annotation,)) if a is not type(None)]
    if kinds == [bool]:
        return None
    if kinds == [int]:
        return int
    if kinds == [float]:
        return float
    if kinds == [Path]:
        return Path
    return str


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `--config` and a flag per setting (booleans as --name / --no-name). A flag not given leaves the
    environment, the file or the default in force: its namespace value is a `FlagDefault`."""
    parser.add_argument("--config", type=Path, metavar="FILE",
                        help=f"settings file, YAML or TOML, in sections (env {CONFIG_ENV}); precedence: "
                        "flag > environment > file > default; `controlplane config show` prints the result")
    for name, field in FIELDS.items():
        flag = flag_of(name)
        if not flag:
            continue
        rule = rule_text(name)
        default = default_text(name)
        note = FIELDS[name].json_schema_extra["note"]  # type: ignore[index]
        text = (f"{field.description} (default %(default)s" + f"; {note}" * bool(note) + f"); env {env_of(name)}"
                + f"; {rule}" * bool(rule)).replace("%", "%%").replace("%%(default)s", "%(default)s")
        kind = _flag_type(field.annotation)
        unset = FlagDefault(str(default) if default != "" else "none")
        if kind is None:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=unset, help=text)
        else:
            parser.add_argument(flag, dest=name, type=kind, default=unset, metavar=name.upper(), help=text)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags or set as a command's own defaults (flags not given are left out)."""
    given = {name: getattr(args, name, None) for name in FIELDS}
    return {name: value for name, value in given.items() if value is not None and not isinstance(value, FlagDefault)}


def resolve_from_args(args: argparse.Namespace, env: Mapping[str, str]) -> ResolvedSettings:
    """`resolve_controller_settings` over the flags of `add_settings_arguments` and `env`."""
    return resolve_controller_settings(env=env, flags=flags_from_args(args), config_file=getattr(args, "config", None))
