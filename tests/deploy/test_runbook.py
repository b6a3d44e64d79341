"""Every alert links to its runbook: a `runbook_url` annotation pointing at the alert's own section of
deploy/README.md's Runbook, which says what the alert means and what to do; the README's alert table and
its Runbook list exactly the alerts of the rules, and Grafana's copies of the alerts carry the same link."""

from __future__ import annotations

import re
from urllib.parse import urlparse

import yaml

from tests.deploy.paths import DEPLOY_README, GRAFANA_ALERTING, RULES


def _alerts() -> dict[str, dict]:
    """The alerting rules of rules.yaml by name."""
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {rule["alert"]: rule for group in document["groups"] for rule in group["rules"] if "alert" in rule}


def _section(text: str, heading: str) -> str:
    """The body of the `## heading` section of a Markdown text (up to the next second-level heading)."""
    body = text.split(f"\n## {heading}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def _runbook() -> dict[str, str]:
    """The Runbook's subsections by heading."""
    parts = re.split(r"^### (.+)$", _section(DEPLOY_README.read_text(encoding="utf-8"), "Runbook"), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading: lower case, spaces as hyphens, punctuation
    other than hyphens and underscores dropped."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_links_to_its_own_runbook_section() -> None:
    alerts = _alerts()
    urls = {name: rule["annotations"].get("runbook_url", "") for name, rule in alerts.items()}
    assert all(urls.values()), [name for name, url in urls.items() if not url]
    anchors = {_anchor(heading) for heading in _runbook()}
    for name, url in urls.items():
        link = urlparse(url)
        # A path in the repository (no project address is assumed): deploy/README.md says to prefix it with
        # where the deployment serves its documentation.
        assert not link.scheme and link.path == "deploy/README.md", url
        assert link.fragment == _anchor(name) and link.fragment in anchors, url
    assert len({urlparse(url)._replace(fragment="").geturl() for url in urls.values()}) == 1  # one document


def test_the_runbook_and_the_alert_table_list_exactly_the_alerts() -> None:
    alerts = set(_alerts())
    assert set(_runbook()) == alerts
    table = _section(DEPLOY_README.read_text(encoding="utf-8"), "Metrics, dashboard and alerts")
    assert set(re.findall(r"^\| (ControlPlane\w+) \|", table, flags=re.MULTILINE)) == alerts


def test_each_runbook_section_says_what_the_alert_means_and_what_to_do() -> None:
    for heading, body in _runbook().items():
        means, _, do = body.partition("**Do.**")
        assert "**Means.**" in means and len(means.split()) >= 20, heading
        assert len(do.split()) >= 15, heading


def test_grafanas_alerts_carry_the_same_links() -> None:
    document = yaml.safe_load(GRAFANA_ALERTING.read_text(encoding="utf-8"))
    grafana = {rule["title"]: rule["annotations"].get("runbook_url") for group in document["groups"]
               for rule in group["rules"]}
    assert grafana == {name: rule["annotations"]["runbook_url"] for name, rule in _alerts().items()}
