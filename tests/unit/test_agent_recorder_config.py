"""The agent's telemetry buffers and its environment configuration."""

from __future__ import annotations

import dataclasses
import math
import os
import socket
import threading
from pathlib import Path

import pytest

import agents.config
from agents.config import (
    AGENT_SETTINGS,
    AgentConfig,
    AgentConfigError,
    describe_agent_settings,
    engine_data_parallel_rank,
    engine_id_default,
    load_agent_config,
    pool_model_default,
)
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
    assert all(math.isnan(a) for a in snapshot.admitted_time_s) and len(snapshot.admitted_time_s) == 3
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
    recorder.set_running_lengths([4, 9], [1, 5], [1e9 + 2.0, 1e9])  # a newer one replaces one not drained yet
    recorder.record_completion(10, 20, 1e9 + 3.0, False, 1e9 + 1.0)
    snapshot = recorder.drain()
    assert (snapshot.running_output_tokens, snapshot.running_num_requests) == ([4, 9], [1, 5])
    assert snapshot.running_admitted_time_s == [1e9 + 2.0, 1e9] and snapshot.admitted_time_s == [1e9 + 1.0]
    assert recorder.drain().running_output_tokens == []


# ------------------------------------------------------------------------------ engine id, pool, settings


def test_engine_id_defaults_to_the_pod_name_not_the_process() -> None:
    """A restarted engine process in the same pod keeps its id: POD_NAME, else HOSTNAME, without the pid."""
    base = {"CP_CONTROLLER_ADDRESS": "h:1"}

    def engine_id(env: dict[str, str], **kwargs: int | None) -> str:
        config = load_agent_config({**base, **env}, default_model="m", default_accelerator="cpu", **kwargs)
        assert config is not None
        return config.engine_id

    assert engine_id({"POD_NAME": "qwen-7f9c-x2x9q", "HOSTNAME": "other"}) == "qwen-7f9c-x2x9q"
    assert engine_id({"HOSTNAME": "qwen-7f9c-x2x9q"}) == "qwen-7f9c-x2x9q"
    assert engine_id({"HOSTNAME": "qwen-7f9c-x2x9q", "CP_ENGINE_ID": "explicit"}) == "explicit"
    assert engine_id({}) == f"{socket.gethostname()}-{os.getpid()}"  # a bare host: several engines may share it
    # Each data-parallel rank is its own scheduler: its rank is appended, to an explicit id too.
    assert engine_id({"POD_NAME": "qwen-7f9c-x2x9q"}, data_parallel_rank=3) == "qwen-7f9c-x2x9q-dp3"
    assert engine_id({"CP_ENGINE_ID": "explicit"}, data_parallel_rank=0) == "explicit-dp0"
    assert engine_id_default({"POD_NAME": "p"}) == ("p", "default from POD_NAME")
    with pytest.raises(AgentConfigError, match=r"CP_ENGINE_ID='bad host!' \(default from HOSTNAME\): must match"):
        load_agent_config({**base, "HOSTNAME": "bad host!"}, default_model="m", default_accelerator="cpu")


@pytest.mark.parametrize(("size", "index", "master_port", "rank"), [
    (1, 0, 0, None), (4, 0, 0, 0), (4, 2, 0, 2), (1, 3, 0, 3), (1, 0, 47323, 0), (1, 1, 47323, 1)])
def test_data_parallel_rank_is_appended_when_vllm_marks_one(size: int, index: int, master_port: int,
                                                            rank: int | None) -> None:
    """A dense model's DP rank runs with data_parallel_size reset to 1 and its rank in the index; its rank 0
    is told from a plain engine by the deployment's master port, which vLLM leaves set (the values are those a
    2-rank CPU engine's schedulers saw: tests/e2e/test_data_parallel.py); a MoE model keeps the group size."""
    assert engine_data_parallel_rank(size=size, index=index, master_port=master_port) == rank


@pytest.mark.parametrize(("served", "model"), [(None, "/models/qwen3-8b"), ("", "/models/qwen3-8b"),
                                              ("Qwen/Qwen3-8B", "/models/qwen3-8b"),
                                              (["qwen3", "qwen3-alias"], "/models/qwen3-8b"), ([], "/m")])
def test_pool_model_is_the_served_model_name_as_vllm_names_it(served: object, model: str) -> None:
    from vllm.config.model import get_served_model_name

    assert pool_model_default(served, model) == get_served_model_name(model, served)


def test_every_config_field_is_one_documented_setting() -> None:
    assert sorted(s.field for s in AGENT_SETTINGS) == sorted(f.name for f in dataclasses.fields(AgentConfig))
    assert len({s.env for s in AGENT_SETTINGS}) == len(AGENT_SETTINGS)
    for setting in AGENT_SETTINGS:
        assert setting.env.startswith("CP_") and setting.env in (agents.config.__doc__ or "")
        assert setting.rule and setting.doc and setting.default


def test_described_settings_name_their_source_and_hide_the_token(tmp_path: Path) -> None:
    env = {"CP_CONTROLLER_ADDRESS": "cp:50151", "CP_AGENT_TOKEN": "s3cr3t-token-value", "HOSTNAME": "engine-0",
           "CP_BATCH_INTERVAL_S": "0.5"}
    rows = {row.setting.env: row for row in describe_agent_settings(env, default_accelerator="NVIDIA H200")}
    assert (rows["CP_AGENT_TOKEN"].shown, rows["CP_AGENT_TOKEN"].source) == ("<redacted>", "env")
    assert (rows["CP_ENGINE_ID"].shown, rows["CP_ENGINE_ID"].source) == ("engine-0", "default from HOSTNAME")
    assert (rows["CP_BATCH_INTERVAL_S"].shown, rows["CP_BATCH_INTERVAL_S"].source) == ("0.5", "env")
    assert (rows["CP_POOL_MODEL"].shown, rows["CP_POOL_MODEL"].source) == (
        "<served model name>", "default (served model name)")
    assert rows["CP_POOL_ACCELERATOR"].shown == "NVIDIA H200"
    assert (rows["CP_BUFFER_EVENTS"].shown, rows["CP_BUFFER_EVENTS"].source) == ("65536", "default")
