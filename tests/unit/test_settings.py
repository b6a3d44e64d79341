"""The controller's settings model: sources and precedence, validation together with the source named,
redaction, the frozen dataclasses it builds, the flags it keeps, and `controlplane config`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from controlplane.cli.args import ArgumentParser
from controlplane.cli.config import reference_markdown
from controlplane.cli.main import main
from controlplane.cli.serve import add_server_arguments, config_from_args
from controlplane.cli.settings import (
    FIELDS,
    LOOP_FIELDS,
    POLICY_FIELDS,
    SECTIONS,
    SERVER_FIELDS,
    ControllerSettings,
    SettingsError,
    default_data_dir,
    env_of,
    flag_of,
    redact_url,
    resolve_controller_settings,
    section_of,
)
from controlplane.cli.settings_flags import flags_from_args
from controlplane.core.types import PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.service.config import ControllerConfig

REPO = Path(__file__).resolve().parents[2]
TOKEN_A = "agents:" + "a" * 24
TOKEN_O = "operator:" + "o" * 24
# Every flag `controlplane serve` had before the settings model; deploy/ and scripts use them.
LEGACY_FLAGS = ("--host", "--port", "--data-dir", "--redis-url", "--controller-id", "--metrics-port", "--metrics-host",
                "--tls-cert", "--tls-key", "--tls-client-ca", "--insecure", "--decision-interval-s",
                "--recompute-completions", "--ttl-s", "--min-samples", "--cooldown-s", "--max-connection-age-s",
                "--engine-ttl-s", "--bucket-s", "--output-window", "--prompt-window", "--step-window",
                "--oom-tolerance", "--theta-min", "--theta-max", "--hysteresis-rel", "--no-memory-guard",
                "--readiness-grace-s", "--log-level")


def parse(*argv: str) -> argparse.Namespace:
    parser = ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(list(argv))


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- sources


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path, suffix: str) -> None:
    text = ("server:\n  port: 6001\n  metrics_port: 9001\npolicy:\n  theta_max: 0.7\n  oom_tolerance: 1e-3\n"
            if suffix == ".yaml" else
            "[server]\nport = 6001\nmetrics_port = 9001\n[policy]\ntheta_max = 0.7\noom_tolerance = 1e-3\n")
    file = write(tmp_path / f"cp{suffix}", text)
    env = {"CP_PORT": "6002", "CP_THETA_MAX": "0.6", "CP_DATA_DIR": str(tmp_path)}
    resolved = resolve_controller_settings(env=env, flags={"port": 6003}, config_file=file)
    settings = resolved.settings
    assert (settings.port, settings.metrics_port, settings.theta_max, settings.oom_tolerance, settings.theta_min) == (
        6003, 9001, 0.6, 1e-3, PolicyConfig().theta_min)
    assert resolved.source("port") == "flag --port"
    assert resolved.source("theta_max") == "env CP_THETA_MAX"
    assert resolved.source("metrics_port") == f"file {file} (server.metrics_port)"
    assert resolved.source("oom_tolerance") == f"file {file} (policy.oom_tolerance)"
    assert resolved.source("theta_min") == "default"
    config = resolved.controller_config()
    assert (config.port, config.metrics_port, config.policy.theta_max, config.policy.oom_tolerance) == (
        6003, 9001, 0.6, 1e-3)
    assert config.data_dir == tmp_path and resolved.source("data_dir") == "env CP_DATA_DIR"


def test_config_file_from_the_flag_or_cp_config(tmp_path: Path) -> None:
    flagged = write(tmp_path / "a.yaml", "loop: {ttl_s: 90}\n")
    env_file = write(tmp_path / "b.yaml", "loop: {ttl_s: 120}\n")
    env = {"CP_CONFIG": str(env_file), "XDG_DATA_HOME": str(tmp_path)}
    assert resolve_controller_settings(env=env).settings.ttl_s == 120.0
    args = parse("--config", str(flagged))
    assert config_from_args(args, env).loop.ttl_s == 90.0


def test_defaults_are_the_dataclasses_defaults(tmp_path: Path) -> None:
    resolved = resolve_controller_settings(env={"XDG_DATA_HOME": str(tmp_path)})
    config = resolved.controller_config()
    assert config == ControllerConfig(controller_id=config.controller_id, data_dir=tmp_path / "vllm-controlplane")
    assert config.data_dir == default_data_dir({"XDG_DATA_HOME": str(tmp_path)})
    assert config.controller_id.startswith("controller-")
    assert {name for name, source in resolved.sources.items() if not source.startswith("default")} == set()


def test_every_dataclass_field_has_a_setting() -> None:
    """A knob added to the loop, the policy or the controller config needs a setting (flag, env, file)."""
    assert set(LOOP_FIELDS) == {f.name for f in dataclasses.fields(DecisionLoopConfig)}
    assert set(POLICY_FIELDS) == {f.name for f in dataclasses.fields(PolicyConfig)}
    nested = {"loop", "policy", "security", "data_dir"}
    assert set(SERVER_FIELDS) == {f.name for f in dataclasses.fields(ControllerConfig)} - nested
    assert set(LOOP_FIELDS.values()) | set(POLICY_FIELDS) | set(SERVER_FIELDS) <= set(FIELDS)
    assert {section_of(name) for name in FIELDS} == set(SECTIONS)


def test_every_legacy_flag_still_parses_into_the_config(tmp_path: Path) -> None:
    cert, key = write(tmp_path / "c.pem", "x"), write(tmp_path / "k.pem", "x")
    argv = ["--host", "0.0.0.0", "--port", "7000", "--data-dir", str(tmp_path), "--controller-id", "c-1",
            "--metrics-port", "9464", "--metrics-host", "0.0.0.0", "--tls-cert", str(cert), "--tls-key", str(key),
            "--tls-client-ca", str(cert), "--insecure", "--decision-interval-s", "2.5", "--recompute-completions",
            "64", "--ttl-s", "45", "--min-samples", "100", "--cooldown-s", "5", "--max-connection-age-s", "600",
            "--engine-ttl-s", "120", "--bucket-s", "0.5", "--output-window", "512", "--prompt-window", "256",
            "--step-window", "128", "--oom-tolerance", "0.02", "--theta-min", "0.05", "--theta-max", "0.5",
            "--hysteresis-rel", "0.1", "--no-memory-guard", "--readiness-grace-s", "3", "--log-level", "debug"]
    assert {a for a in argv if a.startswith("--")} | {"--redis-url"} == set(LEGACY_FLAGS)
    resolved = resolve_controller_settings(env={}, flags=flags_from_args(parse(*argv)))
    config = resolved.controller_config()
    assert (config.host, config.port, config.data_dir, config.controller_id, config.metrics_port,
            config.metrics_host, config.max_connection_age_s, config.readiness_grace_s) == (
        "0.0.0.0", 7000, tmp_path, "c-1", 9464, "0.0.0.0", 600.0, 3.0)
    assert (config.security.tls_cert, config.security.tls_key, config.security.tls_client_ca,
            config.security.insecure) == (cert, key, cert, True)
    assert config.loop == DecisionLoopConfig(recompute_completions=64, interval_s=2.5, ttl_s=45.0, engine_ttl_s=120.0,
                                             bucket_s=0.5, output_window=512, prompt_window=256, step_window=128)
    assert config.policy == PolicyConfig(min_samples=100, cooldown_s=5.0, oom_tolerance=0.02, theta_min=0.05,
                                         theta_max=0.5, hysteresis_rel=0.1, memory_guard=False)
    assert resolved.settings.log_level == "DEBUG"
    assert config_from_args(parse(*argv, "--redis-url", "redis://h:6379/1"), {}).redis_url == "redis://h:6379/1"


def test_every_setting_but_the_secrets_has_a_flag_and_a_variable() -> None:
    parser = ArgumentParser()
    add_server_arguments(parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    for name in FIELDS:
        assert env_of(name).startswith("CP_")
        if name in ("agent_tokens", "operator_tokens"):
            assert flag_of(name) == ""
        else:
            assert flag_of(name) in flags
    # The server's TLS files have their own variables: CP_TLS_* are `controlplane ctl`'s client credentials.
    assert env_of("tls_cert") == "CP_SERVER_TLS_CERT" and env_of("port") == "CP_PORT"


def test_ctl_client_credentials_are_not_the_servers(tmp_path: Path) -> None:
    env = {"CP_TLS_CERT": str(tmp_path / "client.pem"), "CP_TLS_KEY": str(tmp_path / "client.key"),
           "CP_DATA_DIR": str(tmp_path)}
    assert resolve_controller_settings(env=env).controller_config().security.tls_cert is None


def test_a_commands_own_defaults_win_over_environment_and_show_in_help() -> None:
    parser = ArgumentParser()
    add_server_arguments(parser)
    parser.set_defaults(cooldown_s=10.0)
    args = parser.parse_args([])
    resolved = resolve_controller_settings(env={"CP_COOLDOWN_S": "20", "CP_DATA_DIR": "/tmp"},
                                           flags=flags_from_args(args))
    assert resolved.settings.cooldown_s == 10.0
    assert "switches, s (default 10.0); env CP_COOLDOWN_S" in " ".join(parser.format_help().split())
    assert "recompute period, s (default 5.0); env CP_DECISION_INTERVAL_S" in " ".join(parser.format_help().split())


# ------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("env", "flags", "expected"),
    [
        ({"CP_THETA_MIN": "0.9"}, {"theta_max": 0.5},
         "theta_min (0.9) must be ≤ theta_max (0.5) (theta_min from env CP_THETA_MIN, theta_max from flag "
         "--theta-max)"),
        ({"CP_MIN_SAMPLES": "5000"}, {},
         "output_window (4096 completions) must hold at least min_samples (5000), or no decision ever leaves cold "
         "start (output_window from default, min_samples from env CP_MIN_SAMPLES)"),
        ({"CP_OOM_TOLERANCE": "1.5"}, {},
         "oom_tolerance = '1.5' from env CP_OOM_TOLERANCE: Input should be less than 1"),
        ({}, {"oom_tolerance": 0.0},
         "oom_tolerance = '0.0' from flag --oom-tolerance: Input should be greater than 0"),
        ({"CP_DECISION_INTERVAL_S": "0"}, {}, "decision_interval_s = '0' from env CP_DECISION_INTERVAL_S: Input should "
         "be greater than 0"),
        ({"CP_TTL_S": "nan"}, {}, "ttl_s = 'nan' from env CP_TTL_S: Input should be a finite number"),
        ({"CP_PORT": "tcp://10.0.0.1:50151"}, {}, "enableServiceLinks: false"),
        ({"CP_LOG_LEVEL": "chatty"}, {}, "log_level = 'chatty' from env CP_LOG_LEVEL"),
        ({"CP_MAX_WINDOW_S": "0.5"}, {}, "max_window_s (0.5) must be ≥ bucket_s (1.0)"),
        ({}, {"max_disconnected_engines": -1}, "max_disconnected_engines = '-1' from flag --max-disconnected-engines: "
         "Input should be greater than or equal to 0"),
        ({"CP_REDIS_URL": "redis://user:hunter2@h:6379/0?bogus=1"}, {},
         "redis_url = 'redis://user:***@h:6379/0?bogus=1' from env CP_REDIS_URL"),
        ({}, {"host": "0.0.0.0"}, "pass --insecure (CP_INSECURE=1) to do it anyway (host from flag --host"),
        ({"CP_AGENT_TOKENS": TOKEN_A, "CP_OPERATOR_TOKENS": "operator:" + "a" * 24}, {},
         "a token cannot be both an agent and an operator token"),
        ({"CP_AGENT_TOKENS": "agents:short"}, {}, "agent_tokens = '<redacted: 1 identities>' from env CP_AGENT_TOKENS: "
         "expected identity:token with a token of ≥ 16 characters, got an entry for identity 'agents' with a "
         "5-character token"),
        ({"CP_AGENT_SCOPES": "agents"}, {}, "agent_scopes = 'agents' from env CP_AGENT_SCOPES"),
    ],
)
def test_bad_settings_are_named_with_their_source(env: dict, flags: dict, expected: str, tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as error:
        resolve_controller_settings(env={"CP_DATA_DIR": str(tmp_path), **env}, flags=flags)
    assert expected in str(error.value)
    assert "hunter2" not in str(error.value) and "short" not in str(error.value)


def test_tls_files_are_checked_together(tmp_path: Path) -> None:
    cert = write(tmp_path / "c.pem", "x")
    base = {"CP_DATA_DIR": str(tmp_path)}
    with pytest.raises(SettingsError, match=r"TLS needs both tls_cert and tls_key \(tls_cert from env CP_SERVER_TLS"):
        resolve_controller_settings(env={**base, "CP_SERVER_TLS_CERT": str(cert)})
    with pytest.raises(SettingsError, match=r"tls_key = .* from flag --tls-key: file not found"):
        resolve_controller_settings(env=base, flags={"tls_cert": cert, "tls_key": tmp_path / "missing.pem"})
    with pytest.raises(SettingsError, match=r"tls_client_ca \(mutual TLS\) needs tls_cert"):
        resolve_controller_settings(env=base, flags={"tls_client_ca": cert})
    secured = resolve_controller_settings(env={**base, "CP_AGENT_TOKENS": TOKEN_A, "CP_OPERATOR_TOKENS": TOKEN_O},
                                          flags={"host": "0.0.0.0", "tls_cert": cert, "tls_key": cert})
    config = secured.controller_config()
    assert config.security.authenticated and not config.security.insecure and not config.is_loopback


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("policy: {theta_max: 2}\n",
         "theta_max = '2' from file {file} (policy.theta_max): Input should be less than 1"),
        ("polcy: {theta_max: 0.5}\n", "unknown section 'polcy'"),
        ("theta_max: 0.5\n", "unknown section 'theta_max' ('theta_max' is a setting of section 'policy')"),
        ("loop: {theta_max: 0.5}\n", "theta_max belongs to section 'policy', not 'loop'"),
        ("policy: {theta: 0.5}\n", "unknown setting policy.theta"),
        ("policy: [1, 2]\n", "section 'policy' must be a mapping of settings"),
        ("- 1\n", "expected a mapping of sections"),
        ("policy: {theta_max: [\n", "not valid YAML"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, text: str, expected: str) -> None:
    file = write(tmp_path / "cp.yaml", text)
    with pytest.raises(SettingsError) as error:
        resolve_controller_settings(env={"CP_DATA_DIR": str(tmp_path)}, config_file=file)
    assert expected.format(file=file) in str(error.value)


def test_unreadable_or_unknown_file_kinds_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"expected a \.yaml, \.yml or \.toml file"):
        resolve_controller_settings(env={}, config_file=write(tmp_path / "cp.json", "{}"))
    with pytest.raises(SettingsError, match="No such file"):
        resolve_controller_settings(env={}, config_file=tmp_path / "missing.toml")
    with pytest.raises(SettingsError, match="not valid TOML"):
        resolve_controller_settings(env={}, config_file=write(tmp_path / "cp.toml", "[policy\n"))


# ------------------------------------------------------------------------------------------- display


def test_secrets_are_redacted_and_the_rest_shown(tmp_path: Path) -> None:
    env = {"CP_AGENT_TOKENS": f"{TOKEN_A},other:{'b' * 20}", "CP_OPERATOR_TOKENS": TOKEN_O,
           "CP_REDIS_URL": "redis+sentinel://:hunter2@s1:26379,s2/mymaster?sentinel_password=pw2"}
    views = {view.name: view for view in resolve_controller_settings(env=env).describe()}
    assert views["agent_tokens"].value == "<redacted: 2 identities>"
    assert views["operator_tokens"].value == "<redacted: 1 identities>"
    assert views["redis_url"].value == "redis+sentinel://:***@s1:26379,s2/mymaster?sentinel_password=***"
    assert views["agent_tokens"].flag == "" and views["agent_tokens"].env == "CP_AGENT_TOKENS"
    assert views["theta_min"].rule == "in (0, 1); ≤ theta_max" and views["port"].rule == "in [0, 65535]"
    assert views["output_window"].rule == "≥ 8; ≥ min_samples"
    assert views["data_dir"].value is None and views["data_dir"].source == "default"  # a Redis URL is given
    assert [view.section for view in views.values()] == sorted((v.section for v in views.values()),
                                                               key=SECTIONS.index)
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"
    assert redact_url("rediss://user:pw@h/0") == "rediss://user:***@h/0"


def test_config_show_prints_values_and_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    file = write(tmp_path / "cp.toml", "[loop]\nttl_s = 90\n")
    monkeypatch.setenv("CP_OPERATOR_TOKENS", TOKEN_O)
    monkeypatch.setenv("CP_THETA_MAX", "0.6")
    monkeypatch.setenv("CP_DATA_DIR", str(tmp_path))
    assert main(["config", "show", "--config", str(file), "--cooldown-s", "12", "-o", "json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert set(rows) == set(FIELDS)
    assert (rows["cooldown_s"]["value"], rows["cooldown_s"]["source"]) == (12.0, "flag --cooldown-s")
    assert (rows["theta_max"]["value"], rows["theta_max"]["source"]) == (0.6, "env CP_THETA_MAX")
    assert (rows["ttl_s"]["value"], rows["ttl_s"]["source"]) == (90.0, f"file {file} (loop.ttl_s)")
    assert rows["operator_tokens"]["value"] == "<redacted: 1 identities>"
    assert TOKEN_O.split(":")[1] not in json.dumps(rows)
    assert main(["config", "show", "-o", "wide"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["SETTING", "VALUE", "SOURCE", "FLAG", "ENV", "DEFAULT", "RULE"]
    assert any(line.split()[:3] == ["policy.theta_max", "0.6", "env"] for line in table)
    monkeypatch.setenv("CP_THETA_MIN", "0.7")
    with pytest.raises(SystemExit) as exited:
        main(["config", "show"])
    assert exited.value.code == 2
    assert "theta_min (0.7) must be ≤ theta_max (0.6)" in capsys.readouterr().err


def test_config_show_agent_resolves_the_engine_environment(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CP_CONTROLLER_ADDRESS", "cp.llm.svc:50151")
    monkeypatch.setenv("CP_AGENT_TOKEN", "t" * 24)
    monkeypatch.setenv("POD_NAME", "qwen3-8b-5d8f7-x2x9q")
    monkeypatch.delenv("CP_ENGINE_ID", raising=False)
    assert main(["config", "show", "--agent", "-o", "json"]) == 0
    rows = {row["env"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["CP_ENGINE_ID"]["value"] == "qwen3-8b-5d8f7-x2x9q"
    assert rows["CP_ENGINE_ID"]["source"] == "default from POD_NAME"
    assert rows["CP_AGENT_TOKEN"]["value"] == "<redacted>" and rows["CP_AGENT_TOKEN"]["source"] == "env"
    assert rows["CP_BATCH_INTERVAL_S"]["source"] == "default"
    monkeypatch.setenv("CP_BATCH_INTERVAL_S", "0")
    with pytest.raises(SystemExit):
        main(["config", "show", "--agent"])
    assert "CP_BATCH_INTERVAL_S='0' (env): must be a finite number in [0.01, 60.0]" in capsys.readouterr().err


def test_the_settings_reference_in_docs_is_current() -> None:
    """docs/SETTINGS.md is `controlplane config reference`; regenerate it when a setting changes."""
    assert (REPO / "docs" / "SETTINGS.md").read_text(encoding="utf-8") == reference_markdown()


def test_the_model_reads_only_its_keyword_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Environment and file are gathered by resolve_controller_settings (which knows each value's source),
    never behind its back."""
    monkeypatch.setenv("CP_THETA_MAX", "0.3")
    assert ControllerSettings().theta_max == PolicyConfig().theta_max
    assert ControllerSettings(theta_max=0.3).theta_max == 0.3


def test_the_sample_settings_file_the_readme_names_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """examples/controller.yaml validates, and every key in it is a setting taken from the file."""
    import yaml

    sample = REPO / "examples" / "controller.yaml"
    assert "--config examples/controller.yaml" in (REPO / "README.md").read_text(encoding="utf-8")
    monkeypatch.setenv("CP_DATA_DIR", str(tmp_path))
    assert main(["config", "show", "--config", str(sample), "-o", "json"]) == 0
    rows = {row["setting"] if "setting" in row else row["name"]: row for row in json.loads(capsys.readouterr().out)}
    keys = [f"{section}.{key}" for section, values in yaml.safe_load(sample.read_text(encoding="utf-8")).items()
            for key in values]
    assert keys and all(any(row["source"] == f"file {sample} ({key})" for row in rows.values()) for key in keys), keys
