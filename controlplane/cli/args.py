"""Argument parsing shared by the subcommands: a parser that reads negative numbers in every notation, and
argparse `type=` converters that reject out-of-domain numbers with a message naming the rule.

argparse (before Python 3.13) takes "-1e-4" or "-inf" for an option, so `--beta-d -1e-4` fails with
"expected one argument" and `ctl set-delta -2e-5` with "unrecognized arguments". `ArgumentParser` here
treats any token that parses as a number as a value; no option of this CLI looks like a number.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from controlplane.api.v1 import common_pb2
from controlplane.protocol import KV_ROLE_TO_PROTO, KvRole

# Every float literal Python accepts with a leading minus, including exponents, inf and nan.
_NEGATIVE_NUMBER = re.compile(r"^-(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^-(?:inf|infinity|nan)$", re.IGNORECASE)

# Counts of requests a CLI accepts (max_num_seqs, pinned k and N): far above any engine, far below uint32.
MAX_REQUESTS = 1 << 20
# Token counts a CLI accepts (KV capacity): exact in a double.
MAX_TOKENS = 1 << 53
_POOL_ROLES = frozenset(role.value for role in KvRole if role is not KvRole.NONE)


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser that reads "-1e-4", "-.5" or "-inf" as values, not as options.

    Subparsers created from it are of the same class (argparse's default), so one root parser suffices.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NEGATIVE_NUMBER


def finite_float(text: str) -> float:
    """A finite float (argparse type); "nan" and "inf" are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:64]!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text[:64]!r}")
    return value


def positive_float(text: str) -> float:
    """A finite float > 0 that is a normal double (≥ 2.2e-308: subnormals lose precision and overflow
    any ratio they divide)."""
    value = finite_float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text[:64]}")
    if value < sys.float_info.min:
        raise argparse.ArgumentTypeError(
            f"{text[:64]} is subnormal: must be ≥ {sys.float_info.min:.3g} (a normal double)")
    return value


def nonnegative_float(text: str) -> float:
    """A finite float ≥ 0."""
    value = finite_float(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {text[:64]}")
    return value


def bounded_int(*, low: int, high: int):
    """An argparse type: an integer in [low, high]; "1e6" and "2_000_000" are read when integral."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"not an integer: {text[:64]!r}") from None
            if not (math.isfinite(number) and number == int(number)):
                raise argparse.ArgumentTypeError(f"not an integer: {text[:64]!r}") from None
            value = int(number)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {text[:64]}")
        return value

    return parse


def parse_pool(text: str) -> common_pb2.Pool:
    """A pool as the CLI takes it (argparse type): MODEL|ACCELERATOR, or MODEL|ACCELERATOR|ROLE for the pool of the
    engines in a KV-transfer role (producer, consumer or both: disaggregated prefill/decode)."""
    model, sep, rest = text.partition("|")
    accelerator, _, role = rest.partition("|")
    if not sep or not model or not accelerator or (role and role not in _POOL_ROLES):
        raise argparse.ArgumentTypeError(f"a pool is MODEL|ACCELERATOR or MODEL|ACCELERATOR|ROLE (ROLE: producer, "
                                         f"consumer or both), got {text[:64]!r}")
    return common_pb2.Pool(model=model, accelerator=accelerator, kv_role=KV_ROLE_TO_PROTO[KvRole(role)])
