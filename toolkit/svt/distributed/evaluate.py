"""The features table of ``svt evaluate`` computed on a cluster: each worker reads one drafts shard
where it lies and returns mergeable summaries (:mod:`svt.distributed.summaries`); the driver adds
them up, asks the workers once more for the bins whose within-bin pairs could move an AUC, and
writes the same figures as the single-machine path (AUC, log-loss, Brier, mean prediction,
equal-width ECE, acceptance; overall, excluding the first position, per position).

Exact: counts, acceptance and every AUC (after the refining pass, with tolerance 0: its bound is
printed and is 0). Float sums (log-loss, Brier, mean prediction, ECE) merge in another order than
the single machine's: they agree to rounding. Not computed here: equal-mass ECE, ROC curves and
bootstrap intervals (they need the ordered scores: the single-machine path gives them).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.distributed.summaries import (
    ALL,
    ECE_BINS,
    EXCLUDING_FIRST,
    auc_bound,
    bins_to_refine,
    exact_auc,
    group_hist,
    merge_refined,
    refine_counts,
    summarize,
)
from svt.errors import ConfigError


def _read(path: str, columns: dict, features: list[tuple]) -> tuple[np.ndarray, np.ndarray, dict]:
    """One shard's labelled drafts: label, position and each feature's oriented score (NaN: none)."""
    frame = (pl.scan_parquet(path).with_columns([pl.col(c).cast(t) for c, t in columns.items()])
             .filter(pl.col("label").is_not_null())
             .select("label", "position", *[(e * d).cast(pl.Float64).alias(f"_f{i}")
                                            for i, (_, e, _, d) in enumerate(features)]).collect())
    scores = {name: frame[f"_f{i}"].fill_nan(None).to_numpy() for i, (name, _, _, _) in enumerate(features)}
    return frame["label"].to_numpy().astype(np.int64), frame["position"].to_numpy().astype(np.int64), scores


def _valid(s: np.ndarray) -> np.ndarray:
    return np.isfinite(s)


def shard_summaries(path: str, columns: dict, features: list[tuple], k: int) -> dict:
    """First pass on one shard: ``{feature: ScoreSummary}`` over the drafts it scores."""
    y, pos, scores = _read(path, columns, features)
    out = {}
    for name, _, probability, _ in features:
        s = scores[name].astype(np.float64)
        ok = _valid(s)
        out[name] = summarize(s[ok], y[ok], pos[ok], k, probability)
    return out


def shard_refined(path: str, columns: dict, features: list[tuple], selected: dict) -> dict:
    """Second pass on one shard: per feature and group, the counts per full key in the selected bins."""
    y, pos, scores = _read(path, columns, features)
    out = {}
    for name, _, _, _ in features:
        if selected.get(name):
            s = scores[name].astype(np.float64)
            ok = _valid(s)
            out[name] = refine_counts(s[ok], y[ok], pos[ok], selected[name])
    return out


def _block(total, g: int, refined) -> dict:
    k = total.k
    idx = list(range(k)) if g == ALL else (list(range(1, k)) if g == EXCLUDING_FIRST else [g])
    n = int(total.n[idx].sum())
    out = {"n": n, "accept_rate": float(total.pos[idx].sum() / n) if n else None}
    coarse, bound0 = auc_bound(group_hist(total.hist, g))
    auc, bound = exact_auc(group_hist(total.hist, g), refined)
    out.update({"auc": auc, "auc_bound": bound, "auc_bound_first_pass": bound0})
    if total.probability and n:
        ece = total.ece[idx].sum(0)
        filled = ece[:, 0] > 0
        gap = np.abs(ece[filled, 1] / ece[filled, 0] - ece[filled, 2] / ece[filled, 0])
        out.update({"log_loss": float(total.log_loss[idx].sum() / n), "brier": float(total.brier[idx].sum() / n),
                    "mean_pred": float(total.sum_p[idx].sum() / n),
                    "ece": float(np.sum(ece[filled, 0] * gap) / ece[:, 0].sum())})
    return out


def features_table(run_path: str | Path, feature_names: list[str], engine, *, tol: float = 0.0) -> dict:
    """``report.json``'s ``features`` for one run, computed on ``engine``'s workers (see the module)."""
    from svt.features import get_feature
    from svt.traces import open_run
    from svt.traces.schema import get_table

    run = open_run(run_path, deep=False, tables=["drafts"])
    if run.censored:
        raise ConfigError(f"{run_path} was collected with live AV (censored labels); --cluster does not read "
                          "its explored steps yet: evaluate it on one machine.")
    columns = dict(get_table("drafts").columns)
    feats = []
    for name in feature_names:
        f = get_feature(name)
        reads = set(f.expr.meta.root_names())
        if not reads <= set(columns):
            raise ConfigError(f"--cluster scores features of the drafts table alone; {name!r} reads "
                              f"{', '.join(sorted(reads - set(columns)))}: evaluate it on one machine.")
        feats.append((name, f.expr, f.probability, f.direction))
    k = int(run.meta["k"])
    shards = [str(p) for p in run.shards["drafts"]]
    parts = engine.map(shard_summaries, shards, columns, feats, k)
    totals = {name: sum((p[name] for p in parts[1:]), parts[0][name]) for name, *_ in feats}
    groups = [ALL, EXCLUDING_FIRST, *range(k)]
    selected = {name: {g: b for g in groups if (b := bins_to_refine(group_hist(t.hist, g), tol)).size}
                for name, t in totals.items()}
    refined = merge_refined_all(engine.map(shard_refined, shards, columns, feats, selected)) if any(
        selected.values()) else {}
    out = {}
    for name, _, probability, direction in feats:
        t, r = totals[name], refined.get(name, {})
        out[name] = {"probability": probability, "direction": direction, **_block(t, ALL, r.get(ALL)),
                     "excluding_first": _block(t, EXCLUDING_FIRST, r.get(EXCLUDING_FIRST)),
                     "per_position": {str(j): _block(t, j, r.get(j)) for j in range(k) if t.n[j]}}
    return {"features": out, "shards": len(shards), "workers": engine.workers, "ece_bins": ECE_BINS,
            "worker_peak_gib": [round(x, 3) for x in engine.peak_memory()],
            "refined_bins": {name: {str(g): int(b.size) for g, b in sel.items()} for name, sel in selected.items()}}


def merge_refined_all(parts: list[dict]) -> dict:
    names = {n for p in parts for n in p}
    return {n: merge_refined([p[n] for p in parts if n in p]) for n in names}
