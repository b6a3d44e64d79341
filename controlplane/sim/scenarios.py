"""Named scenarios of the twin (the papers' experiments) and a compact spelling for custom ones.

Spellings (`parse_scenario`):
  closed:<shape>:c=<C>[:n=<N>]         closed loop, concurrency C, N requests (default 4000)
  poisson:<shape>:rate=<R>:for=<S>     open-loop Poisson, R req/s for S seconds
  bursty:<shape>:burst=<R>             the P-PAS trace: 10 s phases, steady 0.2 req/s, bursts at R req/s
  dist-shift                           [EB] Table 3: μ_L 1024→512→128, μ_O 128→512→1024, 2k requests
                                       per phase, c = 2048
  conc-shift                           [EB] §4.4: c 32→512→1024→256→2048; μ_L 512, μ_O 256 taken from
                                       [EB] Table 3's stationary blocks (the shift's lengths are not given),
                                       1,500 requests per phase (the paper does not give the phase sizes)
<shape> is a key of `controlplane.sim.lengths.DATASET_SHAPES` (decode-heavy, balanced, prefill-heavy, their
geometric-output forms geometric-decode-heavy etc., sharegpt, longbench, numinamath, wildchat,
ppas-long-context) or uniform-<μ_L>-<μ_O> (the EB paper's
synthetic form, lengths uniform on 0.5–1.5× the mean) or a pair of distributions "<prompt>,<output>" in
the `parse_length_distribution` spelling (e.g. "fixed:25000,fixed:32", "uniform:512,geometric:256").

`resize` sets a scenario's size from outside its spelling (`controlplane sim run --requests N` for a closed
loop, `--duration-s S` for an open loop).

Given the engine's max_model_len (`parse_scenario(..., max_model_len_tokens=...)` or `check_fits`), a scenario
whose prompts can reach it is refused when it is built, with the prompt length and the limit in the message:
vLLM refuses a prompt of max_model_len tokens or more (an output that would pass the limit is cut there, as
vLLM's length stop does). Pure; raises ValueError naming the problem.
"""

from __future__ import annotations

import math
from dataclasses import replace

from controlplane.sim.arrivals import Phase, Workload, bursty, closed_loop, poisson
from controlplane.sim.lengths import (
    DATASET_SHAPES,
    LengthShape,
    parse_length_distribution,
    synthetic_shape,
    upper_bound_tokens,
)

DEFAULT_NUM_REQUESTS = 4000
CONC_SHIFT_LEVELS = (32, 512, 1024, 256, 2048)
CONC_SHIFT_REQUESTS_PER_PHASE = 1500
DIST_SHIFT_REQUESTS_PER_PHASE = 2000


def parse_shape(text: str) -> LengthShape:
    """A named shape, uniform-<μ_L>-<μ_O>, or "<prompt dist>,<output dist>"."""
    text = text.strip()
    if text in DATASET_SHAPES:
        return DATASET_SHAPES[text]
    if text.startswith("uniform-"):
        parts = text.split("-")[1:]
        if len(parts) == 2 and all(p.isdigit() and int(p) >= 1 for p in parts):
            return synthetic_shape(int(parts[0]), int(parts[1]))
    if "," in text:
        prompt, _, output = text.partition(",")
        return LengthShape(text, parse_length_distribution(prompt), parse_length_distribution(output), "custom")
    raise ValueError(f"unknown length shape {text!r}; known: {', '.join(DATASET_SHAPES)}, uniform-<L>-<O>, "
                     "or <prompt>,<output>")


def distribution_shift() -> Workload:
    phases = tuple(Phase(synthetic_shape(mu_l, mu_o), num_requests=DIST_SHIFT_REQUESTS_PER_PHASE, concurrency=2048)
                   for mu_l, mu_o in ((1024, 128), (512, 512), (128, 1024)))
    return Workload("dist-shift", phases)


def concurrency_shift() -> Workload:
    shape = synthetic_shape(512, 256)
    phases = tuple(Phase(shape, num_requests=CONC_SHIFT_REQUESTS_PER_PHASE, concurrency=c) for c in CONC_SHIFT_LEVELS)
    return Workload("conc-shift", phases)


def _params(parts: list[str], allowed: tuple[str, ...], text: str) -> dict[str, float]:
    params: dict[str, float] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"scenario {text!r}: expected {', '.join(k + '=…' for k in allowed)}, got {part!r}")
        try:
            params[key] = float(value)
        except ValueError:
            raise ValueError(f"scenario {text!r}: {key} must be a number") from None
    return params


def longest_prompt_tokens(shape: LengthShape) -> int | None:
    """The longest prompt `shape` draws (shared prefix included; a tail of probability < 1e-9 left out for
    unbounded distributions); None when a distribution's bound is unknown."""
    prompt = upper_bound_tokens(shape.prompt)
    prefix = upper_bound_tokens(shape.shared_prefix) if shape.shared_prefix is not None else 0
    return None if prompt is None or prefix is None else prompt + prefix


def check_fits(workload: Workload, *, max_model_len_tokens: int, profile_name: str = "") -> Workload:
    """`workload` itself when every prompt it can draw is shorter than `max_model_len_tokens`.

    Raises:
        ValueError: a phase draws prompts of max_model_len tokens or more, naming the shape, the longest prompt
            and the limit.
    """
    where = f" of profile {profile_name}" if profile_name else ""
    for phase in workload.phases:
        longest = longest_prompt_tokens(phase.shape)
        if longest is not None and longest >= max_model_len_tokens:
            raise ValueError(
                f"scenario {workload.name}: shape {phase.shape.name} draws prompts of up to {longest} tokens, "
                f"which do not fit max_model_len {max_model_len_tokens}{where} (vLLM refuses prompts of "
                f"max_model_len tokens or more); use a shorter shape or a profile with a longer context")
    return workload


def parse_scenario(text: str, *, max_model_len_tokens: int | None = None, profile_name: str = "") -> Workload:
    """Parse a scenario spelling (see the module docstring); with `max_model_len_tokens`, refuse one whose
    prompts do not fit (`check_fits`)."""
    workload = _parse_scenario(text)
    if max_model_len_tokens is not None:
        check_fits(workload, max_model_len_tokens=max_model_len_tokens, profile_name=profile_name)
    return workload


def _parse_scenario(text: str) -> Workload:
    text = text.strip()
    if text == "dist-shift":
        return distribution_shift()
    if text == "conc-shift":
        return concurrency_shift()
    kind, _, rest = text.partition(":")
    allowed = {"closed": ("c", "n"), "poisson": ("rate", "for"), "bursty": ("burst",)}.get(kind, ())
    pieces = rest.split(":")
    split = len(pieces)
    while split > 1 and pieces[split - 1].partition("=")[0] in allowed:
        split -= 1
    # parts[0] is the shape (which may itself contain colons), the rest are key=value parameters.
    parts = [":".join(pieces[:split]), *pieces[split:]]
    if kind == "closed" and rest:
        params = _params(parts[1:], ("c", "n"), text)
        if "c" not in params:
            raise ValueError(f"scenario {text!r}: c=<concurrency> is required")
        concurrency, count = int(params["c"]), int(params.get("n", DEFAULT_NUM_REQUESTS))
        if concurrency < 1 or count < 1:
            raise ValueError(f"scenario {text!r}: c and n must be ≥ 1")
        return closed_loop(parse_shape(parts[0]), concurrency=concurrency, num_requests=count, name=text)
    if kind == "poisson" and rest:
        params = _params(parts[1:], ("rate", "for"), text)
        if set(params) != {"rate", "for"}:
            raise ValueError(f"scenario {text!r}: rate=<req/s> and for=<seconds> are required")
        return poisson(parse_shape(parts[0]), rate_per_s=params["rate"], duration_s=params["for"], name=text)
    if kind == "bursty" and rest:
        params = _params(parts[1:], ("burst",), text)
        workload = bursty(parse_shape(parts[0]), burst_rate_per_s=params["burst"])
        return Workload(text, workload.phases)
    raise ValueError(f"unknown scenario {text!r}: closed:<shape>:c=<C>[:n=<N>], poisson:<shape>:rate=<R>:for=<S>, "
                     "bursty:<shape>:burst=<R>, dist-shift, conc-shift")


def resize(workload: Workload, *, num_requests: int | None = None, duration_s: float | None = None) -> Workload:
    """`workload` with `num_requests` requests in all (closed loop: spread evenly over its phases, the earlier
    phases taking the remainder) or lasting `duration_s` simulated seconds in all (open loop: every phase
    scaled in proportion, rates unchanged); the name says the new size. None leaves that size as it is.

    Raises:
        ValueError: a size for the other kind of workload (requests of an open loop, a duration of a closed
            one), fewer requests than phases, or a duration that is not a positive finite number.
    """
    if num_requests is None and duration_s is None:
        return workload
    if num_requests is not None:
        if not workload.is_closed:
            raise ValueError(f"scenario {workload.name}: a number of requests sizes a closed-loop scenario; "
                             "this one is open-loop (give its duration instead)")
        if num_requests < len(workload.phases):
            raise ValueError(f"scenario {workload.name}: {num_requests} requests for {len(workload.phases)} "
                             "phases; each phase needs at least one")
        share, extra = divmod(num_requests, len(workload.phases))
        phases = tuple(replace(phase, num_requests=share + (i < extra)) for i, phase in enumerate(workload.phases))
        workload = Workload(f"{workload.name} n={num_requests}", phases)
    if duration_s is not None:
        if workload.is_closed:
            raise ValueError(f"scenario {workload.name}: a duration sizes an open-loop scenario; this one is "
                             "closed-loop (give its number of requests instead)")
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise ValueError(f"scenario {workload.name}: the duration must be a positive number of seconds, "
                             f"got {duration_s}")
        total_s = sum(phase.duration_s for phase in workload.phases)
        phases = tuple(replace(phase, duration_s=phase.duration_s * duration_s / total_s)
                       for phase in workload.phases)
        workload = Workload(f"{workload.name} for={duration_s:g}s", phases)
    return workload
