"""The synthetic fleet's workload spec: output and prompt length distributions and a closed-loop concurrency.

The length distributions live in `controlplane.sim.lengths` (shared with the twin) and are re-exported here so
existing imports keep working. A `WorkloadSpec` is written "<output>/<prompt>[/closed:<concurrency>]", e.g.
"geometric:256/uniform:512/closed:64". Malformed text raises ValueError naming the part that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from controlplane.sim.lengths import (
    DEFAULT_MAX_HAZARD_TOKENS,
    FixedLengths,
    GeometricLengths,
    LengthDistribution,
    LinearHazardLengths,
    UniformLengths,
    finite_number,
    parse_length_distribution,
)

DEFAULT_CONCURRENCY = 64

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MAX_HAZARD_TOKENS",
    "FixedLengths",
    "GeometricLengths",
    "LengthDistribution",
    "LinearHazardLengths",
    "UniformLengths",
    "WorkloadSpec",
    "parse_length_distribution",
    "parse_workload",
]


@dataclass(frozen=True)
class WorkloadSpec:
    """What the fake engines serve: output and prompt lengths, and the closed-loop concurrency.

    Arrival process: closed loop. Each engine keeps `concurrency` requests in the system (running plus
    waiting); a new request arrives the moment one finishes.
    """

    output: LengthDistribution
    prompt: LengthDistribution
    concurrency: int = DEFAULT_CONCURRENCY

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"workload: concurrency must be an integer ≥ 1, got {self.concurrency!r}")

    @classmethod
    def parse(cls, text: str) -> WorkloadSpec:
        """Parse "<output>/<prompt>[/closed:<concurrency>]", e.g. "geometric:256/uniform:512/closed:64".

        Raises:
            ValueError naming the part that is wrong.
        """
        parts = [p.strip() for p in text.strip().split("/")]
        if len(parts) not in (2, 3):
            raise ValueError(
                f"workload {text!r}: expected OUTPUT/PROMPT[/closed:C], e.g. geometric:256/uniform:512/closed:64"
            )
        output = parse_length_distribution(parts[0])
        prompt = parse_length_distribution(parts[1])
        concurrency = DEFAULT_CONCURRENCY
        if len(parts) == 3:
            kind, sep, body = parts[2].partition(":")
            if kind.strip().lower() != "closed" or not sep:
                raise ValueError(f"workload {text!r}: arrival must be closed:<concurrency>, got {parts[2]!r}")
            value = finite_number(body.strip(), what="closed-loop concurrency")
            if value != int(value) or value < 1:
                raise ValueError(f"closed-loop concurrency must be an integer ≥ 1, got {body.strip()!r}")
            concurrency = int(value)
        return cls(output=output, prompt=prompt, concurrency=concurrency)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """`size` requests as (prompt lengths, output lengths), int64 tokens; prompts are drawn first."""
        return self.prompt.sample(rng, size), self.output.sample(rng, size)

    def __str__(self) -> str:
        return f"{self.output}/{self.prompt}/closed:{self.concurrency}"


def parse_workload(text: str) -> WorkloadSpec:
    """Same as `WorkloadSpec.parse`."""
    return WorkloadSpec.parse(text)
