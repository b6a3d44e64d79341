"""Ctrl-C for the CLI's asyncio commands, whichever of the process's threads the kernel hands SIGINT to.

`asyncio.run` stops on SIGINT through a Python-level handler, which Python runs in the main thread at its next
bytecode. A process-directed signal goes to any thread that does not block it, gRPC's threads included: the main
thread, asleep in the event loop's select() with nothing due (a `ctl watch` waiting for the next decision), then
sleeps on until something else arrives, and the command outlives its Ctrl-C. A handler installed with
`loop.add_signal_handler` is also written to the loop's wakeup descriptor from C, which wakes the select() at
once, so `until_interrupted` installs SIGINT's handler that way.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any

INTERRUPTED_EXIT = 130  # a shell's exit status for a command ended by SIGINT


async def until_interrupted(work: Coroutine[Any, Any, int]) -> int:
    """work's result, or INTERRUPTED_EXIT when SIGINT arrives first (work is then cancelled and awaited).

    Only the first SIGINT is handled here; a second one, while work winds down, raises KeyboardInterrupt in the
    main thread as Python's default does. Outside the main thread (no signal handlers there) work simply runs.
    """
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        loop.remove_signal_handler(signal.SIGINT)  # back to Python's default for a second Ctrl-C
        task.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (ValueError, RuntimeError):  # not the main thread, or a loop without signal support
        return await task
    try:
        return await task
    except asyncio.CancelledError:
        if interrupted:
            return INTERRUPTED_EXIT
        raise
    finally:
        if not interrupted:
            loop.remove_signal_handler(signal.SIGINT)
