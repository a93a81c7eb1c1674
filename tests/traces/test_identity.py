"""The data identity's compiled loop against its numpy definition."""

import numpy as np
import polars as pl
import pytest

from svt.traces.identity import data_identity


def _frame(n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, n).astype(np.float64)
    label[rng.random(n) < 0.3] = np.nan
    q = rng.random(n).astype(np.float32)
    entropy = rng.random(n).astype(np.float32) * 3
    entropy[rng.random(n) < 0.05] = np.nan  # a NaN is 0 in the sketch, its own bits in the hash
    return pl.DataFrame({
        "request": rng.integers(0, 50, n).astype(np.int64), "step": rng.integers(0, 200, n).astype(np.int32),
        "position": rng.integers(-1, 8, n).astype(np.int16), "token": rng.integers(0, 50_000, n).astype(np.uint32),
        "label": pl.Series(label).fill_nan(None).cast(pl.Int8), "q_max": q,
        "q_sampled": pl.Series(rng.random(n)).set(pl.Series(rng.random(n) < 0.1), None),
        "q_entropy": entropy,
    })


# every column (read where it is), the structure alone (the same), and too few structure columns (copied)
@pytest.mark.parametrize("cols", [None, ["request", "step", "position", "token", "label"],
                                  ["request", "position", "q_max", "q_entropy"]])
def test_compiled_identity_is_the_numpy_definition(cols):
    frame = _frame(3000, 0)
    if cols:
        frame = frame.select(cols)
    parts = [frame.slice(0, 1000), frame.slice(1000, 2000).lazy()]
    fast, ref = data_identity(parts), data_identity(parts, compiled=False)
    assert fast["sha256"] == ref["sha256"]
    assert fast["structure_sha256"] == ref["structure_sha256"]
    assert fast["rows"] == ref["rows"] == 3000
    assert set(fast["score_sketch"]) == set(ref["score_sketch"])
    for c, v in ref["score_sketch"].items():
        np.testing.assert_allclose(fast["score_sketch"][c], v, rtol=1e-12, atol=1e-9)
    assert data_identity(frame.sample(fraction=1.0, shuffle=True, seed=1))["sha256"] == ref["sha256"]
    other = frame.with_columns(pl.col("position").reverse())  # one column changed: another hash
    assert data_identity(other)["sha256"] != ref["sha256"]


@pytest.mark.parametrize("column", ["decode_pos", "draft_len", "match_len", "oracle_accepted", "model_accepted"])
def test_a_cache_drafts_identity_sees_each_fact_a_yield_fit_reads(greedy_run, column):
    """A yield fit's training identity is of the cache drafts it read: one row's position, length or
    either source's yield changed (request ids and row count kept) is other data."""
    from svt.traces.io import open_run

    frame = open_run(greedy_run, deep=False).scan("cache_drafts").collect()
    changed = frame.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.col(column) + 1)
                                 .otherwise(pl.col(column)).cast(frame.schema[column]).alias(column))
    a, b = data_identity(frame, table="cache_drafts"), data_identity(changed, table="cache_drafts")
    assert a["rows"] == b["rows"] == frame.height > 0
    assert a["structure_sha256"] != b["structure_sha256"]
    assert data_identity(frame, table="cache_drafts", compiled=False)["sha256"] == a["sha256"]
