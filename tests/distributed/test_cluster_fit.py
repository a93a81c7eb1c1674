"""Distributed Newton against the single-machine fit: the same training rows (a request-level
split named by the driver) give the same coefficients and iterations, shared or per-position slopes."""

import numpy as np
import polars as pl
import pytest

from svt.distributed.engines import start
from svt.distributed.fit import fit_logistic
from svt.features import get_feature
from svt.fit.logistic import design, fit_newton
from svt.traces import open_run
from svt.traces.schema import get_table


@pytest.fixture(scope="module")
def engine():
    with start("local:2") as eng:
        yield eng


@pytest.mark.parametrize("per_position_slope", [False, True])
def test_distributed_newton_equals_the_single_machine_fit(engine, small_run, per_position_slope):
    run = open_run(small_run)
    k = int(run.meta["k"])
    drafts = run.scan("drafts").filter(pl.col("label").is_not_null()).collect()
    requests = np.unique(drafts["request"].to_numpy())
    train = np.random.default_rng(0).permutation(requests)[: int(0.7 * requests.size)]
    feats = [("logit_qmax", get_feature("logit_qmax").expr), ("entropy", get_feature("entropy").expr)]
    beta, iters = fit_logistic(engine, [str(p) for p in run.shards["drafts"]], dict(get_table("drafts").columns),
                               feats, k, train, per_position_slope=per_position_slope)
    rows = drafts.filter(pl.col("request").is_in(pl.Series(train).implode()))
    x = np.column_stack([rows.select(e.cast(pl.Float64)).to_series().to_numpy() for _, e in feats])
    X = design(x, rows["position"].to_numpy().astype(np.int64), k, per_position_slope=per_position_slope)
    ref, ref_iters = fit_newton(X, rows["label"].to_numpy().astype(np.float64))
    assert iters == ref_iters and np.allclose(beta, ref, rtol=1e-8, atol=1e-10)
    assert rows.height < drafts.height  # the held-out requests took no part
