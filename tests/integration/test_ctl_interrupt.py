"""Ctrl-C stops a `ctl` command that waits on the controller, whichever of its threads the kernel hands SIGINT to.

A process-directed signal goes to any thread that does not block it, and a `ctl` process runs gRPC's threads
beside its main one. The test delivers SIGINT to one of those threads only (tgkill), while `ctl watch` waits for a
decision with its main thread asleep in the event loop's select(): the command must still end with 130 at once.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import subprocess
import sys
import time

import grpc

from controlplane.api.v1 import common_pb2
from tests.integration.controller_harness import AgentStream, make_config, running_controller

_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}
EXIT_WITHIN_S = 10.0


def _tgkill(pid: int, tid: int, sig: int) -> None:
    """Send `sig` to thread `tid` of process `pid` only (Linux's tgkill; Python has no binding for it)."""
    number = _SYS_TGKILL[os.uname().machine]
    if ctypes.CDLL(None, use_errno=True).syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")


def _other_threads(pid: int) -> list[int]:
    return sorted(int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid)


async def test_ctl_watch_ends_on_a_sigint_delivered_to_a_grpc_thread(redis_url: str) -> None:
    async with running_controller(make_config(redis_url)) as ctl, grpc.aio.insecure_channel(ctl.address) as channel:
        agent = await AgentStream(channel, "interrupt-0", common_pb2.Pool(model="m", accelerator="a")).open()
        await agent.next_decision()  # one engine with a decision, which the watch shows first
        # A terminal's foreground command: SIGINT at its default disposition (not this worker's, maybe ignored).
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            watch = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "controlplane", "ctl", "--address",
                                      ctl.address, "watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        try:
            assert watch.stdout is not None
            lines = [(await asyncio.to_thread(watch.stdout.readline)).split() for _ in range(2)]
            assert lines[0][:3] == ["EVENT", "ENGINE", "MODE"] and lines[1][:2] == ["snapshot", "interrupt-0"], lines
            threads = _other_threads(watch.pid)
            assert threads, "ctl watch runs no thread beside its main one: nothing to deliver the signal to"
            _tgkill(watch.pid, threads[-1], signal.SIGINT)
            started = time.monotonic()
            try:
                _, err = watch.communicate(timeout=EXIT_WITHIN_S)
            except subprocess.TimeoutExpired:
                watch.send_signal(signal.SIGABRT)  # -X faulthandler: every thread's stack on stderr
                _, err = watch.communicate(timeout=10)
                raise AssertionError(f"ctl watch still running {EXIT_WITHIN_S:.0f} s after a SIGINT to thread "
                                     f"{threads[-1]} of {threads}:\n{err[-4000:]}") from None
            print(f"ended {time.monotonic() - started:.2f} s after the signal; threads {threads}")
            assert watch.returncode == 130 and "Traceback" not in err, (watch.returncode, err[-2000:])
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.wait()
