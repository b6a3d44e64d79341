"""Latency sketches: the 1% quantile bound, exact merging and subtraction, clamping and rejection, and a wire
format that rejects hostile bytes with ValueError only."""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core import latency_accumulator
from controlplane.core.latency_accumulator import FOLD_ROWS, LatencyAccumulator
from controlplane.core.latency_sketch import (
    GAMMA,
    MAX_COUNT,
    MAX_ENTRIES,
    MAX_INDEX,
    MAX_S,
    MIN_INDEX,
    MIN_S,
    RELATIVE_ACCURACY,
    LatencySketch,
    bucket_indices,
    representative_s,
    sum_of,
)

# float64 rounding of ln(x)/ln(γ) may put a value one ulp past a bucket edge: a few 1e-16 relative.
_BOUND = RELATIVE_ACCURACY * (1.0 + 1e-9)
_HEADER_SIZE = 22
_QS = np.concatenate(([0.0, 1.0, 0.5, 0.9, 0.99, 0.999, 1e-9, 1.0 - 1e-9], np.linspace(0.0, 1.0, 101)))

# Log-uniform over [MIN_S, MAX_S] (eight and a half decades), the edges themselves, and heavy ties.
_log_uniform = st.floats(math.log(MIN_S), math.log(MAX_S)).map(lambda u: min(max(math.exp(u), MIN_S), MAX_S))
_in_range = st.one_of(_log_uniform, st.sampled_from([MIN_S, MAX_S, 1.0, 0.25]),
                      st.floats(MIN_S, MAX_S, allow_nan=False))
_any_latency = st.one_of(_in_range, st.floats(0.0, MIN_S), st.floats(MAX_S, 1e9))
_samples = st.lists(_in_range, min_size=1, max_size=300)
_latencies = st.lists(_any_latency, max_size=120)


def _sketch(values: list[float]) -> LatencySketch:
    return LatencySketch.from_values(np.array(values, dtype=np.float64))


def _order_statistic(values: np.ndarray, q: float) -> float:
    return float(np.sort(values)[math.floor(q * (values.size - 1))])


# ------------------------------------------------------------------------------------------ buckets


def test_bucket_layout_matches_the_contract() -> None:
    assert math.isclose(GAMMA, 1.01 / 0.99, rel_tol=1e-15)
    assert (MIN_INDEX, MAX_INDEX, MAX_ENTRIES) == (-460, 410, 871)
    assert bucket_indices(np.array([MIN_S, MAX_S, 1.0, GAMMA, GAMMA * 1.0001])).tolist() == [-460, 410, 0, 1, 2]
    assert representative_s(np.array([MIN_INDEX, MAX_INDEX])).tolist() == [MIN_S, MAX_S]
    assert representative_s(np.array([0]))[0] == pytest.approx(2.0 / (GAMMA + 1.0), rel=1e-15)


def test_every_value_in_range_is_within_one_percent_of_its_representative() -> None:
    values = np.concatenate((np.geomspace(MIN_S, MAX_S, 200_001), GAMMA ** np.arange(MIN_INDEX, MAX_INDEX),
                             np.nextafter(GAMMA ** np.arange(MIN_INDEX, MAX_INDEX), np.inf)))
    values = values[(values >= MIN_S) & (values <= MAX_S)]
    error = np.abs(representative_s(bucket_indices(values)) - values) / values
    assert float(error.max()) <= _BOUND
    assert float(error.max()) > 0.99 * RELATIVE_ACCURACY  # the bound is tight, not loose


# ---------------------------------------------------------------------------------------- quantiles


@settings(max_examples=150, deadline=None)
@given(_samples, st.lists(st.floats(0.0, 1.0), max_size=5))
def test_quantile_is_within_one_percent_of_the_exact_order_statistic(values: list[float], qs: list[float]) -> None:
    data = np.array(values, dtype=np.float64)
    sketch = LatencySketch.from_values(data)
    levels = np.concatenate((_QS, qs))
    estimates = sketch.quantiles(levels)
    for q, estimate in zip(levels.tolist(), estimates.tolist(), strict=True):
        exact = _order_statistic(data, q)
        assert abs(estimate - exact) <= _BOUND * exact, (q, estimate, exact)
        assert sketch.quantile(q) == estimate


def test_quantile_bound_holds_on_a_large_sample_across_all_decades() -> None:
    rng = np.random.default_rng(7)
    data = np.exp(rng.uniform(math.log(MIN_S), math.log(MAX_S), 50_000))
    data = np.concatenate((data, np.repeat(rng.choice(data, 50), 200)))
    estimates = LatencySketch.from_values(data).quantiles(_QS)
    exact = np.sort(data)[np.floor(_QS * (data.size - 1)).astype(np.int64)]
    assert float(np.max(np.abs(estimates - exact) / exact)) <= _BOUND


def test_quantiles_keep_the_shape_of_their_argument() -> None:
    sketch = _sketch([0.1, 0.2, 0.3])
    assert sketch.quantiles(np.full((2, 3), 0.5)).shape == (2, 3)
    assert sketch.quantiles([]).shape == (0,)
    assert sketch.quantiles([0.0, 1.0]).tolist() == [sketch.quantile(0.0), sketch.quantile(1.0)]


def test_empty_sketch() -> None:
    empty = LatencySketch()
    assert empty.count == 0 and empty.num_clamped == 0 and empty.sum_s == 0.0 and empty.num_entries == 0
    assert math.isnan(empty.quantile(0.5)) and math.isnan(empty.mean_s)
    assert np.isnan(empty.quantiles([0.0, 0.5, 1.0])).all()
    assert len(empty.to_bytes()) == _HEADER_SIZE
    assert repr(empty) == "LatencySketch(count=0)"


@pytest.mark.parametrize("q", [-0.01, 1.01, math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("values", [[], [0.5]])
def test_quantile_outside_zero_one_raises(q: float, values: list[float]) -> None:
    sketch = _sketch(values)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        sketch.quantile(q)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        sketch.quantiles([0.5, q])


# ------------------------------------------------------------------------- adding, clamping, rejecting


def test_out_of_range_values_are_clamped_to_the_edges() -> None:
    sketch = _sketch([0.0, 1e-7, MIN_S, 0.5, MAX_S, 7200.0, 1e12])
    assert sketch.count == 7 and sketch.num_clamped == 4
    assert sketch.quantile(0.0) == MIN_S and sketch.quantile(1.0) == MAX_S
    assert sketch.quantiles([0.0, 1 / 6, 2 / 6, 4 / 6, 5 / 6]).tolist() == [MIN_S, MIN_S, MIN_S, MAX_S, MAX_S]
    assert sketch.sum_s == math.fsum([MIN_S, MIN_S, MIN_S, 0.5, MAX_S, MAX_S, MAX_S])
    indices, counts = sketch.buckets()
    assert indices.tolist() == [MIN_INDEX, int(bucket_indices(np.array([0.5]))[0]), MAX_INDEX]
    assert counts.tolist() == [3, 1, 3]


def test_negative_and_non_finite_values_are_rejected_and_counted() -> None:
    sketch = LatencySketch()
    rejected = sketch.add_many(np.array([math.nan, -1.0, 0.2, math.inf, -math.inf, -1e-300, 0.3]))
    assert rejected == 5
    assert sketch == _sketch([0.2, 0.3])
    assert sketch.add_many(np.array([math.nan, 0.2, -3.0]), np.array([4, 2, 7])) == 11
    assert sketch == _sketch([0.2, 0.3, 0.2, 0.2])
    assert sketch.add_many(np.array([math.nan, math.nan])) == 2 and sketch.count == 4


@pytest.mark.parametrize(("value", "shown"), [(math.nan, "nan"), (-0.5, "-0.5"), (math.inf, "inf"),
                                              (-math.inf, "-inf")])
def test_add_raises_naming_the_value(value: float, shown: str) -> None:
    sketch = _sketch([0.1])
    with pytest.raises(ValueError, match=f"got {shown}$"):
        sketch.add(value)
    assert sketch == _sketch([0.1])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(_any_latency, st.integers(0, 6)), max_size=40))
def test_add_many_with_counts_equals_repeated_adds(pairs: list[tuple[float, int]]) -> None:
    weighted = LatencySketch()
    assert weighted.add_many(np.array([v for v, _ in pairs]), np.array([c for _, c in pairs], dtype=np.int64)) == 0
    repeated = LatencySketch()
    for value, times in pairs:
        for _ in range(times):
            repeated.add(value)
    assert weighted == repeated
    assert weighted.buckets()[1].tolist() == repeated.buckets()[1].tolist()


@settings(max_examples=80, deadline=None)
@given(_latencies)
def test_sum_is_the_correctly_rounded_sum_of_the_clamped_values(values: list[float]) -> None:
    sketch = _sketch(values)
    clamped = np.clip(np.array(values, dtype=np.float64), MIN_S, MAX_S)
    exact_sum = sum((Fraction(v) for v in clamped.tolist()), Fraction(0))
    assert sketch.sum_s == math.fsum(clamped) == float(exact_sum)
    assert sketch.count == len(values)
    assert sketch.num_clamped == int(np.count_nonzero(clamped != np.array(values, dtype=np.float64)))
    if values:
        assert sketch.mean_s == float(exact_sum / len(values))


def test_huge_counts_keep_the_sum_exact() -> None:
    values = np.array([0.1, MIN_S, 3599.999, 0.7])
    counts = np.array([2**40, 3, 2**45, 1])
    sketch = LatencySketch.from_values(values, counts)
    assert sketch.count == int(counts.sum())
    assert sketch.sum_s == float(sum(Fraction(float(v)) * int(c) for v, c in zip(values, counts, strict=True)))


@pytest.mark.parametrize(("counts", "match"), [
    (np.array([1, 2, 3]), "2 values but 3 counts"),
    (np.array([1, -1]), "integers in"),
    (np.array([1.5, 1.0]), "integers in"),
    (np.array([math.nan, 1.0]), "integers in"),
    (np.array([2.0**60, 1.0]), "integers in"),
    (np.array([2**53, 2**53]), "add up to more than"),
    (np.array(["a", "b"]), "must be integers"),
])
def test_add_many_rejects_bad_counts(counts: np.ndarray, match: str) -> None:
    sketch = _sketch([0.4])
    with pytest.raises(ValueError, match=match):
        sketch.add_many(np.array([0.1, 0.2]), counts)
    assert sketch == _sketch([0.4])


def test_the_total_count_is_capped() -> None:
    full = LatencySketch.from_values(np.array([0.1]), np.array([MAX_COUNT]))
    before = full.to_bytes()
    with pytest.raises(ValueError, match="2\\*\\*53"):
        full.add(0.2)
    with pytest.raises(ValueError, match="2\\*\\*53"):
        full.merge(_sketch([0.2]))
    with pytest.raises(ValueError, match="2\\*\\*53"):
        sum_of([full, _sketch([0.2])])
    assert full.to_bytes() == before


# ---------------------------------------------------------------------------- merging and subtracting


@settings(max_examples=80, deadline=None)
@given(st.lists(_latencies, max_size=5))
def test_merge_equals_the_sketch_of_the_concatenation(parts: list[list[float]]) -> None:
    merged = LatencySketch()
    for part in parts:
        merged.merge(_sketch(part))
    direct = _sketch([v for part in parts for v in part])
    assert merged == direct
    assert merged.buckets()[0].tolist() == direct.buckets()[0].tolist()
    assert merged.buckets()[1].tolist() == direct.buckets()[1].tolist()
    assert np.array_equal(merged.quantiles(_QS), direct.quantiles(_QS), equal_nan=True)
    assert sum_of(_sketch(part) for part in parts) == direct


@settings(max_examples=60, deadline=None)
@given(_latencies, _latencies, _latencies)
def test_merge_is_commutative_and_associative(a: list[float], b: list[float], c: list[float]) -> None:
    ab, ba = _sketch(a), _sketch(b)
    ab.merge(_sketch(b))
    ba.merge(_sketch(a))
    assert ab == ba
    left = ab.copy()
    left.merge(_sketch(c))
    bc = _sketch(b)
    bc.merge(_sketch(c))
    right = _sketch(a)
    right.merge(bc)
    assert left == right


@settings(max_examples=60, deadline=None)
@given(_latencies, _latencies)
def test_subtract_undoes_merge(a: list[float], b: list[float]) -> None:
    sketch, other = _sketch(a), _sketch(b)
    sketch.merge(other)
    sketch.subtract(other)
    assert sketch == _sketch(a)
    sketch.subtract(_sketch(a))
    assert sketch == LatencySketch() and sketch.num_entries == 0


@settings(max_examples=60, deadline=None)
@given(_latencies, st.lists(_any_latency, min_size=1, max_size=20))
def test_subtracting_more_than_is_held_raises_and_changes_nothing(held: list[float], extra: list[float]) -> None:
    sketch = _sketch(held)
    before = sketch.to_bytes()
    with pytest.raises(ValueError, match="cannot subtract"):
        sketch.subtract(_sketch(held + extra))
    assert sketch.to_bytes() == before and sketch == _sketch(held)


@pytest.mark.parametrize(("held", "removed", "match"), [
    ([MIN_S], [0.0], "clamped values"),  # same bucket and sum, but the removed value was clamped
    ([MIN_S, MIN_S], [MIN_S * 1.005], "sum"),  # would leave one value below MIN_S
    ([0.5], [0.6], "bucket"),
])
def test_subtract_rejects_what_was_never_merged(held: list[float], removed: list[float], match: str) -> None:
    sketch = _sketch(held)
    with pytest.raises(ValueError, match=match):
        sketch.subtract(_sketch(removed))
    assert sketch == _sketch(held)


def test_a_sliding_window_total_equals_the_sum_of_its_seconds() -> None:
    rng = np.random.default_rng(3)
    seconds = [LatencySketch.from_values(rng.lognormal(-2.0, 1.5, int(rng.integers(0, 150)))) for _ in range(120)]
    window, width = LatencySketch(), 30
    for now, second in enumerate(seconds):
        window.merge(second)
        if now >= width:
            window.subtract(seconds[now - width])
        assert window == sum_of(seconds[max(0, now - width + 1):now + 1])


def test_copy_is_independent() -> None:
    original = _sketch([0.1, 0.2])
    twin = original.copy()
    twin.add(5.0)
    twin.merge(_sketch([0.1]))
    assert original == _sketch([0.1, 0.2]) and twin != original
    assert twin.count == 4


# -------------------------------------------------------------------------------------- wire format

_sketches = st.builds(lambda values, wide: _widened(_sketch(values), wide), _latencies, st.booleans())


def _widened(sketch: LatencySketch, wide: bool) -> LatencySketch:
    if wide:
        sketch.add_many(np.array([0.05]), np.array([2**33]))
    return sketch


@settings(max_examples=80, deadline=None)
@given(_sketches)
def test_bytes_round_trip(sketch: LatencySketch) -> None:
    data = sketch.to_bytes()
    back = LatencySketch.from_bytes(data)
    assert back == sketch
    assert back.to_bytes() == data
    width = 8 if sketch.count > 2**32 else 4
    assert len(data) == _HEADER_SIZE + sketch.num_entries * (2 + width)
    assert LatencySketch.from_bytes(bytearray(data)) == sketch == LatencySketch.from_bytes(memoryview(data))


def test_a_decoded_sketch_still_subtracts_what_it_merged() -> None:
    # n·MIN_S and n·MAX_S round below the exact sum for some n: the decoded sum must stay a valid one.
    rounded_down = [(edge, n) for edge in (MIN_S, MAX_S) for n in range(1, 41)
                    if Fraction(float(Fraction(edge) * n)) < Fraction(edge) * n]
    assert rounded_down
    other = _sketch([0.1, 0.3, 7.0])
    for edge, n in rounded_down:
        decoded = LatencySketch.from_bytes(_sketch([edge] * n).to_bytes())
        window = decoded.copy()
        window.merge(other)
        window.subtract(other)
        assert window == decoded
        window.subtract(decoded)
        assert window == LatencySketch()


def test_subtract_names_the_bucket_that_holds_too_little() -> None:
    sketch = _sketch([0.5, 0.5, 2.0])
    with pytest.raises(ValueError, match=r"cannot subtract 3 values from bucket -?\d+, which holds 2$"):
        sketch.subtract(_sketch([0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match=r"cannot subtract values from bucket -?\d+, which holds none$"):
        sketch.subtract(_sketch([0.7]))
    assert sketch == _sketch([0.5, 0.5, 2.0])


def _decodes_or_raises_value_error(data: bytes) -> None:
    try:
        sketch = LatencySketch.from_bytes(data)
    except ValueError:
        return
    assert LatencySketch.from_bytes(sketch.to_bytes()) == sketch
    sketch.quantiles(_QS)


@st.composite
def _well_framed(draw: st.DrawFn) -> bytes:
    """A header with the right magic and a body of the announced size; every field otherwise random."""
    flags, num_entries = draw(st.sampled_from([0, 1])), draw(st.integers(0, 12))
    header = struct.pack("<3sBHQd", b"LS1", flags, num_entries, draw(st.integers(0, 2**64 - 1)),
                         draw(st.floats(allow_nan=True, allow_infinity=True)))
    body = draw(st.binary(min_size=num_entries * (10 if flags else 6), max_size=num_entries * (10 if flags else 6)))
    return header + body


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.binary(max_size=200).map(lambda b: b"LS1" + b), _well_framed()))
def test_random_bytes_raise_value_error_only(data: bytes) -> None:
    _decodes_or_raises_value_error(data)


@settings(max_examples=300, deadline=None)
@given(_sketches, st.data())
def test_mutated_encodings_raise_value_error_only(sketch: LatencySketch, data: st.DataObject) -> None:
    raw = bytearray(sketch.to_bytes())
    kind = data.draw(st.sampled_from(["flip", "set", "truncate", "extend", "delete", "insert"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    if kind == "flip":
        raw[at] ^= 1 << data.draw(st.integers(0, 7))
    elif kind == "set":
        raw[at] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        del raw[at:]
    elif kind == "extend":
        raw += data.draw(st.binary(min_size=1, max_size=16))
    elif kind == "delete":
        del raw[at:at + data.draw(st.integers(1, 8))]
    else:
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    _decodes_or_raises_value_error(bytes(raw))


def _encoding(indices: list[int], counts: list[int], *, num_clamped: int = 0, sum_s: float | None = None,
              flags: int = 0, magic: bytes = b"LS1", num_entries: int | None = None) -> bytes:
    total = sum(counts)
    header = struct.pack("<3sBHQd", magic, flags, len(indices) if num_entries is None else num_entries,
                         num_clamped, float(total) if sum_s is None else sum_s)
    width = "<u8" if flags & 1 else "<u4"
    return header + np.array(indices, dtype="<i2").tobytes() + np.array(counts, dtype=width).tobytes()


def test_the_encoding_helper_matches_to_bytes() -> None:
    assert _encoding([0, 2], [3, 1], sum_s=0.5 * 3 + GAMMA**2) == LatencySketch.from_bytes(
        _encoding([0, 2], [3, 1], sum_s=0.5 * 3 + GAMMA**2)).to_bytes()
    assert LatencySketch.from_bytes(_encoding([0], [2], sum_s=2.0)).count == 2


@pytest.mark.parametrize(("data", "match"), [
    ("not bytes", "expected bytes"),
    (b"LS1\0", "shorter than the 22-byte header"),
    (_encoding([0], [1], magic=b"LS2"), "bad magic"),
    (_encoding([0], [1], flags=0x02), "unknown flags"),
    (_encoding([], [], num_entries=MAX_ENTRIES + 1), "at most 871 exist"),
    (_encoding([0], [1])[:-1], "the header announces 1 buckets"),
    (_encoding([0], [1]) + b"\0", "the header announces 1 buckets"),
    (_encoding([MIN_INDEX - 1], [1], sum_s=MIN_S), r"must lie in \[-460, 410\]"),
    (_encoding([MAX_INDEX + 1], [1], sum_s=MAX_S), r"must lie in \[-460, 410\]"),
    (_encoding([3, 2], [1, 1], sum_s=2.0), "strictly increasing"),
    (_encoding([2, 2], [1, 1], sum_s=2.0), "strictly increasing"),
    (_encoding([0], [0], sum_s=0.0), "counts must be ≥ 1"),
    (_encoding([0], [2**53 + 1], flags=1), "exceeds 2\\*\\*53"),
    (_encoding([0, 1], [2**52 + 2**51, 2**52], flags=1, sum_s=2.0**53), "total count .* exceeds 2\\*\\*53"),
    (_encoding([0], [1], num_clamped=1), "1 clamped values but the edge buckets hold 0"),
    (_encoding([0], [1], sum_s=math.nan), "must be finite"),
    (_encoding([0], [1], sum_s=math.inf), "must be finite"),
    (_encoding([0], [1], sum_s=-1.0), "outside"),
    (_encoding([0], [2], sum_s=MIN_S), "outside"),
    (_encoding([0], [2], sum_s=2 * MAX_S + 1.0), "outside"),
    (_encoding([], [], sum_s=1.0), "outside"),
])
def test_from_bytes_names_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LatencySketch.from_bytes(data)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ identity


def test_equality_hash_and_repr() -> None:
    sketch = _sketch([0.1, 0.2, 30.0])
    assert sketch == _sketch([30.0, 0.2, 0.1])
    assert sketch != _sketch([0.1, 0.2])
    assert sketch != _sketch([0.1, 0.2, 30.01])  # same buckets, another sum
    assert sketch != "sketch"
    with pytest.raises(TypeError):
        hash(sketch)
    text = repr(sketch)
    assert text.startswith("LatencySketch(count=3, ") and len(text) < 110


# --------------------------------------------------------------------------------- accumulating batches

_junk = st.sampled_from([math.nan, -1.0, math.inf, -math.inf, -1e-300])
_batch = st.lists(st.lists(st.one_of(_any_latency, _junk), max_size=40), min_size=3, max_size=3)


def _assert_exactly(built: LatencySketch, values: list[float]) -> None:
    """`built` is `from_values(values)`: equal, and subtracting that sketch leaves nothing (the exact sums agree
    to the 2⁻⁶⁶ s unit, not only after rounding to float)."""
    direct = LatencySketch.from_values(np.array(values, dtype=np.float64))
    assert built == direct
    rest = built.copy()
    rest.subtract(direct)
    assert rest == LatencySketch()


def _accumulate(batches: list[list[np.ndarray]]) -> tuple[LatencyAccumulator, list[tuple[int, float]]]:
    """An accumulator of three sketches fed `batches`, and its rows as (sketch, value)."""
    accumulator = LatencyAccumulator(3)
    rows: list[tuple[int, float]] = []
    for batch in batches:
        start, end = accumulator.append(*batch)
        assert (start, end) == (len(rows), len(rows) + sum(column.size for column in batch))
        rows += [(k, value) for k, column in enumerate(batch) for value in column.tolist()]
    return accumulator, rows


def _assert_sketches_without(accumulator: LatencyAccumulator, rows: list[tuple[int, float]],
                             drop: list[int]) -> None:
    built = accumulator.sketches(np.array(drop, dtype=np.int64))
    left_out = set(drop)
    for k, sketch in enumerate(built):
        _assert_exactly(sketch, [value for row, (kind, value) in enumerate(rows) if kind == k and row not in left_out])


@pytest.mark.parametrize("fold_rows", [FOLD_ROWS, 1, 37])
@settings(max_examples=40, deadline=None)
@given(batches=st.lists(_batch, max_size=30), data=st.data())
def test_an_accumulator_builds_what_from_values_builds(fold_rows: int, batches: list[list[list[float]]],
                                                       data: st.DataObject) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(latency_accumulator, "FOLD_ROWS", fold_rows)  # folds after every batch, or now and then
        accumulator, rows = _accumulate([[np.array(column, dtype=np.float64) for column in batch]
                                         for batch in batches])
    drop = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=len(rows)) if rows else st.just([]))
    _assert_sketches_without(accumulator, rows, drop)
    _assert_sketches_without(accumulator, rows, [])  # asked again, without leaving anything out
    assert accumulator.num_rejected == sum(not (math.isfinite(value) and value >= 0.0) for _, value in rows)


def test_an_accumulator_stays_exact_across_folds_and_large_batches() -> None:
    """Tens of folds, a batch past the float64-exact running sums (2¹⁴ rows of values near an hour: their sum
    in 2⁻⁶⁶ s units passes 2⁵³ in float64), rows left out both folded and still waiting."""
    rng = np.random.default_rng(11)
    batches = [[rng.lognormal(math.log(0.3), 1.0, int(rng.integers(0, 300))) for _ in range(3)] for _ in range(400)]
    batches.insert(150, [rng.uniform(3000.0, MAX_S, 30_000), np.zeros(0), rng.exponential(1e-4, 20_000)])
    accumulator, rows = _accumulate(batches)
    assert len(rows) > 20 * FOLD_ROWS
    drop = rng.choice(len(rows), size=len(rows) // 3, replace=False)
    _assert_sketches_without(accumulator, rows, [*drop.tolist(), len(rows) - 1, len(rows) - 1])


def test_an_accumulator_sums_beyond_int64_exactly() -> None:
    """A fold whose running sums would pass int64 sums over Python integers (the bound lowered to reach it)."""
    values = np.random.default_rng(12).uniform(3000.0, MAX_S, 50_000)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(latency_accumulator, "_EXACT_INT_ROWS", 40_000)
        accumulator, rows = _accumulate([[values, values[:10], np.zeros(0)]])
        _assert_sketches_without(accumulator, rows, [3, 50_004])


def test_an_empty_accumulator_and_bad_arguments() -> None:
    accumulator = LatencyAccumulator(2)
    assert accumulator.sketches() == (LatencySketch(), LatencySketch())
    assert accumulator.append(np.zeros(0), np.zeros(0)) == (0, 0)
    assert accumulator.sketches() == (LatencySketch(), LatencySketch()) and accumulator.size == 0
    with pytest.raises(ValueError, match="at least one sketch"):
        LatencyAccumulator(0)
    with pytest.raises(ValueError, match="2 columns expected, got 3"):
        accumulator.append(np.ones(2), np.ones(2), np.ones(2))
    assert accumulator.size == 0
    accumulator.append(np.array([0.1, 0.2]), np.array([0.3]))
    for rows in ([-1], [3], [0, 3]):
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
            accumulator.sketches(np.array(rows))
    _assert_exactly(accumulator.sketches(np.array([1]))[0], [0.1])
