"""The online fit read shard by shard (`replay_arrays`) against the in-memory path."""

import numpy as np
import polars as pl
import pytest

from svt.fit import fit_runs, load_drafts_for_fit, replay_arrays
from svt.fit.irls_online import IRLSOnlineFitter
from svt.traces.synthetic import write_run


@pytest.fixture(scope="module")
def synthetic(small_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic-fit") / "syn"
    return write_run(small_run, out, 30_000, shard_labelled=7_000, steps_per_request=20, seed=5)


@pytest.mark.parametrize("which", ["collected", "synthetic"])
def test_replay_arrays_equal_the_sorted_in_memory_drafts(which, small_run, synthetic):
    run = small_run if which == "collected" else synthetic
    got = replay_arrays([run], "logit_qmax")
    assert got is not None, "the shards are in replay order"
    arrays, _, k = got
    drafts, _ = load_drafts_for_fit([run])
    lab = drafts.filter(pl.col("label").is_not_null())
    assert k == int(drafts["position"].max()) + 1
    assert np.array_equal(arrays["decode_step"], lab["decode_step"].to_numpy())
    assert np.array_equal(arrays["position"], lab["position"].to_numpy())
    assert np.array_equal(arrays["label"], lab["label"].to_numpy())
    x = lab.select(pl.col("q_max").cast(pl.Float64).clip(1e-6, 1 - 1e-6).pipe(lambda p: (p / (1 - p)).log()))
    assert np.array_equal(arrays["x"], x.to_series().to_numpy())


def test_streamed_online_fit_equals_the_in_memory_fit(synthetic, monkeypatch):
    a = fit_runs([synthetic], "irls-online")
    monkeypatch.setattr(IRLSOnlineFitter, "streams", False)
    b = fit_runs([synthetic], "irls-online")
    assert a.to_dict() == b.to_dict()  # slope, intercepts and the coefficient path
    assert a.training_ == b.training_


def test_rows_out_of_replay_order_fall_back_to_the_sort(small_run, tmp_path):
    """A run whose shard rows were shuffled: the streamed reader declines, the fit still runs."""
    import shutil

    from svt.traces.io import open_run, record_shards, write_meta

    run = tmp_path / "shuffled"
    shutil.copytree(small_run, run)
    part = next((run / "drafts").glob("part-*.parquet"))
    pl.read_parquet(part).sample(fraction=1.0, shuffle=True, seed=0).write_parquet(part)
    meta = open_run(run, deep=False).meta
    record_shards(meta, "drafts", [part])
    write_meta(run, meta)
    assert replay_arrays([run], "logit_qmax") is None
    assert fit_runs([run], "irls-online").training_["rows"] == fit_runs([small_run], "irls-online").training_["rows"]
