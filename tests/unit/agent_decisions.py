"""Decisions as the agent receives them, for the tests of its enforcement (`agents.enforcement`): the fields the
enforcement reads, each with a default a test module may set for itself (`functools.partial`)."""

from __future__ import annotations

from controlplane.api.v1 import common_pb2


def decision(mode: int = common_pb2.MODE_EB, *, version: int = 1, k: int = 4, n: int = 16, b_max: int = 2048,
             b_cap: int = 256, n_th: int = 2, t_large: int = 0, n_d_large: int = 2, ttl_s: float = 30.0,
             advisory: bool = False) -> common_pb2.Decision:
    return common_pb2.Decision(
        version=version, mode=mode, k=k, n=n, ttl_s=ttl_s, advisory=advisory,
        budget=common_pb2.BudgetPolicy(b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=n_th, t_large_tokens=t_large,
                                       n_d_large=n_d_large),
    )
