"""Errors raised by the store adapter.

Callers treat a failed write as a hard failure (an operator override that cannot be made durable must be
reported as UNAVAILABLE, never silently dropped), so every Redis failure surfaces as `StoreUnavailable`
naming the store operation that failed. Invalid arguments raise `ValueError` before Redis is contacted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import RedisClusterException, RedisError, ResponseError

REDIS_FAILURES: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, OSError)
"""What a Redis operation raises when Redis fails: redis-py errors (cluster errors that are not RedisError
included) and socket errors (TimeoutError among them)."""


class StoreUnavailable(Exception):  # noqa: N818 (the name states the condition, as gRPC's UNAVAILABLE)
    """Redis could not carry out a store operation (connection refused or lost, timeout, error reply).

    Attributes:
        operation: the store method that failed, e.g. "set_override".
    """

    def __init__(self, operation: str, cause: BaseException | None = None) -> None:
        """
        Args:
            operation: the store method (or probe) that failed.
            cause: the Redis or socket error, when there is one (also chained as __cause__).
        """
        super().__init__(f"store operation {operation!r} failed{_detail(cause)}")
        self.operation = operation


_MAX_DETAIL_CHARS = 160


def _detail(cause: BaseException | None) -> str:
    """What an operator may read of a failure: the error's type and the first line of its text, bounded; an
    error reply (a script's or a command's) only by its type, since its text quotes the store's internals."""
    if cause is None:
        return ""
    if isinstance(cause, ResponseError):
        return f": the store answered with an error ({type(cause).__name__})"
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    if len(text) > _MAX_DETAIL_CHARS:
        text = text[:_MAX_DETAIL_CHARS] + "…"
    return f": {type(cause).__name__}: {text}" if text else f": {type(cause).__name__}"


@contextmanager
def unavailable_on_error(operation: str) -> Iterator[None]:
    """Translate Redis and socket errors raised inside the block into `StoreUnavailable(operation)`."""
    try:
        yield
    except REDIS_FAILURES as err:
        raise StoreUnavailable(operation, err) from err
