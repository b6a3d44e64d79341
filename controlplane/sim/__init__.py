"""The digital twin of a vLLM engine: the agent's own enforcement code scheduling a cost-model engine.

Modules (each pure, no I/O unless stated):
- `lengths`    request-length distributions and named shapes (EB synthetic, dataset-like, P-PAS long context)
- `arrivals`   workloads: closed-loop phases (concurrency) and open-loop Poisson / bursty phases
- `hardware`   model architectures (published config.json values) and accelerators (datasheet peaks), from data/
- `roofline`   the step-time model: compute and memory time per kernel kind, calibrated factors, overheads
- `calibrate`  fits the roofline's factors to the published measurements (`python -m controlplane.sim.calibrate`)
- `profiles`   (model, accelerator) profiles: roofline (or linear CostModel) + the controller's CostModel +
               EngineShape; JSON files
- `costs`      iteration time of one step from a profile
- `engine`     `SimEngine`: slots, KV blocks, chunked prefill, preemption; every step planned by
               `agents.enforcement.Enforcer` exactly as the vLLM adapter applies it
- `control`    none / fixed decision / the core policy online (the controller's loop without the network)
- `schedulers` v1, v0, EB(k), EB(k̂*), EB+, fixed MBT, P-PAS, P-PAS+ as engine shape + control
- `scenarios`  the papers' experiments and a compact spelling for custom scenarios
- `runner`     run one scenario under one scheduler → metrics, decision timeline, step log
- `metrics`    throughput, TTFT, TPOT, E2E (mean, p95), makespan
- `fit`        fit a profile from recorded step telemetry (reads the file it is given)
- `plots`      throughput/latency and decision-timeline PNGs (matplotlib; writes the paths it is given)
- `report`     tables (text, CSV) of runs

Layering: imports `controlplane.core`, `controlplane.api`, `controlplane.service` (edge conversions and the
decision-loop config) and `agents.enforcement`; the demo fleet and the CLI import it. No network, store or
event loop (import-linter contracts in pyproject.toml).
"""
