"""The rows of `benchmarks/twin_vs_papers.py`: each compared figure (`Row`, collected by `add` in `ROWS`), the
notes under a section (`footnote`), a section's table (`print_rows`) and the closing count (`summary`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

TOLERANCE_POINTS = 5.0


@dataclass
class Row:
    """One compared figure. kind: 'pct' (a change in %, diff in points), 'abs' (a value, diff = relative %),
    'sign' (only a direction is published: paper is ±1), 'min' (the paper gives a lower bound: ok at or above),
    'range' (a change in %, the paper gives only the range [paper, paper_high] over several models: diff is the
    distance in points to its nearest end, 0 inside)."""

    section: str
    label: str
    paper: float | None
    twin: float
    kind: str = "pct"
    unit: str = ""
    note: str = ""
    sign_matters: bool = False
    paper_high: float | None = None

    @property
    def diff(self) -> float | None:
        if self.paper is None or not math.isfinite(self.twin):
            return None
        if self.kind == "range":
            high = self.paper if self.paper_high is None else self.paper_high
            return min(0.0, self.twin - self.paper) + max(0.0, self.twin - high)
        if self.kind == "abs":
            return (self.twin / self.paper - 1.0) * 100.0
        if self.kind == "sign":
            return None
        return self.twin - self.paper

    @property
    def sign_ok(self) -> bool:
        if self.paper is None or not (self.sign_matters or self.kind == "sign"):
            return True
        return math.copysign(1.0, self.twin) == math.copysign(1.0, self.paper)

    @property
    def ok(self) -> bool | None:
        if self.paper is None:
            return None
        if self.kind == "sign":
            return self.sign_ok
        if self.kind == "min":
            return self.twin >= self.paper
        return self.diff is not None and abs(self.diff) <= TOLERANCE_POINTS and self.sign_ok


ROWS: list[Row] = []
FOOTNOTES: dict[str, list[str]] = {}


def footnote(section: str, text: str) -> None:
    FOOTNOTES.setdefault(section, []).append(text)


def add(section: str, label: str, paper: float | None, twin: float, *, kind: str = "pct", unit: str = "",
        note: str = "", sign_matters: bool = False, paper_high: float | None = None) -> Row:
    row = Row(section, label, paper, twin, kind, unit, note, sign_matters, paper_high)
    ROWS.append(row)
    return row


def fmt(value: float | None, kind: str, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    if kind in ("pct", "sign", "range"):
        return f"{value:+.1f}%"
    if kind == "min":
        return f"{value:.2f}"
    if unit == "s" and abs(value) < 1:
        return f"{value:.3f} s"
    return f"{value:.4g} {unit}".strip()


def print_rows(section: str) -> None:
    rows = [r for r in ROWS if r.section == section]
    print(f"   {'row':<58} {'paper':>12} {'twin':>12} {'diff':>7}  {'':3} note")
    for r in rows:
        diff = r.diff
        mark = {True: "ok", False: "OFF", None: ""}[r.ok]
        diff_text = r.kind if r.kind in ("sign", "min") else (f"{diff:+.1f}" if diff is not None else "—")
        paper = fmt(r.paper, r.kind, r.unit)
        if r.kind == "range" and r.paper_high is not None:
            paper = f"{r.paper:+.1f}…{r.paper_high:+.1f}%"
        print(f"   {r.label:<58} {paper:>12} {fmt(r.twin, r.kind, r.unit):>12} "
              f"{diff_text:>7}  {mark:3} {r.note}")
    for text in FOOTNOTES.get(section, []):
        print(f"   note: {text}")


def summary() -> None:
    compared = [r for r in ROWS if r.ok is not None]
    off = [r for r in compared if not r.ok]
    print(f"\nsummary: {len(compared)} rows compared, {len(compared) - len(off)} within ±{TOLERANCE_POINTS:g} "
          f"(sign right where it matters), {len(off)} off")
    by_section: dict[str, list[Row]] = {}
    for r in off:
        by_section.setdefault(r.section, []).append(r)
    silent = [r.label for r in off if not r.note]
    print(f"   off rows without a measured note: {len(silent)}" + (" — " + "; ".join(silent) if silent else ""))
    for section, rows in by_section.items():
        more = " …" if len(rows) > 6 else ""
        print(f"   {section}: {len(rows)} off — " + "; ".join(r.label for r in rows[:6]) + more)
