"""The alert rules pass `promtool check rules` and their unit tests (`promtool test rules`)."""

from __future__ import annotations

import subprocess

import yaml

from tests.deploy.paths import CHART_RULES, RULES, RULES_TEST
from tests.deploy.processes import require_binary


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = require_binary("promtool", package="prometheus")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=RULES.parent)


def test_check_rules() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    num_rules = sum(len(group["rules"]) for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"])
    assert f"SUCCESS: {num_rules} rules found" in result.stdout


def test_rule_unit_tests_pass() -> None:
    result = _promtool("test", "rules", str(RULES_TEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
              for rule in group["rules"] if "alert" in rule}
    tests = yaml.safe_load(RULES_TEST.read_text(encoding="utf-8"))["tests"]
    expected_firing = {case["alertname"] for test in tests for case in test.get("alert_rule_test", [])
                       if case.get("exp_alerts")}
    assert alerts == expected_firing


def test_a_broken_threshold_fails_the_unit_tests(tmp_path) -> None:
    """The unit tests can fail: the NACK alert with a 50% threshold no longer fires where they expect it."""
    broken = RULES.read_text(encoding="utf-8").replace("          > 0.05\n", "          > 0.5\n")
    assert broken != RULES.read_text(encoding="utf-8")
    (tmp_path / "rules.yaml").write_text(broken, encoding="utf-8")
    (tmp_path / "rules_test.yaml").write_text(RULES_TEST.read_text(encoding="utf-8"), encoding="utf-8")
    result = subprocess.run([require_binary("promtool", package="prometheus"), "test", "rules", "rules_test.yaml"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert "ControlPlaneDecisionNacks" in result.stdout + result.stderr


def test_chart_ships_the_same_rules() -> None:
    assert CHART_RULES.read_bytes() == RULES.read_bytes()
