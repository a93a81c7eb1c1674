"""`svt evaluate` on a tree run: acceptance by depth, the calibration of node and path predictors,
the predicted expected accepted length against the realised one and, on greedy runs, the replay of
tree policies (chain, static, EAGLE-2 by path probability, a fitted predictor, the oracle) as
subtrees of the logged trees, with a cost table across concurrency.

Labels: ``label`` (1 accepted, 0 verified and rejected, null never reached) is censored: a node is
tried only under an accepted parent. ``on path`` (label == 1, unreached counted 0) is what a path
probability predicts. On greedy runs ``match`` (the token is the target's argmax at the parent) is
known for every node: the uncensored conditional label a growth predictor needs.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl

from svt import __version__
from svt.errors import DataError
from svt.metrics import calibration_bins, ece, log_loss, roc_auc
from svt.traces.io import open_run
from svt.trees import replay as rp
from svt.trees.predictor import cross_fitted_match

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


def _scores(y: np.ndarray, p: np.ndarray, n_bins: int) -> dict:
    both = 0 < y.sum() < y.size
    return {"n": int(y.size), "rate": float(y.mean()) if y.size else None,
            "mean_pred": float(p.mean()) if y.size else None,
            "auc": roc_auc(y, p) if both else None,
            "log_loss": log_loss(y, p) if y.size else None,
            "ece": ece(y, p, n_bins=n_bins) if y.size else None}


def by_depth(nodes: pl.DataFrame) -> list[dict]:
    rows = nodes.group_by("depth").agg(
        pl.len().alias("nodes"), pl.col("label").is_not_null().sum().alias("verified"),
        (pl.col("label") == 1).sum().alias("accepted"), pl.col("match").mean().alias("match_rate"),
        pl.col("q_token").mean().alias("mean_q_token"), pl.col("path_prob").mean().alias("mean_path_prob"),
    ).sort("depth").with_columns((pl.col("accepted") / pl.col("verified")).alias("conditional"))
    return rows.to_dicts()


def calibration(nodes: pl.DataFrame, n_bins: int, greedy: bool, predicted: np.ndarray | None,
                fitted: dict[str, np.ndarray] | None = None, labels: dict[str, str] | None = None) -> list[dict]:
    """Each predictor against the label it predicts, over all depths and per depth (``fitted``:
    saved node fits by name, each against the label it was trained on, ``labels[name]``)."""
    on_path = (nodes["label"] == 1).fill_null(False).to_numpy().astype(np.int64)
    tried = nodes["label"].is_not_null().to_numpy()
    label = nodes["label"].fill_null(0).to_numpy().astype(np.int64)
    depth = nodes["depth"].to_numpy()
    cases = [("q_token", "accepted given tried", nodes["q_token"].to_numpy(), label, tried),
             ("path_prob", "on the accepted path", nodes["path_prob"].to_numpy(), on_path, np.ones_like(tried))]
    if greedy:
        match = nodes["match"].to_numpy().astype(np.int64)
        cases.append(("q_token", "match (every node)", nodes["q_token"].to_numpy(), match, np.ones_like(tried)))
        if predicted is not None:
            cases.append(("predictor (cross-fitted)", "match (every node)", predicted, match, np.ones_like(tried)))
            cases.append(("predictor path product", "on the accepted path", predicted_path(nodes, predicted),
                          on_path, np.ones_like(tried)))
    for name, p in (fitted or {}).items():
        if labels[name] == "match (every node)":
            cases.append((f"fit {name}", labels[name], p, nodes["match"].fill_null(0).to_numpy().astype(np.int64),
                          np.ones_like(tried)))
        else:
            cases.append((f"fit {name}", labels[name], p, label, tried))
        if greedy:
            cases.append((f"fit {name} path product", "on the accepted path", predicted_path(nodes, p), on_path,
                          np.ones_like(tried)))
    out = []
    for name, target, p, y, keep in cases:
        keep = keep.astype(bool)
        row = {"predictor": name, "label": target, **_scores(y[keep], np.clip(p[keep], 0, 1), n_bins),
               "by_depth": [{"depth": int(d), **_scores(y[keep & (depth == d)], np.clip(p[keep & (depth == d)], 0, 1),
                                                        n_bins)}
                            for d in np.unique(depth[keep])]}
        bins = calibration_bins(y[keep], np.clip(p[keep], 0, 1), n_bins=n_bins)
        row["bins"] = {k: [None if not np.isfinite(v) else float(v) for v in bins[k]]
                       for k in ("weight", "mean_pred", "rate")}
        out.append(row)
    return out


# the drafts-table names of a node's columns, so the feature zoo's expressions read tree nodes
NODE_AS_DRAFT = {"q_max": "q_max", "q_token": "q_sampled", "q_entropy": "q_entropy", "depth": "position"}
NODE_ONLY = (("path_prob", "the drafter's path probability", 1, True),
             ("rank", "sibling rank (0: tried first)", -1, False))


def node_feature_table(nodes: pl.DataFrame, greedy: bool, n_bins: int) -> dict:
    """The feature zoo on tree nodes: every registered feature whose columns a node has (q_token
    read as the drafted token's q, depth as the position), plus path probability and sibling rank,
    scored by AUC (direction applied) against ``match`` on greedy runs (every node) and against
    acceptance of the tried nodes, overall and per depth; log-loss and ECE for probabilities."""
    from svt.features import FEATURES

    view = nodes.select(*(pl.col(a).alias(b) for a, b in NODE_AS_DRAFT.items()), "path_prob", "rank")
    tried = nodes["label"].is_not_null().to_numpy()
    targets = [("accepted given tried", nodes["label"].fill_null(0).to_numpy().astype(np.int64), tried)]
    if greedy:
        targets.insert(0, ("match (every node)", nodes["match"].to_numpy().astype(np.int64),
                           np.ones(nodes.height, dtype=bool)))
    feats = [(f.name, f.description, f.expr, f.direction, f.probability, f.lossless) for f in FEATURES.values()]
    feats += [(n, d, pl.col(n), s, prob, True) for n, d, s, prob in NODE_ONLY]
    depth = nodes["depth"].to_numpy()
    rows, skipped = [], {}
    for name, desc, expr, sign, prob, lossless in feats:
        need = sorted(set(expr.meta.root_names()) - set(view.columns))
        if need:
            skipped[name] = f"reads {', '.join(need)}, which tree nodes do not log"
            continue
        x = view.select(expr.cast(pl.Float64)).to_series().to_numpy()
        if not np.isfinite(x).all():
            skipped[name] = "not finite on some nodes"
            continue
        for target, y, keep in targets:
            def score(m, x=x, y=y, sign=sign, prob=prob):
                both = 0 < y[m].sum() < m.sum()
                out = {"n": int(m.sum()), "auc": roc_auc(y[m], sign * x[m]) if both else None}
                if prob:
                    p = np.clip(x[m], 0, 1)
                    out.update(log_loss=log_loss(y[m], p) if m.any() else None,
                               ece=ece(y[m], p, n_bins=n_bins) if m.any() else None)
                return out
            rows.append({"feature": name, "description": desc, "label": target, "lossless": lossless,
                         "probability": prob, **score(keep),
                         "by_depth": [{"depth": int(d), **score(keep & (depth == d))} for d in np.unique(depth[keep])]})
    return {"rows": rows, "skipped": skipped, "columns": {b: a for a, b in NODE_AS_DRAFT.items()}}


def logged(nodes: pl.DataFrame) -> rp.LoggedTrees:
    step_id = nodes.select(pl.struct("request", "step").rank("dense") - 1).to_series().to_numpy()
    col = {c: nodes[c].to_numpy() for c in ("node", "parent", "depth", "rank")}
    match = nodes["match"].fill_null(0).to_numpy()
    return rp.LoggedTrees(step_id.astype(np.int64), col["node"].astype(np.int64), col["parent"].astype(np.int64),
                          col["depth"].astype(np.int64), col["rank"].astype(np.int64), match.astype(bool))


def predicted_path(nodes: pl.DataFrame, predicted: np.ndarray) -> np.ndarray:
    return logged(nodes).path_product(predicted)


def expected_length(nodes: pl.DataFrame, steps: pl.DataFrame, n_bins: int) -> dict:
    """The drafter's predicted expected accepted length of each tree (the sum of its path
    probabilities) against the accepted length it realised."""
    pred = nodes.group_by("request", "step").agg(pl.col("path_prob").cast(pl.Float64).sum().alias("predicted"))
    both = steps.join(pred, on=["request", "step"]).select("predicted", pl.col("accepted").cast(pl.Float64))
    p, a = both["predicted"].to_numpy(), both["accepted"].to_numpy()
    edges = np.unique(np.quantile(p, np.linspace(0, 1, n_bins + 1)))
    idx = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, max(edges.size - 2, 0))
    bins = [{"n": int((idx == b).sum()), "predicted": float(p[idx == b].mean()), "realised": float(a[idx == b].mean())}
            for b in range(max(edges.size - 1, 1)) if (idx == b).any()]
    return {"steps": int(p.size), "mean_predicted": float(p.mean()), "mean_realised": float(a.mean()),
            "ratio": float(p.mean() / a.mean()) if a.mean() > 0 else None,
            "correlation": float(np.corrcoef(p, a)[0, 1]) if p.size > 2 and p.std() > 0 and a.std() > 0 else None,
            "bins": bins}


def _static_shapes(depth: int, width: int) -> list[list[int]]:
    shapes = [[2] + [1] * (depth - 1), [2, 2] + [1] * (depth - 2), [3, 2, 2] + [1] * (depth - 3),
              [width] * 2 + [1] * (depth - 2)]
    out = []
    for s in shapes:
        s = [w for w in s[:depth] if w > 0]
        if s and s not in out and max(s) <= width:
            out.append(s)
    return out


def replay_policies(nodes: pl.DataFrame, predicted: np.ndarray | None, widths: list[int] | None = None,
                    fitted: dict[str, np.ndarray] | None = None) -> list[dict]:
    """Every policy and budget replayed on the logged greedy trees: accepted tokens per step, nodes
    verified per step and per depth (for costs), accepted per verified node. ``widths``: the logged
    static shape, replayed too (it is the run itself); ``fitted``: saved node fits by name, each
    growing trees by its path product (policy ``fit NAME``)."""
    trees = logged(nodes)
    depth = int(trees.depth.max()) + 1
    width = int(trees.rank.max()) + 1
    max_nodes = int(np.bincount(trees.step).max())
    budgets = sorted({n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n < max_nodes} | {max_nodes})
    policies: list[tuple[str, str, np.ndarray]] = []
    for k in range(1, depth + 1):
        policies.append(("chain", f"K={k}", rp.chain(trees, k)))
    shapes = _static_shapes(depth, width)
    if widths and list(widths) not in shapes:
        shapes.append(list(widths))
    for s in shapes:
        policies.append(("static", "widths=" + ",".join(map(str, s)), rp.static(trees, s)))
    path = nodes["path_prob"].to_numpy().astype(np.float64)
    for n in budgets:
        policies.append(("path-prob", f"n={n}", trees.top_n(path, n)))
    if predicted is not None:
        score = trees.path_product(predicted)
        for n in budgets:
            policies.append(("predictor", f"n={n}", trees.top_n(score, n)))
    for name, p in (fitted or {}).items():
        score = trees.path_product(p)
        for n in budgets:
            policies.append((f"fit {name}", f"n={n}", trees.top_n(score, n)))
    for n in budgets:
        policies.append(("oracle", f"n={n}", rp.oracle(trees, n)))
    rows = []
    for kind, budget, mask in policies:
        acc, size = trees.outcome(mask)
        per_depth = np.bincount(trees.depth[mask], minlength=depth) / max(trees.n_steps, 1)
        parents = np.zeros(mask.size, dtype=bool)
        parents[trees.gparent[mask & (trees.gparent >= 0)]] = True  # nodes the drafter expanded
        expanded = np.bincount(trees.depth[parents], minlength=depth) / max(trees.n_steps, 1)
        rows.append({"policy": kind, "budget": budget, "accepted_per_step": float(acc.mean()),
                     "tokens_per_step": float(1 + acc.mean()), "nodes_per_step": float(size.mean()),
                     "accepted_per_node": float(acc.sum() / max(size.sum(), 1)),
                     "nodes_by_depth": [float(x) for x in per_depth],
                     "expanded_by_depth": [float(x) for x in expanded]})
    return rows


def step_ms(costs, batch: int, nodes_by_depth: list[float], expanded_by_depth: list[float]) -> tuple[float, float]:
    """Draft and verify milliseconds of one step at ``batch`` for a tree of this mean shape: drafter
    passes for the pending token and then for each level's expanded nodes (those with children in
    the tree), read as one-token passes over ``batch`` x that many rows, and one target pass over
    every row's pending token and nodes."""
    levels = ([1.0] + [m for m in expanded_by_depth if m > 0]) if any(nodes_by_depth) else []
    draft = sum(costs.draft(max(1, round(batch * m)), 1) for m in levels)
    verify = float(costs.verify(np.array([batch * (1.0 + sum(nodes_by_depth))]), rows=batch)[0])
    return draft, verify


def beyond_table(costs, rows: list[dict]) -> list[str]:
    """Where the replay reads a measured table beyond what it measured (extrapolated linearly)."""
    if costs.kind != "measured":
        return []
    need_verify = max(CONCURRENCY) * (1 + max(r["nodes_per_step"] for r in rows))
    need_rows = max(CONCURRENCY) * max((max(r["expanded_by_depth"], default=0) for r in rows), default=0)
    out = costs.verify_reach(max(CONCURRENCY), need_verify)
    if need_rows > max(costs.draft_ms):
        out.append(f"draft_ms up to batch {max(costs.draft_ms)}, the replay needs {need_rows:.0f} rows a level")
    return out


def end_to_end(rows: list[dict], costs) -> list[dict]:
    """Throughput and interactivity of every policy across concurrency, and the Pareto frontier."""
    out = []
    for r in rows:
        for b in CONCURRENCY:
            d, v = step_ms(costs, b, r["nodes_by_depth"], r["expanded_by_depth"])
            per_request = r["tokens_per_step"] / ((d + v) / 1e3)
            out.append({"policy": r["policy"], "budget": r["budget"], "concurrency": b, "draft_ms": d,
                        "verify_ms": v, "interactivity": per_request, "throughput": per_request * b})
    real = [o for o in out if o["policy"] != "oracle"]  # the oracle is a bound, not a policy to choose
    for r in out:
        r["pareto"] = r["policy"] != "oracle" and not any(
            o["throughput"] >= r["throughput"] and o["interactivity"] >= r["interactivity"]
            and (o["throughput"] > r["throughput"] or o["interactivity"] > r["interactivity"]) for o in real)
    return out


def by_workload(steps: pl.DataFrame, workload_of: dict[int, str]) -> list[dict]:
    """Per workload (and all): steps, nodes and accepted tokens per step, accepted per node."""
    s = steps.with_columns(pl.col("request").replace_strict(workload_of, default="?").alias("workload"))
    agg = [pl.len().alias("steps"), pl.col("drafted").cast(pl.Float64).mean().alias("nodes_per_step"),
           pl.col("accepted").cast(pl.Float64).mean().alias("accepted_per_step"),
           (pl.col("accepted").cast(pl.Float64).sum() / pl.col("drafted").cast(pl.Float64).sum())
           .alias("accepted_per_node")]
    rows = [{"workload": "all", **s.select(agg).row(0, named=True)}]
    return rows + s.group_by("workload").agg(agg).sort("workload").to_dicts()


def _report(runs, opts, infos, metas, steps: pl.DataFrame, parts: dict) -> dict:
    from svt.report.schema import REPORT_SCHEMA

    run = open_run(runs[0], deep=False, tables=["requests"])
    workload_of = dict(run.scan("requests").select("request", "workload").collect().iter_rows())
    return {
        "report_schema": REPORT_SCHEMA, "svt_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": infos, "kind": "trees",
        "settings": {"n_bins": opts.n_bins, "seed": opts.seed, "costs": opts.costs},
        "trees": {"run": str(runs[0]), "shape": metas[0].get("tree"),
                  "greedy": bool((metas[0].get("sampling") or {}).get("greedy")),
                  "by_workload": by_workload(steps, workload_of), **parts,
                  "replay": None, "end_to_end": None, "costs": None},
    }


def _tree_fits(paths: list[str]) -> dict:
    """The saved node fits given with --fit, by table name; a fit of another kind is refused."""
    from svt.fit import Fitter, name_fits

    fits = [Fitter.load(p) for p in paths or []]
    other = [p for p, f in zip(paths or [], fits, strict=True) if f.table != "tree_drafts"]
    if other:
        raise DataError(f"{other[0]} is not a node predictor (`svt fit TREE_RUN --model tree-logistic`): chain and "
                        "yield fits are scored on chain runs.")
    return dict(zip(name_fits(list(paths or []), [f.name for f in fits]), fits, strict=True))


def _held_out(fits: dict, nodes: pl.DataFrame, steps: pl.DataFrame, runs: list, infos: list[dict]):
    """The nodes and steps of the requests every fit may be scored on, and a sentence saying so."""
    from svt.fit import evaluation_mask

    frame = nodes.with_columns(pl.lit(0).alias("_run"))
    keep = np.ones(nodes.height, dtype=bool)
    for fit in fits.values():
        if fit.label_ == "match (every node)" and nodes["match"].null_count():
            raise DataError(f"{fit.file_} predicts greedy `match`, which this sampling run does not have; fit a node "
                            "predictor on a sampling tree run to score it here.")
        keep &= evaluation_mask(fit, frame, [infos[0]["run_id"]], [Path(r) for r in runs])
    held = nodes.filter(pl.Series(keep))["request"].unique()
    total = nodes["request"].n_unique()
    if held.len() < 2:
        raise DataError(f"The node fits hold out {held.len()} of this run's {total} requests: too few to score them "
                        "on (fit with a larger --test-fraction, or evaluate a run they were not trained on).")
    note = (f"all {total} requests (the fits never saw this run)" if held.len() == total else
            f"the {held.len()} requests every node fit held out (of {total}; the others trained a fit)")
    return (nodes.filter(pl.col("request").is_in(held.implode())), steps.filter(pl.col("request").is_in(held.implode())),
            note)


def tree_report(runs: list, opts, infos: list[dict], metas: list[dict]) -> dict:
    """The report of one tree run (see the module docstring)."""
    if len(runs) != 1:
        raise DataError("A tree run is evaluated alone: pass one tree run (chain runs have their own report).")
    if opts.by or opts.live or opts.reference_run or opts.bootstrap or opts.replay_bootstrap:
        raise DataError("--by, --live, --reference-run, --bootstrap and --replay-bootstrap apply to chain "
                        "runs; a tree run's report fits its own node predictor (cross-fitted over requests).")
    fits = _tree_fits(opts.fits)
    greedy = bool((metas[0].get("sampling") or {}).get("greedy"))
    per_node = (metas[0].get("tree") or {}).get("per_node", True)
    if opts.costs and not (greedy and per_node):
        raise DataError("--costs replays tree policies, which needs a greedy tree run with per-node rows (every "
                        "node's `match`); this run is " + ("an import with counts per step only." if not per_node
                                                           else "a sampling run.") + " Evaluate it without --costs.")
    run = open_run(runs[0], deep=False)
    steps = run.scan("steps").collect()
    if not run.has("tree_drafts") and per_node:
        raise DataError(f"{runs[0]}: run.json describes a tree run, but it has no tree_drafts table.")
    if not per_node:  # an imported tree run: counts per step
        return _report(runs, opts, infos, metas, steps, {"by_depth": [], "calibration": [], "expected_length": None,
                                                         "features": None})
    nodes = run.scan("tree_drafts").collect().sort("request", "step", "node")
    if nodes.is_empty():
        raise DataError(f"{runs[0]}: no tree nodes to evaluate.")
    counts = nodes.group_by("request", "step").len().join(steps, on=["request", "step"], how="full", coalesce=True)
    off = counts.filter(pl.col("len").fill_null(0) != pl.col("drafted").cast(pl.Int64).fill_null(-1))
    if off.height:
        r = off.row(0, named=True)
        raise DataError(f"{runs[0]}: request {r['request']} step {r['step']} has {r['len'] or 0} tree nodes, but its "
                        f"steps row records {r['drafted']}: the tables do not agree.")
    scored = None
    if fits:  # every figure on the requests each fit held out, so the fits' rows compare with the rest
        nodes, steps, scored = _held_out(fits, nodes, steps, runs, infos)
    predicted, note = None, None
    if greedy and nodes["request"].n_unique() < 2:
        note = "not fitted: cross-fitting needs nodes from at least 2 requests"
    elif greedy:
        predicted = cross_fitted_match({c: nodes[c].to_numpy() for c in
                                        ("q_token", "q_max", "q_entropy", "path_prob", "depth", "rank", "match")},
                                       nodes["request"].to_numpy(), seed=opts.seed)
    fitted = {name: fit.predict(nodes) for name, fit in fits.items()}
    report = _report(runs, opts, infos, metas, steps, {
        "by_depth": by_depth(nodes),
        "calibration": calibration(nodes, opts.n_bins, greedy, predicted, fitted,
                                   {name: fit.label_ for name, fit in fits.items()}),
        "expected_length": expected_length(nodes, steps, opts.n_bins),
        "features": node_feature_table(nodes, greedy, opts.n_bins)})
    report["trees"]["predictor_note"] = note
    report["trees"]["fits"] = {name: {"path": str(fit.file_), "label": fit.label_} for name, fit in fits.items()}
    report["trees"]["coverage"] = scored
    if greedy:
        rows = replay_policies(nodes, predicted, (metas[0].get("tree") or {}).get("widths"), fitted)
        report["trees"]["replay"] = rows
        if opts.costs:
            from svt.simulate.cost_files import load_costs

            table = load_costs(Path(opts.costs))
            report["trees"]["costs"] = {"path": opts.costs, "kind": table.kind, "fingerprint": table.fingerprint(),
                                        "beyond_table": beyond_table(table, rows),
                                        "warnings": list(table.measurement.get("warnings", []))}
            report["trees"]["end_to_end"] = end_to_end(rows, table)
    return report
