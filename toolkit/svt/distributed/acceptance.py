"""The acceptance section of ``svt evaluate`` on a cluster: acceptance by draft position (proposed,
verified, accepted: counts that add), the mean acceptance length (steps and accepted drafts) and
each probability feature's expected-length calibration (per-step sums binned on [0, K]), from two
passes over the drafts shards:

1. each shard's counts by position, its steps and accepted drafts, its longest step and its
   requests: a request in two shards could split a step, and then the section is not given;
2. with the longest step K known, each shard's per-step expected lengths binned on [0, K]
   (:func:`svt.metrics.tables.length_sums`), which add.

The per-step sums are the single machine's (:func:`svt.report.scoring.step_columns`, the same
compiled loop), so the section equals its ``acceptance`` and ``length_calibration`` to rounding.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def _frame(item: tuple) -> pl.LazyFrame:
    from svt.traces.io import scan_shard

    return scan_shard(item[0], "drafts").with_columns(pl.lit(item[1], pl.Int64).alias("_run"),
                                                      pl.lit(str(item[1])).alias("run"))


def shard_steps(item: tuple) -> dict:
    """Pass 1 on a worker (see the module)."""
    from svt.metrics.tables import acceptance_by_position
    from svt.report.scoring import step_columns

    lf = _frame(item)
    by_pos = acceptance_by_position(lf)
    cols = step_columns([lf], [])
    a = np.concatenate(cols["a"]) if cols["a"] else np.zeros(0, np.int64)
    k = np.concatenate(cols["k"]) if cols["k"] else np.zeros(0, np.int64)
    return {"by_position": {int(r["position"]): (int(r["proposed"]), int(r["verified"]), int(r["accepted"]))
                            for r in by_pos.iter_rows(named=True)},
            "steps": int(a.size), "accepted": int(a.sum()), "k": int(k.max()) if k.size else 0,
            "requests": np.unique(lf.select("request").collect()["request"].to_numpy())}


def shard_lengths(item: tuple, features: list[str], k: int, n_bins: int) -> dict:
    """Pass 2 on a worker: each feature's per-step expected lengths binned on [0, ``k``]."""
    from svt.features import get_feature
    from svt.metrics.tables import length_sums
    from svt.report.scoring import step_columns

    feats = [get_feature(f) for f in features]
    cols = step_columns([_frame(item)], feats)
    return {f: length_sums(cols[f], cols["a"], k, n_bins) for f in features}


def acceptance_section(items: list[tuple], features: list[str], engine, n_bins: int) -> dict:
    """``acceptance`` and ``length_calibration`` as the single machine's report holds them (for
    ``features``, the probability features), or the reason they are not given."""
    from svt.metrics.tables import length_calibration_from_sums

    first = engine.map(shard_steps, items)
    keys = np.concatenate([np.c_[np.full(p["requests"].size, item[1]), p["requests"]]
                           for item, p in zip(items, first, strict=True)])
    if np.unique(keys, axis=0).shape[0] != keys.shape[0]:
        return {"acceptance_not_computed": "a request's drafts span two shards, so a step may be split between "
                                           "workers: evaluate it on one machine"}
    counts: dict[int, np.ndarray] = {}
    for p in first:
        for pos, c in p["by_position"].items():
            counts[pos] = counts.get(pos, np.zeros(3, np.int64)) + np.asarray(c)
    steps, accepted = sum(p["steps"] for p in first), sum(p["accepted"] for p in first)
    verified = int(sum(c[1] for c in counts.values()))
    rows = [{"position": pos, "proposed": int(c[0]), "verified": int(c[1]), "accepted": int(c[2]),
             "conditional": c[2] / c[1] if c[1] else None, "marginal": c[2] / c[0] if c[0] else None}
            for pos, c in sorted(counts.items())]
    acceptance = {"labelled": verified, "rate": accepted / verified if verified else float("nan"),
                  "mean_acceptance_length": 1 + accepted / steps if steps else float("nan"), "by_position": rows}
    k = max(p["k"] for p in first)
    lengths = {}
    if features and k:
        sums = engine.map(shard_lengths, items, features, k, n_bins)
        lengths = {f: length_calibration_from_sums(sum(s[f] for s in sums), k, n_bins) for f in features}
    return {"acceptance": acceptance, "length_calibration": lengths}
