"""Build the project's wheel the way the release workflow does, from a copy of the sources (so nothing in the
checkout, such as a stale `build/` directory, can end up in it): `python -m build --wheel --no-isolation` (this
environment's setuptools is the build backend)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("controlplane", "agents")


def build_wheel(workdir: Path, *, timeout_s: float = 600.0) -> Path:
    """The wheel built from a copy of the sources under workdir (source/, dist/).

    Raises:
        AssertionError: the build failed (with its output).
    """
    source, out = workdir / "source", workdir / "dist"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
                             str(source)], capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"wheel build: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    (built,) = out.glob("vllm_controlplane-*.whl")
    return built
