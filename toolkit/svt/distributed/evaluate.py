"""The features table of ``svt evaluate`` computed on a cluster: each worker reads one drafts shard
where it lies (checking it as ``open_run`` does, :mod:`svt.distributed.reading`, in the same task)
and returns mergeable summaries (:mod:`svt.distributed.summaries`); the driver adds them up, asks
the workers once more for the bins whose within-bin pairs could move an AUC or that straddle an
equal-mass boundary, and writes the single-machine path's figures (acceptance, AUC, log-loss,
Brier, mean prediction, both ECEs, the soft-label blocks; overall, excluding the first position,
per position; per run and per ``--by`` value; row-wise fits with ``--fit``).

Exact: counts, acceptance and every hard-label AUC (after the refining pass, with tolerance 0: its
bound is printed and is 0). Float sums (log-loss, Brier, mean prediction, both ECEs) merge in
another order than the single machine's: they agree to rounding. The equal-mass ECE's bins are the
single machine's: set by the count of drafts below each tie group, from the merged histogram, with
the few histogram bins that straddle a boundary read key by key in the second pass. The soft-label
AUCs come from the histogram alone, with their bound. Not computed here: bootstrap intervals. ROC
points are taken at thresholds spread over the histogram's bins (each point exact; not the same
thresholds as the single machine's), and the reliability bins are the equal-width ECE bins.
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
    ece_mass,
    exact_auc,
    group_hist,
    mass_bins_to_refine,
    merge_refined,
    merge_soft_refined,
    refine_counts,
    refine_soft,
    reliability_bins,
    roc_points,
    soft_block,
    soft_mass_bins,
    summarize,
    summarize_soft,
)
from svt.errors import ConfigError, DataError

ALL_ROWS = ("", "")  # the group of every row, beside ("run", name) and (--by column, value)


def _read(item: tuple, columns: dict, features: list[tuple], by: str | None, plans: list | None = None,
          soft: tuple = ()):
    """One shard's labelled drafts (``item``: its path, its run's index and name): label, position,
    each group's rows (every row; the run's when several runs are evaluated; each value of --by,
    named as the single machine names it) and each feature's oriented score (NaN: none); with
    ``plans``, each fit's predictions (:mod:`svt.distributed.fits`); and the ``soft`` labels."""
    path, run_index, run_name = item[:3]
    lf = pl.scan_parquet(path).with_columns([pl.col(c).cast(t) for c, t in columns.items()])
    if plans:
        from svt.distributed.fits import fit_columns

        lf = fit_columns(lf.collect(), plans, run_index).lazy()
    frame = (lf.filter(pl.col("label").is_not_null())
             .select("label", "position", *([pl.col(by).alias("_by")] if by else []),
                     *[pl.col(c).cast(pl.Float64).alias(f"_soft{j}") for j, c in enumerate(soft)],
                     *[(e * d).cast(pl.Float64).alias(f"_f{i}") for i, (_, e, _, d) in enumerate(features)]).collect())
    scores = {name: frame[f"_f{i}"].fill_nan(None).to_numpy() for i, (name, _, _, _) in enumerate(features)}
    groups = {ALL_ROWS: slice(None), **({("run", run_name): slice(None)} if run_name is not None else {})}
    if by:
        rows = frame.select(pl.col("_by")).with_row_index("_i").group_by("_by").agg("_i")
        for key, idx in zip(rows["_by"].to_list(), rows["_i"].to_list(), strict=True):
            groups[(by, str(key))] = np.asarray(idx, dtype=np.int64)  # str() of the value: the single machine's name
    scores["_soft"] = {c: frame[f"_soft{j}"].to_numpy() for j, c in enumerate(soft)}
    return frame["label"].to_numpy().astype(np.int64), frame["position"].to_numpy().astype(np.int64), groups, scores


def _scored(groups: dict, features: list[tuple], y, pos, scores: dict, soft: tuple):
    """Per group and feature, the rows the feature scores (a finite score): ``(group, name,
    probability, score, label, position, {soft label: values})``."""
    for gv, rows in groups.items():
        for name, _, probability, _ in features:
            s = scores[name][rows].astype(np.float64)
            ok = np.isfinite(s)
            yield gv, name, probability, s[ok], y[rows][ok], pos[rows][ok], {c: scores["_soft"][c][rows][ok] for c in soft}


def shard_summaries(item: tuple, columns: dict, features: list[tuple], k: int, by: str | None = None,
                    plans: list | None = None, n_bins: int = ECE_BINS, soft: tuple = ()) -> tuple[dict, dict | None]:
    """First pass on one shard: ``{(group, feature): ScoreSummary}`` over the drafts it scores (and
    ``{(group, feature, soft label): SoftSummary}``), and the deep read of its shards when ``item``
    carries it (:func:`svt.distributed.reading.check_unit`: the shards are read once for both)."""
    from svt.distributed.reading import check_unit

    checked = check_unit(*item[3]) if len(item) > 3 and item[3] is not None else None
    y, pos, groups, scores = _read(item, columns, features, by, plans, soft)
    out = {}
    for gv, name, probability, s, ys, ps, softs in _scored(groups, features, y, pos, scores, soft):
        out[(gv, name)] = summarize(s, ys, ps, k, probability, n_bins)
        for c, t in softs.items():
            out[(gv, name, c)] = summarize_soft(s, t, probability, n_bins)
    return out, checked


def shard_refined(item: tuple, columns: dict, features: list[tuple], selected: dict, by: str | None = None,
                  plans: list | None = None, soft: tuple = ()) -> dict:
    """Second pass on one shard: per (group, feature) and draft-position group, the counts per full
    key in the selected bins (per soft label, its sums per full key)."""
    y, pos, groups, scores = _read(item, columns, features, by, plans, soft)
    out = {}
    for gv, name, _, s, ys, ps, softs in _scored(groups, features, y, pos, scores, soft):
        if selected.get((gv, name)):
            out[(gv, name)] = refine_counts(s, ys, ps, selected[(gv, name)])
        for c, t in softs.items():
            if (gv, name, c) in selected:
                out[(gv, name, c)] = refine_soft(s, t, selected[(gv, name, c)])
    return out


def _block(total, g: int, refined, direction: int = 1) -> dict:
    """One scope's figures, with the single machine's keys: ``reasons`` where a figure is None, and
    ``auc_raw`` (1 - AUC) for a feature whose lower values mean accepted."""
    from svt.metrics.ordered import NOT_PROBABILITY, auc_reason
    from svt.metrics.specs import names

    k = total.k
    idx = list(range(k)) if g == ALL else (list(range(1, k)) if g == EXCLUDING_FIRST else [g])
    n = int(total.n[idx].sum())
    positives = int(total.pos[idx].sum())
    out = {"n": n, "accept_rate": float(positives / n) if n else None}
    coarse, bound0 = auc_bound(group_hist(total.hist, g))
    auc, bound = exact_auc(group_hist(total.hist, g), refined)
    out.update({"auc": auc, "auc_bound": bound, "auc_bound_first_pass": bound0})
    reasons = {}
    if auc is None:
        reasons["auc"] = auc_reason(n, positives, n - positives)
    elif direction < 0:
        out["auc_raw"] = 1.0 - auc
    if total.probability and n:
        ece = total.ece[idx].sum(0)
        filled = ece[:, 0] > 0
        gap = np.abs(ece[filled, 1] / ece[filled, 0] - ece[filled, 2] / ece[filled, 0])
        out.update({"log_loss": float(total.log_loss[idx].sum() / n), "brier": float(total.brier[idx].sum() / n),
                    "mean_pred": float(total.sum_p[idx].sum() / n),
                    "ece": float(np.sum(ece[filled, 0] * gap) / ece[:, 0].sum()),
                    "ece_mass": ece_mass(group_hist(total.hist, g), refined, total.n_bins)})
    else:
        out.update(dict.fromkeys(names("table", probability=True)))
        if n:
            reasons.update(dict.fromkeys(names("table", probability=True), NOT_PROBABILITY))
    if reasons:
        out["reasons"] = reasons
    return out


def _to_refine(hist, tol: float, probability: bool, n_bins: int) -> np.ndarray:
    """The bins the second pass reads key by key: those whose pairs could move the AUC, and (for a
    probability) those straddling an equal-mass calibration boundary."""
    bins = bins_to_refine(hist, tol)
    return np.union1d(bins, mass_bins_to_refine(hist, n_bins)) if probability else bins


def _merged(parts: list[dict]) -> dict:
    keys = dict.fromkeys(key for p in parts for key in p)
    out = {}
    for key in keys:
        have = [p[key] for p in parts if key in p]
        total = have[0]
        for other in have[1:]:
            total = total + other
        out[key] = total
    return out


def _open(paths: list) -> list:
    """Each run opened on the driver (run.json, the shards' schemas and records) with what its
    workers need to read it deeply (:class:`svt.distributed.reading.RunCheck`)."""
    from svt.distributed.reading import RunCheck
    from svt.traces.io import check_distinct_runs

    check_distinct_runs(paths)
    checks = []
    for path in paths:
        check = RunCheck.open(path)
        check.run.require_complete()
        if isinstance(check.run.meta.get("tree"), dict):
            raise ConfigError(f"{path} is a tree run: its drafts are tree nodes (`tree_drafts`), whose report "
                              "(acceptance by depth, the tree replay) is computed on one machine (without --cluster).")
        if not check.run.has("drafts") or (check.run.meta.get("counts") or {}).get("drafts") == 0:
            raise ConfigError(f"{path} has no model drafts (a reference or cache-only run): its report is the "
                              "cache report, computed on one machine (without --cluster).")
        if check.run.censored:
            raise ConfigError(f"{path} was collected with live AV (censored labels); --cluster does not read "
                              "its explored steps yet: evaluate it on one machine.")
        checks.append(check)
    return checks


def _finish(checks: list, engine, done: list[dict]) -> list[dict]:
    """Each run's deep read finished (``done``: per run, shard name -> :func:`check_unit` result from
    the first pass; the names without a drafts shard are read now) and what the report says of it."""
    from svt.distributed.reading import run_check

    infos = []
    for check, got in zip(checks, done, strict=True):
        rest = sorted(set(check.units) - set(got))
        got.update(zip(rest, engine.map(run_check, [check.task(n) for n in rest]), strict=True))
        identity = check.finish(got)
        infos.append({"path": str(check.path), "run_id": check.run.meta.get("run_id"), "k": check.run.meta.get("k"),
                      "data_sha256": identity["sha256"], "data_identity": identity})
    return infos


def _features(feature_names: list[str], columns: dict, lacks: set) -> tuple[list[tuple], dict, dict]:
    """Each feature as (name, expression, probability, direction), what the report says of it, and
    the features left out because a run lacks a column they read (an import), as on one machine."""
    from svt.features import get_feature

    feats, meta, left_out = [], {}, {}
    for name in feature_names:
        f = get_feature(name)
        reads = set(f.expr.meta.root_names())
        if not reads <= set(columns):
            raise ConfigError(f"--cluster scores features of the drafts table alone; {name!r} reads "
                              f"{', '.join(sorted(reads - set(columns)))}: evaluate it on one machine.")
        missing = sorted(reads & lacks)
        if missing:
            left_out[name] = f"needs {', '.join(missing)}, which the imported run lacks"
            continue
        feats.append((name, f.expr, f.probability, f.direction))
        meta[name] = {"lossless": f.lossless, "shown_as": f.shown_as, "description": f.description}
    return feats, meta, left_out


def features_table(run_paths: list, feature_names: list[str], engine, *, tol: float = 0.0,
                   by: str | None = None, fits: list[str] | None = None, score_unverified: bool = False,
                   n_bins: int = ECE_BINS) -> dict:
    """``report.json``'s ``features`` (and its ``groups``: per run when several runs are given, per
    value of ``by``) for the runs pooled, computed on ``engine``'s workers (see the module); with
    ``fits``, each fit scored beside the features on the requests one machine scores it on
    (:mod:`svt.distributed.fits`).

    Long because it is the driver's whole sequence: read, check, two passes, the tables."""
    from svt.traces.schema import get_table

    run_paths = [Path(p) for p in ([run_paths] if isinstance(run_paths, str | Path) else run_paths)]
    loaded = None
    if fits:  # a fit that cannot be scored here is refused before any shard is read
        from svt.distributed.fits import load_fits

        loaded = load_fits([str(f) for f in fits])
    checks = _open(run_paths)
    runs = [c.run for c in checks]
    fused = not fits  # the deep read rides on the first pass over the shards (with fits: before their pass)
    done: list[dict] = [{} for _ in runs]
    if not fused:
        infos = _finish(checks, engine, done)
    spec = get_table("drafts")  # the optional columns every run carries (a confidence head's) join them
    columns = spec.present({c for c in spec.optional if all(r.carries("drafts", c) for r in runs)})
    by = None if by == "run" else by  # the runs are groups already when there are several, as on one machine
    if by is not None and by not in columns:
        raise DataError(f"Cannot group by {by!r}: the drafts table has no such column (columns: "
                        f"{', '.join(['run', *columns])}).")
    feats, meta, left_out = _features(feature_names, columns, {c for r in runs for c in r.lacks("drafts")})
    k = max(int(r.meta["k"]) for r in runs)
    several = len(runs) > 1
    names = [p.name for p in run_paths]
    if len(set(names)) != len(names):  # as the single machine names runs: the directory, else the path
        names = [str(p) for p in run_paths]
    items = [(str(f), i, names[i] if several else None, checks[i].task(f.name) if fused else None)
             for i, r in enumerate(runs) for f in r.shards["drafts"]]
    plans = None
    if fits:
        from svt.distributed.fits import plan_fits

        plans = plan_fits(run_paths, runs, [str(f) for f in fits], loaded, engine, items, score_unverified)
        feats += [(p["name"], pl.col(f"_fit{i}"), True, 1) for i, p in enumerate(plans)]
    described = {p["name"]: p["description"] for p in plans or []}
    soft = _soft_labels(runs)
    first = engine.map(shard_summaries, items, columns, feats, k, by, plans, n_bins, soft)
    for item, (_, checked) in zip(items, first, strict=True):
        if checked is not None:
            done[item[1]][Path(item[0]).name] = checked
    if fused:
        infos = _finish(checks, engine, done)
    totals = _merged([summaries for summaries, _ in first])
    groups = [ALL, EXCLUDING_FIRST, *range(k)]
    selected = {key: {g: b for g in groups if (b := _to_refine(group_hist(t.hist, g), tol, t.probability, n_bins)).size}
                for key, t in totals.items() if len(key) == 2}
    selected.update({key: b for key, t in totals.items() if len(key) == 3 and t.probability
                     and (b := soft_mass_bins(t.hist, n_bins)).size})
    refined = merge_refined_all(engine.map(shard_refined, items, columns, feats, selected, by, plans, soft)) if any(
        v.size if isinstance(v, np.ndarray) else v for v in selected.values()) else {}

    def table(gv):
        out = {}
        for name, _, probability, direction in feats:
            t, r = totals.get((gv, name)), refined.get((gv, name), {})
            if t is None:
                continue
            curves = {"roc": roc_points(group_hist(t.hist, ALL)),  # none without rows, as on one machine
                      **({"reliability": reliability_bins(t.ece.sum(0))} if probability else {})} if t.n.sum() else {}
            out[name] = {**meta.get(name, {}), "probability": probability, "direction": direction,
                         **({"description": described[name]} if name in described else {}),
                         **_block(t, ALL, r.get(ALL), direction),
                         "excluding_first": _block(t, EXCLUDING_FIRST, r.get(EXCLUDING_FIRST), direction),
                         "per_position": {str(j): _block(t, j, r.get(j), direction) for j in range(k) if t.n[j]},
                         "curves": curves,
                         "soft": {c: soft_block(totals[(gv, name, c)], refined.get((gv, name, c)), direction)
                                  for c in soft}}
        return out

    from svt.distributed.acceptance import acceptance_section

    steps = acceptance_section(items, [n for n, _, prob, _ in feats if prob and n not in described], engine, n_bins)
    by_group: dict = {}
    for dim, value in sorted({key[0] for key in totals if key[0] != ALL_ROWS}):
        by_group.setdefault(dim, {})[value] = table((dim, value))
    return {"features": table(ALL_ROWS), **({"features_not_computed": left_out} if left_out else {}),
            **({"groups": by_group} if by_group else {}), "runs": infos, **steps,
            "not_computed": _not_computed(runs),
            "shards": len(items), "workers": engine.workers, "ece_bins": n_bins,
            "worker_peak_gib": [round(x, 3) for x in engine.peak_memory()],
            "refined_bins": {"/".join([*(key[0] if key[0] != ALL_ROWS else ()), *key[1:]]):
                             {str(g): int(b.size) for g, b in sel.items()} if isinstance(sel, dict) else int(sel.size)
                             for key, sel in selected.items()}}


def merge_refined_all(parts: list[dict]) -> dict:
    names = dict.fromkeys(n for p in parts for n in p)
    return {n: (merge_refined if len(n) == 2 else merge_soft_refined)([p[n] for p in parts if n in p]) for n in names}


def _soft_labels(runs: list) -> tuple:
    """The soft labels every run carries (an import may lack them), as on one machine."""
    from svt.report.scoring import SOFT_LABELS

    return tuple(c for c in SOFT_LABELS if all(c not in r.lacks("drafts") for r in runs))


def _not_computed(runs: list) -> list[str]:
    """The single machine's sections this report leaves out, for these runs."""
    out = ["bootstrap intervals (--bootstrap)", "the AV and HVD replays (--costs)"]
    if any(r.has("cache_drafts") for r in runs):
        out.append("the cache sections (cache opportunity, yield predictors, realism, the document's checks)")
    if any(r.has("dists") for r in runs):
        out.append("the losslessness audit (the dists sample)")
    return out + ["the expected-length calibration of fits", "groups_acceptance (each group's counts are in its blocks)"]
