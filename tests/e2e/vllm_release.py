"""Another vLLM release's pure-Python package, for tests that run a vLLM other than the installed one.

`release_package(version)` downloads `vllm-<version>-cp38-abi3-manylinux_2_28_<arch>.whl` from PyPI (the simple
index's JSON form, as `tests.e2e.vllm_upstream` fetches an sdist; sha256 checked against the index, cached under
~/.cache/controlplane-tests) and unpacks only the `vllm/` package's pure-Python files (no compiled extension,
no data files other than the package's own text files) into the cache, once. Putting the returned directory
first on PYTHONPATH in a subprocess makes `import vllm` give that release while torch, transformers and the
rest come from the project's virtualenv. The wheels are built for CUDA: nothing that needs vLLM's compiled
kernels can run that way, only pure-Python parts such as the v1 scheduler (with VLLM_TARGET_DEVICE=cpu).

Runnable as a script (`python -m tests.e2e.vllm_release 0.33.0`) to fill the cache ahead of a test run.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sys
import urllib.request
import zipfile
from pathlib import Path

INDEX_URL = "https://pypi.org/simple/vllm/"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "controlplane-tests"
# Suffixes of the files kept from the wheel's vllm/ package: Python sources and the small text/config files
# some modules read at import (json, yaml, jinja templates). Compiled extensions (.so) are left out.
_KEPT_SUFFIXES = (".py", ".pyi", ".json", ".yaml", ".yml", ".jinja", ".txt", ".typed")
_DONE = ".unpacked"


def wheel_name(version: str, machine: str | None = None) -> str:
    return f"vllm-{version}-cp38-abi3-manylinux_2_28_{machine or platform.machine()}.whl"


def fetch_wheel(version: str, cache_dir: Path = CACHE_DIR) -> Path:
    """The release's wheel for this machine (`fetch_release_file`)."""
    return fetch_release_file(wheel_name(version), cache_dir)


def fetch_release_file(name: str, cache_dir: Path = CACHE_DIR) -> Path:
    """One of vllm's release files on PyPI (a wheel, the sdist), its sha256 checked against the index (kept in
    cache_dir; a file already there with the index's sha256 is not downloaded again).

    Raises:
        RuntimeError: PyPI has no such file, or the download's sha256 differs from the index's.
    """
    request = urllib.request.Request(INDEX_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    entries = [f for f in files if f["filename"] == name]
    if not entries:
        raise RuntimeError(f"PyPI's index of vllm has no {name}")
    expected = entries[0]["hashes"]["sha256"]
    path = cache_dir / name
    if path.exists() and _sha256(path) == expected:
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + f".{os.getpid()}.part")
    with urllib.request.urlopen(entries[0]["url"], timeout=600) as response, partial.open("wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)
    if _sha256(partial) != expected:
        partial.unlink()
        raise RuntimeError(f"{name}: sha256 differs from the index's {expected}")
    partial.replace(path)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def unpack_python_package(wheel: Path, dest: Path) -> Path:
    """Unpack the wheel's `vllm/` package, pure-Python files only, into dest (once: a marker file records it).

    Returns dest (the directory to put first on PYTHONPATH; `dest/vllm` is the package).
    """
    if (dest / _DONE).exists():
        return dest
    staging = dest.with_name(dest.name + f".{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if info.is_dir() or not info.filename.startswith("vllm/") or not info.filename.endswith(_KEPT_SUFFIXES):
                continue
            target = staging / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(info))
    (staging / _DONE).write_text(wheel.name)
    try:
        staging.rename(dest)
    except OSError:  # another process unpacked it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
        if not (dest / _DONE).exists():
            raise
    return dest


def release_package(version: str, cache_dir: Path = CACHE_DIR) -> Path:
    """The directory holding release `version`'s pure-Python `vllm/` package (downloaded and unpacked once)."""
    dest = cache_dir / f"vllm-{version}-python"
    if (dest / _DONE).exists():
        return dest
    return unpack_python_package(fetch_wheel(version, cache_dir), dest)


if __name__ == "__main__":
    print(release_package(sys.argv[1] if len(sys.argv) > 1 else "0.33.0"))
