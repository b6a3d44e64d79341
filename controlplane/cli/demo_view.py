"""The demo's live view: a status block, one row per engine and a legend, laid out for a terminal width.

Rows carry what `ctl list` and `ctl explain` show, shortened to be read at a glance: the pool by the shortest
label that tells the demo's pools apart, the decision version by its sequence (VERSION mod 10^9, the digits
that change; the full number is `ctl list`'s), k only where it applies (exclusive batching), and p0, θ* and
LHS − RHS with a one-line legend. Where the width allows, the budgets and the ACKed version get columns of
their own; where it does not, they are left out and a version not yet ACKed is marked with `*`. No line is
wider than the width asked for (rich lays the table out; long cells are cut with an ellipsis). Pure: data
in, text out.
"""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from controlplane.protocol import split_version

# The legend, one line of at most 80 columns: p0 per token, θ* a fraction, LHS − RHS and δ in s/token.
LEGEND = "p0: P(end)/token · θ*: switch point k/N · LHS−RHS < δ → MB, else EB (s/token)"


@dataclass(frozen=True, slots=True)
class EngineRow:
    """One engine's decision in force, with the terms the view shows (from `ctl explain`'s diagnostics)."""

    engine_id: str
    model: str
    accelerator: str
    mode: str  # MB, EB, PASSTHROUGH, …
    k: int
    n: int
    b_max_tokens: int
    b_cap_tokens: int
    version: int
    acked_version: int
    p0_per_token: float
    theta_star: float
    lhs_minus_rhs_s_per_token: float
    reason: str


@dataclass(frozen=True, slots=True)
class Status:
    """The fleet's totals: the lines above the table."""

    listening: str  # `listening_line`: where the controller listens and the ctl command that reaches it
    redis_url: str
    up_s: float
    num_connected: int
    num_engines: int
    num_batches_sent: int
    num_decisions_applied: int
    num_completed: int


def ctl_program(*, argv0: str, executable: str, cwd: Path, path: str | None) -> str:
    """How to run this installation's `controlplane` from `cwd`, for the demo's hint.

    `controlplane` when PATH (`path`) finds the very script that runs (`argv0`); else that script's path,
    relative to `cwd` when under it (`.venv/bin/controlplane` in a clone, as `make run` starts it); when
    started as `python -m controlplane`, the same interpreter (`executable`) with `-m controlplane`.
    """
    if Path(argv0).name == "__main__.py":
        return f"{_shown(Path(executable), cwd)} -m controlplane"
    script = Path(argv0)
    found = shutil.which("controlplane", path=path)
    if found is not None and script.exists() and os.path.samefile(found, script):
        return "controlplane"
    return _shown(script, cwd)


def _shown(path: Path, cwd: Path) -> str:
    absolute = path if path.is_absolute() else cwd / path
    try:
        return absolute.relative_to(cwd).as_posix()
    except ValueError:
        return absolute.as_posix()


def pool_labels(rows: Sequence[EngineRow]) -> dict[tuple[str, str], str]:
    """A short label per (model, accelerator): the accelerator when every pool serves one model, its
    vendor word dropped when every accelerator starts with the same one ("NVIDIA H200" → "H200"); else
    "model|accelerator"."""
    pools = sorted({(row.model, row.accelerator) for row in rows})
    if len({model for model, _ in pools}) != 1:
        return {pool: f"{pool[0]}|{pool[1]}" for pool in pools}
    labels = {pool: pool[1] for pool in pools}
    words = {label.split(" ", 1)[0] for label in labels.values()}
    if len(pools) > 1 and len(words) == 1 and all(" " in label for label in labels.values()):
        labels = {pool: label.split(" ", 1)[1] for pool, label in labels.items()}
    return labels


def _sequence(version: int) -> int:
    return split_version(version)[1] if version > 0 else 0


def _ack(row: EngineRow) -> str:
    """The ACKed version as the wide view shows it: ✓ when it is the version in force, else its sequence."""
    if row.acked_version == row.version:
        return "✓"
    if row.acked_version == 0:
        return "–"
    same_epoch = split_version(row.acked_version)[0] == split_version(row.version)[0]
    return str(_sequence(row.acked_version)) if same_epoch else "old"


def _table(rows: Sequence[EngineRow], *, wide: bool) -> Table:
    table = Table(box=None, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False, collapse_padding=True)
    table.add_column("engine", overflow="ellipsis", no_wrap=True, min_width=6)
    table.add_column("pool", overflow="ellipsis", no_wrap=True, min_width=4)
    table.add_column("mode", no_wrap=True)
    table.add_column("k", justify="right", no_wrap=True)
    table.add_column("N", justify="right", no_wrap=True)
    if wide:
        table.add_column("B_max", justify="right", no_wrap=True)
        table.add_column("B_cap", justify="right", no_wrap=True)
    table.add_column("ver", justify="right", no_wrap=True)
    if wide:
        table.add_column("ack", justify="right", no_wrap=True)
    table.add_column("p0", justify="right", no_wrap=True)
    table.add_column("θ*", justify="right", no_wrap=True)
    table.add_column("LHS−RHS", justify="right", no_wrap=True)
    table.add_column("reason", overflow="ellipsis", no_wrap=True, min_width=6)
    labels = pool_labels(rows)
    for row in sorted(rows, key=lambda r: (labels[(r.model, r.accelerator)], r.engine_id)):
        version = str(_sequence(row.version))
        cells = [row.engine_id, labels[(row.model, row.accelerator)], row.mode,
                 str(row.k) if row.mode == "EB" else "–", str(row.n)]
        if wide:
            cells += [str(row.b_max_tokens), str(row.b_cap_tokens), version, _ack(row)]
        else:
            cells.append(version if row.acked_version == row.version else version + "*")
        cells += [f"{row.p0_per_token:.5f}", f"{row.theta_star:.3f}", f"{row.lhs_minus_rhs_s_per_token:+.1e}",
                  row.reason]
        table.add_row(*cells)
    return table


def _console(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, legacy_windows=False,
                   soft_wrap=False, emoji=False, highlight=False)


def _fits(table: Table, width: int) -> bool:
    """Whether `table` laid out without a width limit is at most `width` columns wide."""
    console = _console(10_000)
    console.print(table)
    return max(len(line.rstrip()) for line in console.file.getvalue().splitlines()) <= width  # type: ignore[attr-defined]


def render_view(status: Status, rows: Sequence[EngineRow], *, width: int) -> str:
    """The view as plain text, no line wider than `width` columns."""
    console = _console(width)
    wide = _fits(_table(rows, wide=True), width)
    models = sorted({row.model for row in rows})
    accelerators = sorted({row.accelerator for row in rows})
    console.print(Text(status.listening))
    console.print(Text(f"up {status.up_s:.0f} s · engines {status.num_connected}/{status.num_engines} · "
                       f"batches {status.num_batches_sent:,} · decisions applied {status.num_decisions_applied:,} "
                       f"· completed {status.num_completed:,}"))
    console.print(Text(f"redis {status.redis_url}"))
    if len(models) == 1:
        console.print(Text(f"pools: {models[0]} on {', '.join(accelerators)}"))
    console.print(_table(rows, wide=wide))
    console.print(Text(LEGEND))
    console.print(Text("k: EB only · ver: decision sequence (ctl list VERSION mod 10^9)"
                       + ("" if wide else " · *: not ACKed")))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join(line.rstrip() for line in text.splitlines())
