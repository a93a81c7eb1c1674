"""The full feature table scores features in families that share orders and ordered passes: every
feature's block is the block it gets scored alone."""

from __future__ import annotations

import numpy as np
import polars as pl

from svt.features import get_feature
from svt.report.scoring import EvaluateOptions, _monotone_families, features_table


def _drafts(n: int = 6000) -> pl.DataFrame:
    rng = np.random.default_rng(3)
    q = rng.random(n).astype(np.float32)
    return pl.DataFrame({
        "q_max": q, "q_sampled": (q * rng.random(n)).astype(np.float32),
        "q_entropy": rng.random(n).astype(np.float32), "q_margin": (q * rng.random(n)).astype(np.float32),
        "position": rng.integers(0, 4, n), "label": (rng.random(n) < q).astype(np.int8),
        "accept_prob": rng.random(n).astype(np.float32), "_req": rng.integers(0, 50, n)})


def test_families_group_monotone_transforms():
    names = ["q_max", "entropy", "logit_qmax", "neg_entropy", "q_sampled", "logit_qsampled"]
    feats = [get_feature(f) for f in names]
    d = _drafts()
    scores = {f.name: d.select(f.expr.cast(pl.Float64)).to_series().to_numpy() for f in feats}
    # entropy is scored negated (direction -1): neg_entropy ranks as it does
    assert _monotone_families(feats, scores) == [[0, 2], [1, 3], [4, 5]]


def test_each_block_is_the_feature_scored_alone():
    names = ["q_max", "entropy", "logit_qmax", "neg_entropy", "q_sampled", "logit_qsampled", "margin"]
    feats = [get_feature(f) for f in names]
    d = _drafts()
    table = features_table(d, feats, EvaluateOptions(), soft=["accept_prob"])
    assert list(table) == names
    for f in feats:
        alone = features_table(d, [f], EvaluateOptions(), soft=["accept_prob"])[f.name]
        assert table[f.name] == alone, f.name
