"""The hazard fit of sample arrays, through the histogram path production uses: the tests' windows are drawn as
arrays of output and prompt lengths, and the decision loop fits a pool's `LengthHistogram` of completions with
the count and sum of its prompt lengths (`controlplane.core.hazard.fit_hazard_histogram`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from controlplane.core.hazard import HazardFit, fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram, valid_length_mask


def fit_from_samples(outputs: np.ndarray | Iterable[float], prompts: np.ndarray | Iterable[float]) -> HazardFit | None:
    """`fit_hazard_histogram` over the valid entries (finite, integral, ≥ 1) of `outputs` and `prompts`, as a
    pool's buckets only ever hold valid lengths; None when either holds no valid entry."""
    prompt_array = np.asarray(prompts, dtype=np.float64).ravel()
    valid_prompts = prompt_array[valid_length_mask(prompt_array)]
    return fit_hazard_histogram(LengthHistogram.from_samples(outputs), prompt_count=int(valid_prompts.size),
                                prompt_sum_tokens=float(valid_prompts.sum()))
