"""Machine and human output of `controlplane ctl`: protobuf messages as plain data, and that data as JSON,
YAML or a kubectl-style table.

The data schema (what `-o json|yaml` prints) is stable: the proto field names (snake_case, units in the
names), every field present (zeros, empty strings, `[]` for empty lists, `null` for an absent message),
64-bit integers as integers, enums as lower-case names without their prefix ("eb", "pool", "delta"),
override scopes as the CLI writes them ("fleet", "pool:MODEL|ACCELERATOR[|ROLE]", "engine:ID"), and every
`at_s` / `*_at_s` timestamp (Unix seconds) preceded by `at` / `*_at`, the same instant in ISO-8601 UTC
(`null` when 0).
No I/O besides the stream passed to the printers.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import yaml
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controlplane.api.v1 import operator_pb2
from controlplane.protocol import pool_key_of_message

FORMATS = ("table", "json", "yaml")


def iso_utc(at_s: float) -> str | None:
    """ISO-8601 UTC of Unix seconds, millisecond precision ("2026-05-16T14:45:55.123Z"); None for ≤ 0."""
    if not at_s > 0.0:
        return None
    try:
        moment = dt.datetime.fromtimestamp(at_s, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def enum_name(enum: EnumDescriptor, number: int) -> str:
    """"MODE_EB" of enum Mode → "eb"; an unknown number → its decimal text."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
    name = value.name
    return (name[len(prefix):] if name.startswith(prefix) else name).lower()


def pool_text(pool: dict[str, Any] | None) -> str:
    """A pool (as `message_to_dict` gives it) as the CLI writes it: MODEL|ACCELERATOR, "|ROLE" appended for a
    KV-transfer role (producer, consumer, both): the pool's key."""
    pool = pool or {}
    role = pool.get("kv_role")
    return f"{pool.get('model', '')}|{pool.get('accelerator', '')}" + (f"|{role}" if role not in (None, "",
                                                                                            "unspecified") else "")


def scope_text(scope: operator_pb2.Scope) -> str:
    """A scope as the CLI writes it: fleet, pool:MODEL|ACCELERATOR[|ROLE], engine:ID ("unspecified" when unset)."""
    if scope.kind == operator_pb2.SCOPE_KIND_FLEET:
        return "fleet"
    if scope.kind == operator_pb2.SCOPE_KIND_POOL:
        return f"pool:{pool_key_of_message(scope.pool)}"
    if scope.kind == operator_pb2.SCOPE_KIND_ENGINE:
        return f"engine:{scope.engine_id}"
    return "unspecified"


def message_to_dict(message: Message) -> dict[str, Any]:
    """Every field of `message` as plain data (see the module docstring for the conventions)."""
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.is_repeated:
            out[field.name] = [_value(field, item) for item in value]
        elif field.type == FieldDescriptor.TYPE_MESSAGE and not message.HasField(field.name):
            out[field.name] = None
        else:
            if field.name == "at_s" or field.name.endswith("_at_s"):
                out[field.name[:-2]] = iso_utc(value)
            out[field.name] = _value(field, value)
    return out


def _value(field: FieldDescriptor, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if isinstance(value, operator_pb2.Scope):
            return scope_text(value)
        return message_to_dict(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_name(field.enum_type, value)
    return value


def print_data(data: Any, fmt: str, *, out: TextIO | None = None) -> None:
    """Print `data` as indented JSON or as YAML (block style, keys in insertion order)."""
    out = out or sys.stdout
    if fmt == "json":
        out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    elif fmt == "yaml":
        out.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False))
    else:
        raise ValueError(f"not a data format: {fmt!r}")
    out.flush()


def console(out: TextIO | None = None) -> Console:
    """A rich console: the terminal's width on a terminal, wide and colourless when piped."""
    out = out or sys.stdout
    if hasattr(out, "isatty") and out.isatty():
        return Console(file=out, highlight=False)
    return Console(file=out, width=max(shutil.get_terminal_size((240, 24)).columns, 240), highlight=False,
                   color_system=None)


def print_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, out: TextIO | None = None,
                title: str | None = None) -> None:
    """A kubectl-style table: upper-case headers, no borders, columns separated by at least two spaces."""
    table = Table(*columns, box=None, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold", title=title,
                  title_justify="left", show_edge=False)
    for row in rows:
        table.add_row(*(Text(cell_text(cell)) for cell in row))
    out = out or sys.stdout
    if out.isatty():
        console(out).print(table)
        return
    buffer = io.StringIO()
    console(buffer).print(table)
    # Piped: no padding after the last column, so that lines compare and split cleanly.
    out.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))
    out.flush()


def print_fields(fields: Sequence[tuple[str, Any]], *, out: TextIO | None = None, title: str | None = None) -> None:
    """One object as a two-column FIELD / VALUE table."""
    print_table(("FIELD", "VALUE"), fields, out=out, title=title)


def cell_text(value: Any) -> str:
    """A value as table text: "-" for None or "", 6 significant digits for floats (3 decimals from 10^6 on,
    e.g. Unix seconds), yes/no for booleans, lists comma-joined; control characters escaped (a stored text
    such as an override's reason can neither move the cursor nor forge a row)."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) >= 1e6 else f"{value:.6g}"  # Unix seconds keep their digits
    if isinstance(value, list | tuple):
        return ", ".join(cell_text(v) for v in value) or "-"
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
