"""The decision loop shared by the controller and the twin: per-engine `EngineLoop`, per-pool
`PoolStatistics` (mergeable time buckets), the loop's config, and the proto codec of decisions and
telemetry. Pure: no I/O, no clock (an import-linter contract keeps it so)."""
