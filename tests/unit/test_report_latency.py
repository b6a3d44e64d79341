"""`cli.report_latency` on plain data: which engine's view a pool's sample is read from, one sample drawn as
levels over the window it covers, the axis' round maximum and unit, and the bounds of --latency-every-s."""

from __future__ import annotations

import argparse
import re

import pytest

from controlplane.cli.report_latency import (
    LEFT_PX,
    OWN_STATISTICS_FLAG,
    RIGHT_PX,
    WIDTH_PX,
    latency_svg,
    pool_samples,
    sample_interval_s,
)

POOL = {"model": "m", "accelerator": "a"}


def _quantiles(p50_s: float, p99_s: float, num_requests: int = 500) -> dict:
    return {"num_requests": num_requests, "p50_s": p50_s, "p90_s": (p50_s + p99_s) / 2, "p99_s": p99_s,
            "mean_s": p50_s * 1.1}


def _explain(engine_id: str, ttft_p99_s: float, *, flags: tuple[str, ...] = ()) -> dict:
    return {"engine_id": engine_id, "pool": POOL, "flags": list(flags),
            "outcomes": {"window_s": 60.0, "ttft": _quantiles(0.2, ttft_p99_s), "tpot": _quantiles(0.02, 0.04),
                         "queue": None, "objective": None}}


def test_a_pools_sample_is_read_from_an_engine_decided_from_the_pools_statistics() -> None:
    explains = [_explain("a-own", 9.0, flags=(OWN_STATISTICS_FLAG,)), _explain("c", 1.0), _explain("b", 1.0)]
    (sample,) = pool_samples(explains, at_s=100.0)
    assert (sample["pool"], sample["engine_id"], sample["at_s"]) == (POOL, "b", 100.0)
    assert sample["ttft"]["p99_s"] == 1.0 and sample["queue"] is None
    (alone,) = pool_samples(explains[:1], at_s=100.0)  # only engines on their own statistics: the first of them
    assert alone["engine_id"] == "a-own"


def test_one_sample_is_drawn_as_levels_over_its_window_on_a_round_axis() -> None:
    (sample,) = pool_samples([_explain("e", 0.37)], at_s=1_000.0)
    svg = latency_svg("m|a", "ttft", [sample], start_s=900.0, end_s=1_000.0)
    assert 'data-unit="ms"' in svg and "TTFT (ms)" in svg
    assert re.search(r'data-max-s="([^"]+)"', svg).group(1) == "0.5"  # the round value above p99 0.37 s
    right = WIDTH_PX - RIGHT_PX
    window_x = LEFT_PX + (940.0 - 900.0) / 100.0 * (right - LEFT_PX)
    p99 = re.search(r'class="p99-line" points="([^"]+)"', svg).group(1).split()
    assert [tuple(map(float, p.split(","))) for p in p99] == [
        pytest.approx((window_x, 14 + 90 - 0.37 / 0.5 * 90), abs=0.01),
        pytest.approx((right, 14 + 90 - 0.37 / 0.5 * 90), abs=0.01)]
    assert f'data-from-s="940.0" data-to-s="1000.0" x="{window_x:.2f}"' in svg
    slow = latency_svg("m|a", "ttft", pool_samples([_explain("e", 3.2)], at_s=1_000.0), start_s=900.0, end_s=1_000.0)
    assert 'data-unit="s"' in slow and 'data-max-s="5.0"' in slow


@pytest.mark.parametrize("text", ["0", "-1", "nan", "3601"])
def test_the_sample_interval_is_refused_outside_its_bounds(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        sample_interval_s(text)
    assert sample_interval_s("0.5") == 0.5 and sample_interval_s("3600") == 3600.0
