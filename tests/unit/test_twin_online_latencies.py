"""The twin's one-engine online control (`sim.control.OnlineControl`) sends the latency stamps an agent sends:
its pool's outcome window holds the twin's own requests' TTFT and TPOT (within the sketch's error), and an
objective set on it has latency data to work on."""

from __future__ import annotations

import numpy as np

from controlplane.api.v1 import operator_pb2
from controlplane.loop.objective import ObjectiveState
from controlplane.sim.control import OnlineControl, OnlineSettings
from controlplane.sim.engine import SimEngine
from controlplane.sim.profiles import get_profile
from controlplane.sim.schedulers import parse_scheduler


def test_the_twins_online_control_reports_its_requests_latencies() -> None:
    profile = get_profile("h200-qwen3-8b")
    shape = parse_scheduler("eb+").shape_for(profile)
    engine = SimEngine(profile, shape=shape, record_steps=False)
    control = OnlineControl(profile.costs, OnlineSettings())
    control.start(engine)
    fleet = control._machine()
    fleet.set_overrides([operator_pb2.OverrideRecord(
        kind=operator_pb2.OVERRIDE_KIND_OBJECTIVE, scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET),
        objective=operator_pb2.LatencyObjective(ttft_quantile=0.99, ttft_target_s=5.0))], engine.now_s)
    rng = np.random.default_rng(0)
    num = 1500
    arrival_s = np.sort(rng.uniform(0.0, 20.0, num))
    prompts, outputs = rng.integers(100, 1000, num), rng.integers(2, 200, num)
    issued = 0
    while engine.now_s < 40.0:
        upto = int(np.searchsorted(arrival_s, engine.now_s, side="right"))
        if upto > issued:
            engine.add_requests(prompts[issued:upto], outputs[issued:upto], arrival_s[issued:upto])
            issued = upto
        step = engine.step()
        if step is None:
            engine.now_s = arrival_s[issued] if issued < num else engine.now_s + 0.5
            continue
        control.after_step(engine, step)
    requests = engine.request_arrays()
    finish_s = requests["finish_s"]
    # The window holds the buckets closed so far: the requests finished up to a second or two before the last
    # batch the twin sent (its engine goes idle after the last completions, and an idle twin sends nothing).
    sent_s = control._next_telemetry_s - OnlineSettings().telemetry_interval_s
    summary = fleet.outcomes_of("twin")
    assert summary is not None
    assert np.count_nonzero(finish_s <= sent_s - 2.0) <= summary.ttft.num_requests <= np.count_nonzero(
        finish_s <= sent_s)
    counted = finish_s <= np.sort(finish_s)[summary.ttft.num_requests - 1]
    ttft = (requests["first_token_s"] - requests["arrival_s"])[counted]
    tpot = ((finish_s - requests["first_token_s"]) / (requests["output_tokens"] - 1))[counted]
    assert abs(summary.ttft.p50_s / np.median(ttft) - 1.0) < 0.02
    assert abs(summary.tpot.p50_s / np.median(tpot) - 1.0) < 0.02
    assert fleet.objective_for_engine("twin").state != ObjectiveState.NO_LATENCY_DATA
