"""`ctl report`'s arguments (the command itself: `cli.ctl.Ctl.report`; the page: `cli.report`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from controlplane.cli.args import bounded_int, nonnegative_float
from controlplane.cli.report_latency import sample_interval_s

DEFAULT_LATENCY_HISTORY_S = 3600.0


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, metavar="FILE.html", help="where to write the page")
    parser.add_argument("--history-limit", type=bounded_int(low=1, high=10_000), default=2_000,
                        help="newest decisions of the history stream to draw (default 2000, at most 10000)")
    parser.add_argument("--latency-history-s", type=nonnegative_float, default=DEFAULT_LATENCY_HISTORY_S,
                        metavar="SECONDS",
                        help="draw each pool's TTFT/TPOT quantiles as the controller recorded them over this many "
                             "seconds before now (default 3600; 0: none)")
    parser.add_argument("--latency-samples", type=bounded_int(low=1, high=10_000), default=1,
                        help="read each pool's TTFT/TPOT quantiles (over the last minute) this many times, the last "
                             "when the page is written, and draw them as timelines (default 1: the quantiles now)")
    parser.add_argument("--latency-every-s", type=sample_interval_s, default=10.0,
                        help="seconds between latency samples (default 10, at most 3600)")
