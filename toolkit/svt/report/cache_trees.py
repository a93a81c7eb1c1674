"""Suffix-tree drafts (``cache_trees``) in `svt evaluate`: what a SuffixDecoding tree draft buys over
its chain draft at the same positions, how calibrated the suffix tree's node probabilities are as
predictors of the accepted path, and, with ``--costs``, Hybrid Verified Decoding on tree drafts
(report.json keys ``cache_tree`` and ``hvd_tree``).

A tree and a chain are proposed from the same cache state at every position (arctic-inference's
``speculate`` with and without ``use_tree_spec``); both are labelled by greedy verification against
the run's output, so a tree's yield is its deepest matched path and its verify cost counts all of
its nodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import DataError
from svt.metrics import calibration_bins, ece, log_loss, roc_auc
from svt.metrics.yields import yield_block

DEPTH_CAP = 8  # calibration rows by depth; deeper nodes are pooled into the last row


def opportunity(pos: pl.DataFrame) -> dict:
    """Per workload and overall: trees against chains at the same positions."""
    out = {}
    for group, part in [("all", pos), *sorted(((k[0], v) for k, v in pos.group_by("workload")),
                                               key=lambda kv: str(kv[0]))]:
        t = part["tree_yield"].to_numpy().astype(np.int64)
        c = part["oracle_accepted"].to_numpy().astype(np.int64)
        nt, nc = part["tree_size"].to_numpy(), part["draft_len"].to_numpy()
        with_tree = nt > 0
        out[str(group)] = {
            "positions": part.height,
            "tree_share": float(with_tree.mean()) if part.height else float("nan"),
            "mean_tree_size": float(nt[with_tree].mean()) if with_tree.any() else float("nan"),
            "mean_chain_len": float(nc[nc > 0].mean()) if (nc > 0).any() else float("nan"),
            "mean_tree_yield": float(t.mean()) if t.size else float("nan"),
            "mean_chain_yield": float(c.mean()) if c.size else float("nan"),
            "tree_beats_chain": float(np.mean(t > c)) if t.size else float("nan"),
            "chain_beats_tree": float(np.mean(c > t)) if t.size else float("nan"),
            # accepted tokens per drafted token verified: what a verify budget buys
            "tree_yield_per_node": float(t.sum() / nt.sum()) if nt.sum() else float("nan"),
            "chain_yield_per_token": float(c.sum() / nc.sum()) if nc.sum() else float("nan"),
            "predicted_tree_yield": float(part["tree_score"].mean()) if part.height else float("nan"),
            "predicted_chain_yield": float(part["score"].mean()) if part.height else float("nan"),
        }
    return out


def _scores(y: np.ndarray, p: np.ndarray, n_bins: int) -> dict:
    both = 0 < y.sum() < y.size
    return {"n": int(y.size), "rate": float(y.mean()) if y.size else None,
            "mean_pred": float(p.mean()) if y.size else None,
            "auc": roc_auc(y, p) if both else None,
            "log_loss": log_loss(y, np.clip(p, 1e-6, 1 - 1e-6)) if y.size else None,
            "ece": ece(y, p, n_bins=n_bins) if y.size else None}


def calibration(nodes: pl.DataFrame, n_bins: int) -> dict:
    """The suffix tree's node probability (its estimate of reaching the node) against whether the
    node is on the accepted path; nodes deeper than the response goes have no label and are left
    out. Overall, by depth (the last row pools depth >= DEPTH_CAP) and the reliability bins."""
    known = nodes.filter(~pl.col("beyond"))
    y = (known["label"] == 1).fill_null(False).to_numpy().astype(np.int64)
    p = known["prob"].to_numpy().astype(np.float64)
    depth = np.minimum(known["depth"].to_numpy(), DEPTH_CAP)
    rows = [{"depth": int(d), "pooled": bool(d == DEPTH_CAP), **_scores(y[depth == d], p[depth == d], n_bins)}
            for d in np.unique(depth)]
    bins = None
    if y.size:
        b = calibration_bins(y, p, n_bins=n_bins)
        bins = {k: [None if not np.isfinite(v) else float(v) for v in b[k]] for k in ("weight", "mean_pred", "rate")}
    return {"all": _scores(y, p, n_bins), "by_depth": rows, "left_out_beyond_response": int(nodes["beyond"].sum()),
            "bins": bins}


def hvd_tree(pos: pl.DataFrame, k: int, costs, fitted: dict[str, np.ndarray] | None = None) -> dict:
    """HVD replay with chain cache drafts and with tree cache drafts (verify cost: all of a tree's
    nodes), each switched by its own raw score (the sum of the cache's probabilities, an expected
    yield) across τ, and tree drafts also by each tree yield fit (``fitted``: predictions on ``pos``)."""
    from svt.simulate.hvd import REQUEST_BOOTSTRAP, TAUS, HVDRequest, best_tau, replay_hvd

    chain, tree, pc, pt = [], [], [], []
    fitted = fitted or {}
    per_fit: dict[str, list[np.ndarray]] = {n: [] for n in fitted}
    pos = pos.with_columns(**{f"_fit_{i}": pl.Series(v) for i, v in enumerate(fitted.values())})
    for _, part in pos.sort("_run", "request", "decode_pos").group_by("_run", "request", maintain_order=True):
        w, m = str(part["workload"][0]), part["model_accepted"].to_numpy()
        chain.append(HVDRequest(w, part["draft_len"].to_numpy(), part["oracle_accepted"].to_numpy(), m,
                                part["lookup_ms"].to_numpy().astype(np.float64)))
        tree.append(HVDRequest(w, part["tree_size"].to_numpy(), part["tree_yield"].to_numpy(), m,
                               part["tree_lookup_ms"].to_numpy().astype(np.float64)))
        pc.append(part["score"].to_numpy().astype(np.float64))
        pt.append(part["tree_score"].to_numpy().astype(np.float64))
        for i, n in enumerate(fitted):
            per_fit[n].append(part[f"_fit_{i}"].to_numpy().astype(np.float64))
    # the same seed: chain and tree rows priced on the same request resamples
    rows_c = replay_hvd(chain, {"chain score": pc}, k, costs, TAUS, bootstrap=REQUEST_BOOTSTRAP, seed=0)
    rows_t = replay_hvd(tree, {"tree score": pt, **per_fit}, k, costs, TAUS, bootstrap=REQUEST_BOOTSTRAP, seed=0)
    names = {("chain", "greedy"): "greedy", ("chain", "model-only"): "model-only",
             ("chain", "cache-only"): "cache-only chain", ("tree", "cache-only"): "cache-only tree",
             ("chain", "oracle-switch"): "oracle-switch chain", ("tree", "oracle-switch"): "oracle-switch tree"}
    order = list(names.values())
    rows = [{**r, "policy": names[(d, r["policy"])], "draft": d}
            for d, part in (("chain", rows_c), ("tree", rows_t)) for r in part if (d, r["policy"]) in names]
    groups = list(dict.fromkeys(r["group"] for r in rows_c))
    rows.sort(key=lambda r: (groups.index(r["group"]), order.index(r["policy"])))
    best = best_tau(rows_c) + best_tau(rows_t)
    return {"k": k, "requests": len(chain), "rows": rows, "best": best,
            "taus": [t for t in TAUS], "note": "each request replayed at batch 1 from position 0; a tree cycle pays its "
            "lookup and verify(1 + tree nodes), a chain cycle verify(1 + draft length); τ chosen on the replayed "
            "requests themselves (optimistic)"}


def cache_tree_report(runs: list[Path], rows: pl.DataFrame, k: int, costs, n_bins: int,
                      fit_paths: list[str] | None = None, run_ids: list | None = None, high_yield: int = 6) -> dict:
    """report.json's ``cache_tree`` (and ``hvd_tree`` with costs) for runs whose cache drafts carry
    trees. ``fit_paths``: tree yield fits, scored (and, with costs, switching HVD on trees) on the
    requests every one of them held out; the replay then covers those requests only."""
    from svt.fit import Fitter, evaluation_mask, name_fits
    from svt.fit.yield_data import load_cache_trees, tree_positions

    nodes = load_cache_trees(runs, rows)
    pos = tree_positions(rows, nodes)
    out = {"cache_tree": {"nodes": nodes.height, "trees": int((pos["tree_size"] > 0).sum()),
                          "opportunity": opportunity(pos), "calibration": calibration(nodes, n_bins), "yield": None},
           "hvd_tree": None}
    fit_paths = list(fit_paths or [])
    fits = [Fitter.load(p) for p in fit_paths]
    names = name_fits(fit_paths, [f.name for f in fits])
    keep = np.ones(pos.height, dtype=bool)
    for fit in fits:
        keep &= evaluation_mask(fit, pos, list(run_ids or [None] * len(runs)), [Path(r) for r in runs])
    scored = pos.filter(pl.Series(keep))
    total = pos.select("_run", "request").unique().height
    n_req = scored.select("_run", "request").unique().height
    if fits and n_req < 2:
        raise DataError(f"The tree yield fits hold out {n_req} of the {total} requests: too few to score them on.")
    coverage = (f"all {total} requests" if n_req == total else
                f"the {n_req} requests every tree yield fit held out (of {total}; the others trained a fit)")
    preds = {"tree score": scored["tree_score"].to_numpy().astype(np.float64)}
    preds.update({n: f.predict(scored) for n, f in zip(names, fits, strict=True)})
    drafted = scored["tree_size"].to_numpy() > 0
    y = scored["tree_yield"].to_numpy()[drafted]
    out["cache_tree"]["yield"] = {"coverage": coverage, "high_yield": high_yield, "predictors": {
        n: {"kind": "rule" if n == "tree score" else "fit", **yield_block(y, p[drafted], high_yield, curve=False)}
        for n, p in preds.items()}}
    if costs is not None:
        out["hvd_tree"] = hvd_tree(scored, k, costs, {n: p for n, p in preds.items() if n != "tree score"})
        out["hvd_tree"]["coverage"] = coverage
    return out


def cache_tree_markdown(report: dict) -> list[str]:
    """report.md's suffix-tree sections."""
    from svt.report.text import cost_warnings, fmt, md_table, with_request_ci

    ct = report.get("cache_tree")
    if not ct:
        return []
    lines = ["## Suffix-tree drafts against chain drafts\n",
             f"**Covers all requests.** {ct['trees']:,} tree drafts ({ct['nodes']:,} nodes), proposed by "
             "SuffixDecoding (arctic-inference, `use_tree_spec`) from the same cache state as each position's "
             "chain draft, both labelled by greedy verification against the output. Yield: accepted tokens "
             "(the tree's deepest matched path); per node / per token: accepted tokens per drafted token "
             "verified; predicted: the mean score (the sum of the cache's probabilities, an expected yield).\n",
             md_table(["group", "positions", "with tree", "mean tree nodes", "mean chain len", "tree yield",
                       "chain yield", "tree > chain", "chain > tree", "yield / tree node", "yield / chain token",
                       "predicted tree", "predicted chain"],
                      [[g, fmt(o["positions"]), fmt(o["tree_share"], 3), fmt(o["mean_tree_size"], 2),
                        fmt(o["mean_chain_len"], 2), fmt(o["mean_tree_yield"], 3), fmt(o["mean_chain_yield"], 3),
                        fmt(o["tree_beats_chain"], 3), fmt(o["chain_beats_tree"], 3),
                        fmt(o["tree_yield_per_node"], 3), fmt(o["chain_yield_per_token"], 3),
                        fmt(o["predicted_tree_yield"], 3), fmt(o["predicted_chain_yield"], 3)]
                       for g, o in ct["opportunity"].items()]), ""]
    cal = ct["calibration"]
    a = cal["all"]
    lines += ["### Are the suffix tree's probabilities calibrated?\n",
              "Each node's probability (the tree's estimate of reaching it) against whether it lies on the "
              f"accepted path; {cal['left_out_beyond_response']:,} nodes deeper than the response goes have no "
              f"label and are left out. All nodes: rate {fmt(a['rate'], 3)}, mean probability "
              f"{fmt(a['mean_pred'], 3)}, AUC {fmt(a['auc'], 3)}, ECE {fmt(a['ece'], 4)}.\n",
              md_table(["depth", "nodes", "on-path rate", "mean prob", "AUC", "log-loss", "ECE"],
                       [[f">= {r['depth']}" if r["pooled"] else str(r["depth"]), fmt(r["n"]), fmt(r["rate"], 3),
                         fmt(r["mean_pred"], 3), fmt(r["auc"], 3), fmt(r["log_loss"], 3), fmt(r["ece"], 4)]
                        for r in cal["by_depth"]]), ""]
    yl = ct.get("yield")
    if yl:
        lines += ["### Tree yield predictors\n",
                  f"**Covers {yl['coverage']}.** The accepted length of the tree draft at positions with a tree, "
                  "predicted by the tree's raw score and by tree yield fits (`svt fit RUN --model "
                  f"tree-yield-mlp`); high yield = accepted length >= {yl['high_yield']}.\n",
                  md_table(["predictor", "kind", "MSE", "MAE", "precision", "recall", "F1", "AP", "trees"],
                           [[n, b["kind"], fmt(b["mse"], 3), fmt(b["mae"], 3), fmt(b["precision"], 3),
                             fmt(b["recall"], 3), fmt(b["f1"], 3), fmt(b["average_precision"], 3), fmt(b["n"])]
                            for n, b in yl["predictors"].items()]), ""]
    hv = report.get("hvd_tree")
    if hv:
        lines += ["### End to end: HVD with tree cache drafts\n",
                  f"**Covers {hv.get('coverage', 'all requests')}.** "
                  f"Costs: `{hv['costs']['path']}` ({hv['costs']['kind']}). {hv['requests']} requests, K = {hv['k']}; "
                  f"{hv['note']}. Each source switched by its own score across τ (tree drafts also by each tree "
                  "yield fit). Brackets: 2.5 and 97.5 percentiles over request-level bootstrap resamples (chain "
                  "and tree rows on the same resamples).\n",
                  *cost_warnings(hv["costs"]),
                  md_table(["group", "policy", "cycles / 1000 tok", "tokens / cycle", "cache cycles",
                            "speed-up vs greedy", "vs model-only"],
                           [[r["group"], r["policy"], with_request_ci(r, "cycles_per_1000", 1),
                             fmt(r["mean_accepted_length"], 3), fmt(r["cache_share"], 3),
                             with_request_ci(r, "speedup_vs_greedy"), with_request_ci(r, "speedup_vs_model")]
                            for r in hv["rows"]]
                           + [[b["group"], f"hvd {b['predictor']} best τ={b['tau']:g}",
                               with_request_ci(b, "cycles_per_1000", 1), "", fmt(b["cache_share"], 3),
                               with_request_ci(b, "speedup_vs_greedy"), with_request_ci(b, "speedup_vs_model")]
                            for b in hv["best"]]), ""]
    return lines
