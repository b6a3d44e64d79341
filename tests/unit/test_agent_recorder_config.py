"""The agent's telemetry buffers and its environment configuration."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from agents.config import AgentConfigError, load_agent_config
from agents.recorder import TelemetryRecorder


def test_recorder_drains_in_order_and_empties() -> None:
    recorder = TelemetryRecorder(capacity=8)
    for i in range(3):
        recorder.record_step(100 * i, i, i, 0.01 * (i + 1))
        recorder.record_completion(10 + i, 20 + i, 1000.0 + i, i == 2)
    recorder.set_gauges(500, 1000, 1, 2, 3, 40)
    recorder.add_preemptions(2)
    snapshot = recorder.drain()
    assert snapshot.prefill_tokens == [0, 100, 200] and snapshot.duration_s == [0.01, 0.02, 0.03]
    assert snapshot.prompt_tokens == [10, 11, 12] and snapshot.aborted == [False, False, True]
    assert (snapshot.kv_used_tokens, snapshot.kv_total_tokens, snapshot.num_waiting) == (500, 1000, 3)
    assert snapshot.num_preemptions == 2 and snapshot.num_events_dropped == 0
    empty = recorder.drain()
    assert empty.prefill_tokens == [] and empty.prompt_tokens == []


def test_recorder_drops_oldest_when_full_and_counts() -> None:
    recorder = TelemetryRecorder(capacity=4)
    for i in range(10):
        recorder.record_step(i, 0, 0, 0.001)
    snapshot = recorder.drain()
    assert snapshot.prefill_tokens == [6, 7, 8, 9]
    assert snapshot.num_events_dropped == 6
    recorder.record_step(42, 0, 0, 0.001)
    assert recorder.drain().prefill_tokens == [42]


def test_recorder_loses_nothing_under_a_concurrent_drainer() -> None:
    recorder = TelemetryRecorder(capacity=1 << 16)
    seen: list[int] = []
    done = threading.Event()

    def drainer() -> None:
        while not done.is_set():
            seen.extend(recorder.drain().prefill_tokens)
        seen.extend(recorder.drain().prefill_tokens)

    thread = threading.Thread(target=drainer)
    thread.start()
    for i in range(20_000):
        recorder.record_step(i, 0, 0, 0.001)
    done.set()
    thread.join()
    assert seen == list(range(20_000))


def test_config_off_without_address_and_validated_with_one(tmp_path: Path) -> None:
    assert load_agent_config({}) is None
    config = load_agent_config({"CP_CONTROLLER_ADDRESS": "ctl.example:50151", "CP_AGENT_TOKEN": "t"},
                               default_model="m", default_accelerator="cpu")
    assert config is not None and config.controller_address == "ctl.example:50151" and config.pool_model == "m"
    bad = [
        ({"CP_CONTROLLER_ADDRESS": "no-port"}, "CP_CONTROLLER_ADDRESS"),
        ({"CP_CONTROLLER_ADDRESS": "h:99999"}, "CP_CONTROLLER_ADDRESS"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_ENGINE_ID": "has space"}, "CP_ENGINE_ID"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_BATCH_INTERVAL_S": "fast"}, "CP_BATCH_INTERVAL_S"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_DECISION_TTL_S": "-1"}, "CP_DECISION_TTL_S"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_TLS_CA": str(tmp_path / "missing.pem")}, "CP_TLS_CA"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_POOL_MODEL": "a|b"}, "CP_POOL_MODEL"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_BUFFER_EVENTS": "3"}, "CP_BUFFER_EVENTS"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_AGENT_REPORT_INTERVAL_S": "0"}, "CP_AGENT_REPORT_INTERVAL_S"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_AGENT_REPORT_INTERVAL_S": "often"}, "CP_AGENT_REPORT_INTERVAL_S"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_AGENT_REPORT": str(tmp_path / "no" / "r.json")}, "CP_AGENT_REPORT"),
        ({"CP_CONTROLLER_ADDRESS": "h:1", "CP_STEP_TRACE": "yes please"}, "CP_STEP_TRACE"),
    ]
    for env, name in bad:
        with pytest.raises(AgentConfigError, match=name):
            load_agent_config(env, default_model="m", default_accelerator="cpu")


def test_report_settings(tmp_path: Path) -> None:
    base = {"CP_CONTROLLER_ADDRESS": "h:1"}
    config = load_agent_config(base, default_model="m", default_accelerator="cpu")
    assert config is not None and config.report_path is None and config.report_interval_s == 5.0
    assert not config.step_trace
    report = tmp_path / "r.json"
    config = load_agent_config({**base, "CP_AGENT_REPORT": str(report), "CP_AGENT_REPORT_INTERVAL_S": "0.5",
                                "CP_STEP_TRACE": "1"}, default_model="m", default_accelerator="cpu")
    assert config is not None and (config.report_path, config.report_interval_s, config.step_trace) == (
        report, 0.5, True)
    # The step trace lives in the report: without a report path there is none.
    config = load_agent_config({**base, "CP_STEP_TRACE": "1"}, default_model="m", default_accelerator="cpu")
    assert config is not None and not config.step_trace


def test_recorder_hands_the_running_lengths_over_once() -> None:
    recorder = TelemetryRecorder(capacity=8)
    assert recorder.drain().running_output_tokens == []
    recorder.set_running_lengths([1, 9], [2, 3])
    recorder.set_running_lengths([4, 9], [1, 5])  # a newer one replaces one not drained yet
    snapshot = recorder.drain()
    assert (snapshot.running_output_tokens, snapshot.running_num_requests) == ([4, 9], [1, 5])
    assert recorder.drain().running_output_tokens == []
