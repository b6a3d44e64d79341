"""The GitHub Actions workflows: CI (.github/workflows/ci.yml: the project's test command on every push and pull
request) and the release (.github/workflows/release.yml, on a tag v*: CI, the sdist and the wheel, the wheel
smoke-tested in a clean environment, then PyPI by trusted publishing and the images of deploy/docker).

No runner runs here: the workflows are parsed as YAML and cross-checked with the repository (every `make`
target they run is one of the Makefile's, every repository path they name exists, every Dockerfile is
built), and the scripts they run are run: the release's version check on a copy of the files it reads, and
the wheel's smoke test against this checkout's environment.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import controlplane
from tests.deploy.paths import REPO
from tests.deploy.test_dockerfiles import _vllm_version

WORKFLOWS = REPO / ".github" / "workflows"
CI = WORKFLOWS / "ci.yml"
RELEASE = WORKFLOWS / "release.yml"
_MAKE = re.compile(r"(?<![\w./-])make\s+((?:-\S+\s+)*)([A-Za-z][\w-]*)")
_IGNORED = {".git", ".venv", ".pytest_cache", ".ruff_cache", ".hypothesis", ".import_linter_cache", "build", "dist"}


def load(path: Path) -> dict[str, Any]:
    """A workflow; YAML 1.1 reads the key `on` as True, put back under "on"."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["on"] = document.pop(True)
    return document


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def scripts(workflow: dict[str, Any]) -> list[str]:
    return [step["run"] for step in steps(workflow) if "run" in step]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (REPO / "Makefile").read_text(encoding="utf-8"), flags=re.M))


def make_targets(text: str) -> set[str]:
    """The targets of every `make …` command in a shell script."""
    return {match.group(2) for match in _MAKE.finditer(text)}


def repository_paths(text: str) -> set[str]:
    """Every path into the repository a script or value names: a top-level directory of the checkout with a
    path under it (`tools/…`, `.ci/run`, `deploy/docker/…`) or a top-level file (`CHANGELOG.md`), bare or
    under $GITHUB_WORKSPACE. (A directory's bare name is a word like any other: `tests`, `import agents`.)"""
    entries = [path for path in REPO.iterdir() if path.name not in _IGNORED and not path.name.endswith(".egg-info")]
    directories = "|".join(re.escape(p.name) for p in entries if p.is_dir())
    files = "|".join(re.escape(p.name) for p in entries if p.is_file())
    pattern = re.compile(rf"(?:(?<=\$GITHUB_WORKSPACE/)|(?<=\"\$GITHUB_WORKSPACE\"/)|(?<![\w./$\"-]))"
                         rf"((?:{directories})(?:/[\w.*-]+)+|(?:{files}))(?![\w-])")
    return set(pattern.findall(text))


def missing_paths(paths: set[str]) -> list[str]:
    return sorted(path for path in paths
                  if not (any(REPO.glob(path)) if "*" in path else (REPO / path).exists()))


def test_the_checkers_find_what_a_workflow_gets_wrong() -> None:
    script = "make tset\nmake -j2 lint\npython tools/wheel_smok.py --bin x\ncp dist/*.whl /tmp\n" \
             'grep -q x CHANGELOG.md && python "$GITHUB_WORKSPACE/tools/wheel_smoke.py"'
    assert make_targets(script) == {"tset", "lint"}
    assert make_targets(script) - makefile_targets() == {"tset"}
    assert repository_paths(script) == {"tools/wheel_smok.py", "CHANGELOG.md", "tools/wheel_smoke.py"}
    assert missing_paths(repository_paths(script)) == ["tools/wheel_smok.py"]


def workflow_texts(path: Path) -> list[str]:
    """What a workflow runs and names: its scripts, its steps' inputs, the repository's shell scripts its steps
    run (.ci/run runs `make test`) and, for a job that calls a workflow of this repository, that one's."""
    workflow = load(path)
    texts = scripts(workflow) + [str(value) for step in steps(workflow) for value in step.get("with", {}).values()]
    texts += [str(value) for job in workflow["jobs"].values()
              for entry in job.get("strategy", {}).get("matrix", {}).get("include", []) for value in entry.values()]
    for script in scripts(workflow):
        texts += [(REPO / p).read_text(encoding="utf-8") for p in repository_paths(script)
                  if (REPO / p).is_file() and (REPO / p).suffix in ("", ".sh")]
    for job in workflow["jobs"].values():
        if job.get("uses", "").startswith("./"):
            texts.append(job["uses"])
            texts += workflow_texts(REPO / job["uses"])
    return texts


@pytest.mark.parametrize("path", [CI, RELEASE], ids=["ci", "release"])
def test_every_make_target_and_repository_path_exists(path: Path) -> None:
    workflow = load(path)
    text = "\n".join(workflow_texts(path))
    assert make_targets(text) and make_targets(text) <= makefile_targets(), make_targets(text) - makefile_targets()
    assert repository_paths(text)
    assert missing_paths(repository_paths(text)) == []
    for step in steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w-]+/[\w./-]+@[\w./-]+", step["uses"]), f"{step['uses']} is not pinned"


def test_ci_runs_the_project_test_command_on_pushes_pull_requests_and_for_the_release() -> None:
    ci = load(CI)
    assert set(ci["on"]) == {"push", "pull_request", "workflow_call"}
    assert ci["on"]["push"] == {"branches": ["**"]}  # tags go to the release, which calls this workflow
    [job] = ci["jobs"].values()
    assert job["container"].startswith("python:3.11")  # Debian, as `make system-deps` expects
    assert [step.get("run") for step in job["steps"] if "run" in step] == [".ci/run", "make lint"]
    assert "make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")


def test_the_release_publishes_only_what_passed() -> None:
    release = load(RELEASE)
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert release["permissions"] == {"contents": "read"}
    jobs = release["jobs"]
    assert jobs["test"]["uses"] == "./.github/workflows/ci.yml"
    assert "python -m build" in "\n".join(s["run"] for s in jobs["build"]["steps"] if "run" in s)
    assert jobs["wheel"]["needs"] == "build"
    smoke = next(s["run"] for s in jobs["wheel"]["steps"] if "wheel_smoke.py" in s.get("run", ""))
    assert '--version "${GITHUB_REF_NAME#v}"' in smoke and '--outside "$GITHUB_WORKSPACE"' in smoke
    for name in ("pypi", "images"):
        assert set(jobs[name]["needs"]) == {"test", "wheel"}
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}  # trusted publishing: no token stored
    assert jobs["pypi"]["environment"]["name"] == "pypi"
    assert [s["uses"] for s in jobs["pypi"]["steps"]][-1] == "pypa/gh-action-pypi-publish@release/v1"
    assert not [s for s in jobs["pypi"]["steps"] if "with" in s and "password" in s["with"]]


def test_the_release_builds_every_image_of_deploy_docker() -> None:
    images = load(RELEASE)["jobs"]["images"]
    built = sorted(entry["dockerfile"] for entry in images["strategy"]["matrix"]["include"])
    assert built == sorted(p.relative_to(REPO).as_posix() for p in (REPO / "deploy" / "docker").glob("*.Dockerfile"))
    build = next(s for s in images["steps"] if s.get("uses", "").startswith("docker/build-push-action@"))
    assert build["with"]["context"] == "." and build["with"]["push"] is True  # per-Dockerfile .dockerignore
    assert images["permissions"]["packages"] == "write"
    assert load(RELEASE)["env"]["VLLM_VERSION"] == _vllm_version()  # the vLLM the agent images are built on


def _version_check() -> str:
    build = load(RELEASE)["jobs"]["build"]
    return next(s["run"] for s in build["steps"] if "CHANGELOG.md" in s.get("run", ""))


@pytest.mark.parametrize(("tag", "section", "failure"), [
    (f"v{controlplane.__version__}", True, None),
    ("v9.9.9", True, "is not controlplane.__version__"),
    (f"v{controlplane.__version__}", False, "CHANGELOG.md has no section"),
], ids=["matching", "another-version", "no-changelog-section"])
def test_the_release_checks_the_tag_against_the_version_and_the_changelog(
        tmp_path: Path, tag: str, section: bool, failure: str | None) -> None:
    (tmp_path / "controlplane").mkdir()
    shutil.copy(REPO / "controlplane" / "__init__.py", tmp_path / "controlplane" / "__init__.py")
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    if section:  # as the release commit adds it under [Unreleased]
        changelog = changelog.replace("## [Unreleased]\n", f"## [Unreleased]\n\n## [{tag[1:]}] - 2026-07-01\n", 1)
    (tmp_path / "CHANGELOG.md").write_text(changelog, encoding="utf-8")
    result = subprocess.run(["bash", "-e", "-c", _version_check()], cwd=tmp_path, capture_output=True, text=True,
                            env={"GITHUB_REF_NAME": tag, "PATH": "/usr/bin:/bin"}, timeout=60)
    if failure is None:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode == 1 and failure in result.stdout, result.stdout + result.stderr


def test_the_wheel_smoke_test_passes_on_an_install_and_fails_on_the_checkout() -> None:
    script, bin_dir = REPO / "tools" / "wheel_smoke.py", Path(sys.executable).parent
    result = subprocess.run([sys.executable, str(script), "--bin", str(bin_dir), "--version",
                             controlplane.__version__], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line.split(":")[0] for line in result.stdout.splitlines()] == ["ok"] * 6
    assert "serve on 127.0.0.1:" in result.stdout
    # This environment's package is the checkout itself (an editable install): --outside says so.
    inside = subprocess.run([sys.executable, str(script), "--bin", str(bin_dir), "--outside", str(REPO)],
                            capture_output=True, text=True, timeout=300)
    assert inside.returncode == 1 and "not the installed package" in inside.stderr
    wrong = subprocess.run([sys.executable, str(script), "--bin", str(bin_dir), "--version", "0.0.0"],
                           capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 1 and "expected 'controlplane 0.0.0'" in wrong.stderr
