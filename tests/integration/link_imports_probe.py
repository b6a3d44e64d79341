"""Run by `test_agent_link.py` in a fresh interpreter: which modules the link thread imports after start().

Prints a JSON object: "thread_imports" (module names first imported on the link thread) and
"num_decisions" (decisions the link received). argv: the controller address, seconds to run.
"""

from __future__ import annotations

import json
import sys
import threading
import time

_IMPORTS: list[tuple[str, str]] = []


class _ImportSpy:
    """A meta-path finder that finds nothing and records who asked (a module not yet in sys.modules)."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        _IMPORTS.append((threading.current_thread().name, name))


def main() -> None:
    from agents.config import AgentConfig
    from agents.link import ControllerLink
    from agents.recorder import TelemetryRecorder
    from controlplane.api.v1 import agent_pb2, common_pb2

    address, run_s = sys.argv[1], float(sys.argv[2])
    decisions: list[common_pb2.Decision] = []
    limits = agent_pb2.EngineLimits(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=1 << 20,
                                    block_size_tokens=16, max_model_len_tokens=4096)
    hello = agent_pb2.Hello(engine_id="engine-probe", pool=common_pb2.Pool(model="tiny", accelerator="cpu"),
                            vllm_version="0.32.0", agent_version="probe", limits=limits)
    link = ControllerLink(AgentConfig(controller_address=address, engine_id="engine-probe", pool_model="tiny",
                                      pool_accelerator="cpu", batch_interval_s=0.1),
                          hello=hello, recorder=TelemetryRecorder(capacity=64),
                          on_decision=lambda decision, now_s: (decisions.append(decision) or True, ""))
    sys.meta_path.insert(0, _ImportSpy())
    link.start()
    time.sleep(run_s)
    link.stop()
    print(json.dumps({"thread_imports": sorted({name for thread, name in _IMPORTS if thread == "controlplane-link"}),
                      "num_decisions": len(decisions)}))


if __name__ == "__main__":
    main()
