"""The synthetic fleet: fake vLLM engines that stream telemetry to a controller over real gRPC.

Layers: `workload` (closed-loop spec; length distributions re-exported from `controlplane.sim.lengths`),
`profiles` (re-exported from `controlplane.sim.profiles`), `settings` (Decision → engine settings),
`telemetry` (records) → `engine` (the twin's engine, `controlplane.sim.engine.SimEngine`, behind the fleet's
interface; all of these pure) → `messages` (engine state to AgentService messages, pure) → `client` (one
engine's grpc.aio stream) → `fleet` (N clients as asyncio tasks). Used by the demo and as the controller's
load generator; it imports `controlplane.api`, value types and rules of `controlplane.core`, and
`controlplane.sim` (whose engine runs the agent's own enforcement code).
"""

from controlplane.fleet.client import ClientCounters, FleetEngineClient, StreamEndedError
from controlplane.fleet.engine import FakeEngine
from controlplane.fleet.fleet import DEFAULT_POOLS, EngineStats, FleetPool, FleetStats, SyntheticFleet
from controlplane.fleet.profiles import H200_QWEN3_8B, H200_QWEN3_8B_SHAPE, RTX_PRO_6000_QWEN3_8B, EngineShape
from controlplane.fleet.settings import EngineSettings, settings_from_decision
from controlplane.fleet.telemetry import EngineTelemetry, SchedulerState, StepRecord
from controlplane.fleet.workload import (
    FixedLengths,
    GeometricLengths,
    LengthDistribution,
    LinearHazardLengths,
    UniformLengths,
    WorkloadSpec,
    parse_length_distribution,
    parse_workload,
)

__all__ = [
    "DEFAULT_POOLS",
    "H200_QWEN3_8B",
    "H200_QWEN3_8B_SHAPE",
    "RTX_PRO_6000_QWEN3_8B",
    "ClientCounters",
    "EngineSettings",
    "EngineShape",
    "EngineStats",
    "EngineTelemetry",
    "FakeEngine",
    "FixedLengths",
    "FleetEngineClient",
    "FleetPool",
    "FleetStats",
    "GeometricLengths",
    "LengthDistribution",
    "LinearHazardLengths",
    "SchedulerState",
    "StepRecord",
    "StreamEndedError",
    "SyntheticFleet",
    "UniformLengths",
    "WorkloadSpec",
    "parse_length_distribution",
    "parse_workload",
    "settings_from_decision",
]
