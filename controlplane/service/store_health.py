"""Whether the store answers: counted per failed operation, since when it is down, logged once per outage."""

from __future__ import annotations

import logging
from collections.abc import Callable

from controlplane.observability.metrics import ControllerMetrics
from controlplane.store import StoreUnavailable

logger = logging.getLogger(__name__)


class StoreHealth:
    """The store's state as this replica sees it. `down_since_s` is None while it answers; `answered` is set
    once any operation succeeded (readiness waits for it)."""

    def __init__(self, metrics: ControllerMetrics, clock: Callable[[], float]) -> None:
        self._metrics = metrics
        self._clock = clock
        self.down_since_s: float | None = None
        self.answered = False

    def ok(self) -> None:
        self.down_since_s = None
        self.answered = True
        self._metrics.store_up.set(1)

    def failed(self, operation: str, exc: BaseException) -> None:
        """Count a failed store operation; the first of an outage is logged."""
        self._metrics.store_errors.labels(operation=operation).inc()
        self._metrics.store_up.set(0)
        if self.down_since_s is None:
            self.down_since_s = self._clock()
            logger.warning("store unavailable during %s: %s; deciding from memory", operation, exc)

    def ping(self, ok: bool) -> None:
        if ok:
            self.ok()
        else:
            self.failed("ping", StoreUnavailable("ping: no answer"))
