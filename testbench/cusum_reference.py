"""The CUSUM of `core.change_detection.ShiftDetector` written as its recursion, one sample at a time: the
reference the vectorised scan is tested against (`tests/unit/test_change_detection.py`) and measured against
(`benchmarks/pool_second.py`)."""

from __future__ import annotations

import numpy as np

from controlplane.core.change_detection import ShiftDetector, ShiftEvent, _jitter


class RecursionDetector(ShiftDetector):
    """`ShiftDetector` with S⁺ = max(0, S⁺ + z − k), S⁻ = max(0, S⁻ − z − k) evaluated per sample in Python."""

    def _scan(self, samples: np.ndarray) -> tuple[int, ShiftEvent] | None:
        scores = self._reference.scores(samples, jitter=_jitter(self._num_samples + self._jitter_shift, samples.size))
        up, down, k, h = self._up, self._down, self.drift, self.threshold
        for offset, z in enumerate(scores.tolist()):
            index = self._num_samples
            self._num_samples += 1
            self._history.append(int(samples[offset]))
            up, down = max(0.0, up + z - k), max(0.0, down - z - k)
            if up == 0.0:
                self._last_zero_up = index
            if down == 0.0:
                self._last_zero_down = index
            if up > h or down > h:
                self._up, self._down = up, down
                self._age_pending(samples[: offset + 1])
                return offset + 1, self._alarm(index, direction=1 if up > h else -1)
        self._up, self._down = up, down
        self._age_pending(samples)
        return None
