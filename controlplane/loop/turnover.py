"""`Turnover`: the running requests of the engines that entered or left a pool during one bucket.

Why: a window's life table counts a request at risk from its length when the window opened (left-truncated) to
its final length or its length when the window closed (right-censored), `core.survival`. The pool's running
requests at a bucket's close are the sum of the engines reporting then, so an engine that joins the pool inside
a window was in no opening: its requests, old ones included, would count as if started inside the window, at
risk at every age below their lengths although their short siblings finished unseen before it joined. That
biased μ̂_O high: 404, 298, 248 and 222 at 9, 14, 19 and 24 s for a law of mean 128 when four engines of one
pool joined one second apart at 100 completions/s (`benchmarks/shift_e2e.py --join-spread-s 1`). An engine that
left took its requests out of the close without their being censored. The Lexis count stays exact when a window
adds, to its opening, the first running report of each engine that entered in one of its buckets and, to its
close, the last report of each engine that left in one (the sums telescope over the buckets):

    truncated(window) = running(bucket before it) + Σ entered,    censored(window) = running(last) + Σ left.

An engine enters at its first running report in the pool (a connection, a re-admission after being judged
distinct, another replica taking it over) and leaves when its stream ends, it moves pool or is judged distinct.
The completions of the batch that carries its first report are not observations of the window (their requests
were in flight unseen); `loop.pool_stats` keeps them out of the lengths.

Pure data. Wire format (inside a v5 bucket, `loop.buckets`): a header (the two histograms' byte lengths, then
known (0/1) and byte length of each admission table), the two histograms and the two admission tables.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from controlplane.core.admitted_counts import AdmittedCounts
from controlplane.core.length_histogram import LengthHistogram

_HEADER = struct.Struct("<IIBIBI")  # entered length, left length, then known (0/1) and length of each admission table


@dataclass(frozen=True, slots=True)
class Turnover:
    """entered / left: output lengths so far of the requests running on the engines that entered the pool
    at their first report / left it at their last one, during the bucket. entered_admitted / left_admitted:
    the same by admission bucket (None: an engine did not report its running requests' admissions)."""

    entered: LengthHistogram
    left: LengthHistogram
    entered_admitted: AdmittedCounts | None = None
    left_admitted: AdmittedCounts | None = None

    @property
    def is_empty(self) -> bool:
        return self.entered.count == 0 and self.left.count == 0

    def to_bytes(self) -> bytes:
        parts = (self.entered.to_bytes(), self.left.to_bytes(),
                 self.entered_admitted.to_bytes() if self.entered_admitted is not None else b"",
                 self.left_admitted.to_bytes() if self.left_admitted is not None else b"")
        header = _HEADER.pack(len(parts[0]), len(parts[1]), int(self.entered_admitted is not None), len(parts[2]),
                              int(self.left_admitted is not None), len(parts[3]))
        return header + b"".join(parts)

    @classmethod
    def from_bytes(cls, payload: bytes) -> Turnover:
        """Raises ValueError for a payload that is not a `Turnover`."""
        if len(payload) < _HEADER.size:
            raise ValueError("not a turnover payload")
        entered_len, left_len, entered_known, entered_adm_len, left_known, left_adm_len = _HEADER.unpack_from(payload)
        sizes = (entered_len, left_len, entered_adm_len, left_adm_len)
        if max(entered_known, left_known) > 1 or _HEADER.size + sum(sizes) != len(payload):
            raise ValueError("not a turnover payload")
        parts, offset = [], _HEADER.size
        for size in sizes:
            parts.append(payload[offset:offset + size])
            offset += size
        return cls(entered=LengthHistogram.from_bytes(parts[0]), left=LengthHistogram.from_bytes(parts[1]),
                   entered_admitted=AdmittedCounts.from_bytes(parts[2]) if entered_known else None,
                   left_admitted=AdmittedCounts.from_bytes(parts[3]) if left_known else None)
