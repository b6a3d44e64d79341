"""Observability adapters: OpenTelemetry spans for decisions and overrides, Prometheus metrics.

They turn core diagnostics into telemetry; they never decide anything.
"""
