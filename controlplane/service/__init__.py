"""The controller service: telemetry ingest, per-engine/pool estimator state, the decision loop, the
gRPC servicers (thin), authentication, and the app that owns server start and stop."""
