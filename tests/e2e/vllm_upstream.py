"""vLLM's own scheduler tests, fetched from the installed version's source distribution and run in a subprocess.

Nothing of vLLM's test code lives in this repository: `fetch_sdist` downloads `vllm-<version>.tar.gz` from PyPI
(the simple index's JSON form, sha256 checked, cached under ~/.cache/controlplane-tests), `extract_tests`
unpacks the scheduler test modules and the helpers they import, and `write_offline_hf_cache` gives them the
text models' configs they read (facebook/opt-125m's and opt-350m's, written from `transformers.OPTConfig`:
the scheduler reads a config, never weights or a tokenizer). `run_upstream` runs them under the plugin
`vllm_upstream_plugin`, which swaps in the agent's scheduler classes when asked, once per configuration, from
one process that imports vLLM once (`vllm_upstream_runner`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.vllm_release import CACHE_DIR, fetch_release_file

TEST_FILES = tuple(f"tests/v1/core/{name}.py" for name in (
    "test_scheduler", "test_async_scheduler", "test_priority_scheduler_random", "test_priority_preemption_bug",
    "test_deferred_block_free", "test_swa_inflight_window_free", "test_worker_slot_overflow", "test_prefix_replay",
    "test_prefix_caching"))  # every module of tests/v1/core that builds a Scheduler
HELPER_FILES = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/core/__init__.py", "tests/v1/core/utils.py",
                "tests/v1/kv_connector/__init__.py", "tests/v1/kv_connector/unit/__init__.py",
                "tests/v1/kv_connector/unit/utils.py")
_FAKE_REVISION = "0" * 40
# A test running longer than STUCK_TEST_S has every thread's stack written to stderr (pytest's faulthandler);
# one running longer than FAILED_TEST_S fails (pytest-timeout), and the run goes on. The longest test takes
# under 10 s here.
STUCK_TEST_S = 120
FAILED_TEST_S = 300


def fetch_sdist(version: str, cache_dir: Path = CACHE_DIR) -> Path:
    """vllm-<version>.tar.gz from PyPI, its sha256 checked against the index (kept in cache_dir)."""
    return fetch_release_file(f"vllm-{version}.tar.gz", cache_dir)


def extract_tests(sdist: Path, dest: Path) -> None:
    """The scheduler test modules and their helpers, at their paths under dest."""
    prefix = sdist.name.removesuffix(".tar.gz") + "/"
    with tarfile.open(sdist) as tar:
        for relative in TEST_FILES + HELPER_FILES:
            member = tar.extractfile(prefix + relative)
            if member is None:
                raise RuntimeError(f"{sdist.name} has no {relative}")
            target = dest / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(member.read())


def write_offline_hf_cache(hf_home: Path) -> None:
    """An offline Hugging Face cache holding the configs of the text models the tests name (facebook/opt-125m
    and opt-350m, their published architectures). The multimodal ones (llava, Qwen2.5-VL) need processors
    and torchvision, which this environment does not have: their tests fail on stock too."""
    from transformers import OPTConfig

    common = dict(vocab_size=50272, max_position_embeddings=2048, activation_function="relu", pad_token_id=1,
                  bos_token_id=2, eos_token_id=2, torch_dtype="float16", architectures=["OPTForCausalLM"])
    configs = {
        "facebook/opt-125m": OPTConfig(hidden_size=768, num_hidden_layers=12, ffn_dim=3072, num_attention_heads=12,
                                       word_embed_proj_dim=768, do_layer_norm_before=True, **common),
        "facebook/opt-350m": OPTConfig(hidden_size=1024, num_hidden_layers=24, ffn_dim=4096,
                                       num_attention_heads=16, word_embed_proj_dim=512, do_layer_norm_before=False,
                                       **common),
    }
    for name, config in configs.items():
        repo = hf_home / "hub" / ("models--" + name.replace("/", "--"))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(_FAKE_REVISION)
        config.save_pretrained(repo / "snapshots" / _FAKE_REVISION)


@dataclass(frozen=True)
class UpstreamRun:
    """One configuration of the tests: `agent` swaps in the agent's scheduler classes (`vllm_upstream_plugin`);
    `env` holds its extra variables (CP_*)."""

    label: str
    agent: bool
    env: dict[str, str] = field(default_factory=dict)


def run_upstream(root: Path, runs: list[UpstreamRun], *, timeout_s: float = 1200
                 ) -> dict[str, tuple[dict[str, str], dict[str, int]]]:
    """Run the extracted tests under root once per run, one after another, each in a process forked from one that
    has imported vLLM (`vllm_upstream_runner`); returns {label: ({test id: passed|failed|skipped}, the plugin's
    summary)}. A run still going after timeout_s is stopped and raises, with the end of its output.
    """
    plugin_dir = Path(__file__).parent
    repo = plugin_dir.parents[1]
    spec, result = root / "runs.json", root / "runs.result.json"
    spec.write_text(json.dumps({"result": str(result), "runs": [
        {"label": run.label, "log": str(root / f"{run.label}.log"), "timeout_s": timeout_s,
         "env": {**run.env, "CP_UPSTREAM_SCHEDULER": "agent" if run.agent else "stock",
                 "CP_UPSTREAM_SUMMARY": str(root / f"{run.label}.summary.json")},
         "args": ["-v", "-p", "no:cacheprovider", "-p", "vllm_upstream_plugin", "--confcutdir",
                  str(root / "tests" / "v1"), f"--junitxml={root / f'{run.label}.xml'}", "-o", "junit_family=xunit1",
                  "-o", f"faulthandler_timeout={STUCK_TEST_S}", f"--timeout={FAILED_TEST_S}",
                  "--timeout-method=signal", *TEST_FILES]}  # -v: a stopped run's log names the test it was in
        for run in runs]}))
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("CP_")}
    run_env.update(HF_HOME=str(root / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONPATH=os.pathsep.join([str(root), str(plugin_dir), str(repo)]))
    runner = subprocess.run([sys.executable, str(plugin_dir / "vllm_upstream_runner.py"), str(spec)], cwd=root,
                            env=run_env, capture_output=True, text=True, timeout=timeout_s * len(runs) + 120)
    if not result.exists():
        raise RuntimeError(f"the runner failed (exit {runner.returncode}):\n{_tail(runner.stdout)}\n"
                           f"{_tail(runner.stderr)}")
    statuses, outcomes = json.loads(result.read_text()), {}
    for run in runs:
        status, log, junit = statuses[run.label], root / f"{run.label}.log", root / f"{run.label}.xml"
        if status["timed_out"]:
            raise RuntimeError(f"{run.label}: still running after {timeout_s:.0f} s:\n{_tail(log.read_text(), 12000)}")
        if not junit.exists():
            raise RuntimeError(f"{run.label}: pytest wrote no report (exit {status['exit']}):\n"
                               f"{_tail(log.read_text())}")
        outcomes[run.label] = (_outcomes(junit), json.loads((root / f"{run.label}.summary.json").read_text()))
    return outcomes


def _tail(output: str | bytes | None, num_chars: int = 3000) -> str:
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return (output or "")[-num_chars:]


def failure_sites(root: Path, label: str) -> dict[str, str]:
    """{failed test id: the file of the innermost frame of its traceback} of run `label` (tests/… when the test's
    own assertion failed; a path in vllm/ or agents/ when vLLM or the agent raised)."""
    sites = {}
    for name, case in _cases(root / f"{label}.xml"):
        failure = _failure(case)
        if failure is not None:
            frames = re.findall(r"^(\S+?\.py):\d+: \w+", failure.text or "", re.MULTILINE)
            sites[name] = frames[-1] if frames else "?"
    return sites


def _outcomes(junit: Path) -> dict[str, str]:
    outcomes = {}
    for name, case in _cases(junit):
        if _failure(case) is not None:
            outcomes[name] = "failed"
        elif case.find("skipped") is not None:
            outcomes[name] = "skipped"
        else:
            outcomes[name] = "passed"
    return outcomes


def _cases(junit: Path) -> Iterator[tuple[str, ET.Element]]:
    """(test id, its testcase element) of a junit report."""
    for case in ET.parse(junit).getroot().iter("testcase"):
        yield f"{case.get('classname')}::{case.get('name')}", case


def _failure(case: ET.Element) -> ET.Element | None:
    """The failure (or error) element of a testcase; None when it passed or was skipped."""
    failure = case.find("failure")
    return failure if failure is not None else case.find("error")
