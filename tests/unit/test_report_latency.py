"""`cli.report_latency` on plain data: which engine's view a pool's sample is read from, one sample drawn as
levels over the window it covers, the axis' round maximum and unit, the bounds of --latency-every-s, and the
controller's recorded samples with how often they found the objective met."""

from __future__ import annotations

import argparse
import asyncio
import re

import grpc
import pytest

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.report_latency import (
    LEFT_PX,
    OWN_STATISTICS_FLAG,
    RIGHT_PX,
    WIDTH_PX,
    attainment,
    latency_section,
    latency_svg,
    pool_samples,
    recorded_latencies,
    recorded_samples,
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


def _recorded(at_s: float, state: int) -> operator_pb2.LatencySample:
    outcomes = operator_pb2.PoolOutcomes(
        window_s=60.0, ttft=operator_pb2.LatencyQuantiles(num_requests=300, p50_s=0.2, p90_s=0.5, p99_s=0.9,
                                                          mean_s=0.25), objective_state=state)
    if state:
        outcomes.objective.CopyFrom(operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=1.0))
    return operator_pb2.LatencySample(at_s=at_s, outcomes=outcomes)


def test_recorded_samples_are_drawn_as_samples_and_the_objectives_attainment_is_counted() -> None:
    states = [operator_pb2.OBJECTIVE_STATE_MEETING] * 6 + [operator_pb2.OBJECTIVE_STATE_ADJUSTING] * 3 + [
        operator_pb2.OBJECTIVE_STATE_INFEASIBLE, operator_pb2.OBJECTIVE_STATE_NO_LATENCY_DATA,
        operator_pb2.OBJECTIVE_STATE_UNSPECIFIED]
    samples = recorded_samples(POOL, [_recorded(1_000.0 + 10 * i, state) for i, state in enumerate(states)])
    assert [s["source"] for s in samples] == ["recorded"] * 12 and samples[0]["engine_id"] == ""
    assert samples[0]["ttft"]["p99_s"] == 0.9 and samples[0]["tpot"] is None
    assert samples[0]["objective"]["state"] == "meeting" and samples[-1]["objective"] is None
    # Judged: the samples under an objective with latency data (not "no latency data", not without one).
    assert attainment(samples) == {"meeting": 6, "adjusting": 3, "infeasible": 1, "judged": 10,
                                   "from_s": 1_000.0, "to_s": 1_090.0}
    assert attainment(samples[-2:]) is None
    section = latency_section("m|a", samples, start_s=1_000.0, end_s=1_120.0)
    assert ('class="attainment muted" data-meeting="6" data-adjusting="3" data-infeasible="1" data-judged="10"'
            in section) and "objective met in 6 of 10 samples (60%)" in section
    assert section.count('data-source="recorded"') == 12  # a TTFT marker per sample; no TPOT was recorded
    assert "as the controller recorded it" in section


def _refusing(code: grpc.StatusCode):
    async def read(request: operator_pb2.ListLatencyHistoryRequest) -> operator_pb2.ListLatencyHistoryResponse:
        assert request.pool.model == "m" and request.limit == 10_000 and request.since_s == 100.0
        raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="no\x1b[2J\npe")
    return read


def test_a_controller_without_a_latency_record_leaves_the_report_to_what_it_reads(capsys) -> None:
    pool = common_pb2.Pool(model="m", accelerator="a")
    for code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE):  # an older controller; a store outage
        assert asyncio.run(recorded_latencies(_refusing(code), [pool, pool], since_s=100.0)) == []
        # the server's words on one line, without control characters (a terminal escape is not passed on)
        assert f"no recorded latencies for 1 pool(s) ({code.name}: no[2J pe)" in capsys.readouterr().err
    with pytest.raises(grpc.aio.AioRpcError):  # anything else is the caller's error to report
        asyncio.run(recorded_latencies(_refusing(grpc.StatusCode.PERMISSION_DENIED), [pool], since_s=100.0))


def test_the_pools_read_before_a_refusal_keep_their_recorded_samples(capsys) -> None:
    first, second = common_pb2.Pool(model="m", accelerator="a"), common_pb2.Pool(model="m", accelerator="b")

    async def read(request: operator_pb2.ListLatencyHistoryRequest) -> operator_pb2.ListLatencyHistoryResponse:
        if request.pool == second:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="store down")
        return operator_pb2.ListLatencyHistoryResponse(samples=[_recorded(500.0, 0)])

    found = asyncio.run(recorded_latencies(read, [second, first], since_s=0.0))  # read in a fixed order: a, then b
    assert [(s["pool"]["accelerator"], s["at_s"]) for s in found] == [("a", 500.0)]
    assert "no recorded latencies for 1 pool(s) (UNAVAILABLE: store down)" in capsys.readouterr().err
