"""The Hybrid Verified Decoding half of `svt evaluate`: cache opportunity per workload, yield
predictors scored on held-out requests (fits and the raw ``match_len`` / ``score`` rules), and the
HVD replay across τ (report.json keys ``cache``, ``yield`` and ``hvd``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import DataError
from svt.features.cache import YIELD_RULES
from svt.metrics.yields import yield_block
from svt.traces.io import open_run


def cache_opportunity(rows: pl.DataFrame, high_yield: int) -> dict:
    """Per workload and overall: share of positions with a cache draft, the yield distribution,
    and how concentrated high-yield drafts are (their share of drafts and of cache-accepted tokens)."""
    out = {}
    for group, part in [("all", rows), *sorted(((k[0], v) for k, v in rows.group_by("workload")),
                                               key=lambda kv: str(kv[0]))]:
        drafted = part.filter(pl.col("draft_len") > 0)
        y = drafted["oracle_accepted"].to_numpy().astype(np.int64)
        total = int(y.sum())
        top = np.sort(y)[::-1][: max(1, int(np.ceil(0.1 * y.size)))] if y.size else np.zeros(0)
        out[str(group)] = {
            "positions": part.height, "with_draft": drafted.height,
            "draft_share": drafted.height / part.height if part.height else float("nan"),
            "mean_draft_len": float(drafted["draft_len"].mean()) if drafted.height else float("nan"),
            "mean_yield": float(y.mean()) if y.size else float("nan"),
            "zero_yield_share": float(np.mean(y == 0)) if y.size else float("nan"),
            # at the same positions as the cache yield (those with a cache draft), as the report says
            "mean_model_yield": float(drafted["model_accepted"].mean()) if drafted.height else float("nan"),
            "mean_model_yield_all_positions": float(part["model_accepted"].mean()) if part.height else float("nan"),
            "yield_histogram": np.bincount(y, minlength=1).tolist() if y.size else [],
            "high_yield_share": float(np.mean(y >= high_yield)) if y.size else float("nan"),
            "high_yield_token_share": float(y[y >= high_yield].sum() / total) if total else float("nan"),
            "top10_token_share": float(top.sum() / total) if total else float("nan"),
            "from_global_share": float(drafted["from_global"].mean()) if drafted.height else float("nan"),
        }
    return out


def _scores(fit_dicts: list[dict], fit_paths: list[str], rows: pl.DataFrame, drafted: pl.DataFrame,
            run_ids: list, runs: list[Path]) -> tuple[dict[str, np.ndarray], set]:
    """Predictions of every yield fit and rule on all rows, and the (run, request) keys every fit may
    be scored on (its held-out requests, or all for runs it never saw)."""
    from svt.fit import PredictContext, evaluation_mask, name_fits

    preds: dict[str, np.ndarray] = {}
    names = name_fits(fit_paths, [f.name for f in fit_dicts])
    keys = set(map(tuple, rows.select("_run", "request").unique().rows()))
    for fit, name in zip(fit_dicts, names, strict=True):
        # a request without any draft was never trained on: every fit may score it
        ok = evaluation_mask(fit, rows, run_ids, runs)
        keys &= set(map(tuple, rows.filter(pl.Series(ok)).select("_run", "request").unique().rows()))
        preds[name] = fit.predict(rows, PredictContext(runs=[Path(r) for r in runs]))
    for rule in YIELD_RULES:
        preds[rule] = rows[rule].to_numpy().astype(np.float64)
    if not keys:
        raise DataError("No request is held out by every yield fit: nothing to score them on.")
    return preds, keys


def _sweeps(rows: pl.DataFrame, preds: dict[str, np.ndarray], keys: set, k: int, costs, seed: int):
    """The strength map and the two-sided switch, with τ chosen on other requests than those scored:
    a fit's training requests when it has any here, else a seeded half of the requests."""
    from svt.simulate.hvd import HVDRequest
    from svt.simulate.hvd_sweep import Split, strength_map, two_sided

    fits = [n for n in preds if n not in YIELD_RULES]
    name = fits[0] if fits else "score"
    reqs, pr, ids, cols, order = [], [], [], [], []
    for (run, req), part in rows.with_columns(pl.Series("_pred", preds[name])).sort(
            "_run", "request", "decode_pos").group_by("_run", "request", maintain_order=True):
        reqs.append(HVDRequest(str(part["workload"][0]), part["draft_len"].to_numpy(),
                               part["oracle_accepted"].to_numpy(), part["model_accepted"].to_numpy(),
                               part["lookup_ms"].to_numpy().astype(np.float64)))
        pr.append(part["_pred"].to_numpy().astype(np.float64))
        ids.append(int(run) * 1_000_003 + int(req))
        cols.append({c: part[c].to_numpy().astype(np.float64) for c in ("draft_len", "match_len", "score")})
        order.append((run, req))
    score = [i for i, key in enumerate(order) if key in keys]
    choose = [i for i, key in enumerate(order) if key not in keys]
    how = (f"τ chosen on the {len(choose)} requests a yield fit was trained on, scored on the {len(score)} every "
           "fit held out")
    if not choose:
        perm = np.random.default_rng(seed).permutation(len(score))
        half = len(score) // 2
        choose, score = sorted(score[i] for i in perm[:half]), sorted(score[i] for i in perm[half:])
        how = (f"τ chosen on a seeded half of the requests ({len(choose)}), scored on the other "
               f"{len(score)} ({name} has no training requests in these runs)")
    if len(choose) < 2 or len(score) < 2:
        note = "too few requests to choose τ on some and score it on others"
        return {"note": note}, {"note": note}
    split = Split(choose, score, how)
    hmap = {"predictor": name, "split": how, "k": k, "seed": seed,
            "drafter": "stand-in: conditional acceptance a at every position, drawn per position (seeded)",
            "rows": strength_map(reqs, pr, ids, k, costs, split, seed)}
    two = {"predictor": name, "split": how, **two_sided(reqs, pr, cols, k, costs, split, seed)}
    return hmap, two


def hvd_report(runs: list[Path], fit_paths: list[str], run_ids: list, *, costs_path: str | None,
               high_yield: int = 6, seed: int = 0, n_bins: int = 10) -> dict:
    """report.json's ``cache``, ``yield`` and ``hvd`` entries for the runs and yield fits (and
    ``cache_tree`` / ``hvd_tree`` when every run's cache drafts carry trees)."""
    from svt.fit import Fitter

    tree_fits = [p for p in fit_paths if Fitter.load(p).table == "cache_trees"]
    report = _hvd_report(runs, [p for p in fit_paths if p not in tree_fits], run_ids, costs_path=costs_path,
                         high_yield=high_yield, seed=seed)
    has = [open_run(r, deep=False, tables=["requests", "cache_trees"]).has("cache_trees") for r in runs]
    if tree_fits and not all(has):
        raise DataError(f"{tree_fits[0]} predicts the yield of tree cache drafts, which "
                        f"{runs[has.index(False)]} does not have (add them with `svt cache RUN --set tree=true`).")
    if any(has):
        if not all(has):
            raise DataError("Some of these runs have cache trees and some do not: evaluate the tree runs "
                            "together, or redo the others with `svt cache RUN --set tree=true`.")
        from svt.fit.yield_data import load_cache_drafts_for_fit
        from svt.report.cache_trees import cache_tree_report
        from svt.simulate.cost_files import load_costs

        rows, _ = load_cache_drafts_for_fit(runs, with_empty=True)
        k = open_run(runs[0], deep=False, tables=["requests"]).meta["k"]
        costs = load_costs(costs_path) if costs_path else None
        report.update(cache_tree_report(runs, rows, k, costs, n_bins, tree_fits, run_ids, high_yield))
        if costs is not None:
            report["hvd_tree"]["costs"] = {"path": str(costs_path), "kind": costs.kind,
                                           "fingerprint": costs.fingerprint(),
                                           "warnings": list(costs.measurement.get("warnings", []))}
    return report


def _hvd_report(runs: list[Path], fit_paths: list[str], run_ids: list, *, costs_path: str | None,
                high_yield: int = 6, seed: int = 0) -> dict:
    from svt.fit import Fitter
    from svt.fit.yield_data import load_cache_drafts_for_fit

    rows, _ = load_cache_drafts_for_fit(runs, with_empty=True)
    metas = [open_run(r, deep=False, tables=["requests"]).meta for r in runs]
    ks = {m["k"] for m in metas}  # checked to be a valid int by the loader
    if len(ks) != 1:
        raise DataError(f"The runs were drafted with different K ({sorted(ks)}): replay them separately.")
    k = ks.pop()
    batch_sizes = sorted({int((m.get("config") or {}).get("batch_size", 1) or 1) for m in metas})
    drafted = rows.filter(pl.col("draft_len") > 0)
    if drafted.height == 0:
        if fit_paths:
            raise DataError("The cache proposed no draft in these runs: no yield fit can be scored.")
        return {"cache": cache_opportunity(rows, high_yield), "yield": None, "hvd": None}
    fits = [Fitter.load(p) for p in fit_paths]
    preds, keys = _scores(fits, fit_paths, rows, drafted, run_ids, runs)
    keys_df = pl.DataFrame(sorted(keys), schema={"_run": rows.schema["_run"], "request": pl.Int64}, orient="row")
    ev = (rows.with_columns(**{f"_p_{i}": pl.Series(v) for i, v in enumerate(preds.values())})
          .join(keys_df, on=["_run", "request"], how="semi"))
    names = list(preds)
    total = rows.select("_run", "request").unique().height
    coverage = (f"all {total} requests" if len(keys) == total or not fits else
                f"the {len(keys)} requests every yield fit held out (of {total}; the others trained a fit)")
    out_yield: dict = {"high_yield": high_yield, "requests": len(keys), "coverage": coverage, "predictors": {},
                       "groups": {}}
    ev_d = ev.filter(pl.col("draft_len") > 0)
    y = ev_d["oracle_accepted"].to_numpy()
    for i, n in enumerate(names):
        out_yield["predictors"][n] = {"kind": "rule" if n in YIELD_RULES else "fit",
                                      **yield_block(y, ev_d[f"_p_{i}"].to_numpy(), high_yield)}
    for (w,), part in sorted(ev_d.group_by("workload"), key=lambda kv: str(kv[0])):
        yw = part["oracle_accepted"].to_numpy()
        out_yield["groups"][str(w)] = {n: yield_block(yw, part[f"_p_{i}"].to_numpy(), high_yield, curve=False)
                                       for i, n in enumerate(names)}
    report = {"cache": cache_opportunity(rows, high_yield), "yield": out_yield, "hvd": None}
    if costs_path:
        from svt.simulate.cost_files import load_costs
        from svt.simulate.hvd import REQUEST_BOOTSTRAP, HVDRequest, best_tau, replay_hvd

        costs = load_costs(costs_path)
        costs.check_covers(k, f"{costs_path}: ")
        reqs, per_pred = [], {n: [] for n in names}
        for _, part in ev.sort("_run", "request", "decode_pos").group_by("_run", "request", maintain_order=True):
            reqs.append(HVDRequest(str(part["workload"][0]), part["draft_len"].to_numpy(),
                                   part["oracle_accepted"].to_numpy(), part["model_accepted"].to_numpy(),
                                   part["lookup_ms"].to_numpy().astype(np.float64)))
            for i, n in enumerate(names):
                per_pred[n].append(part[f"_p_{i}"].to_numpy())
        from svt.simulate.hvd import TAUS

        lives = [m["hvd"] for m in (open_run(r, deep=False, tables=["requests"]).meta for r in runs) if m.get("hvd")]
        taus = tuple(sorted({*TAUS, *(float(v["tau"]) for v in lives)}))
        points = replay_hvd(reqs, per_pred, k, costs, taus, bootstrap=REQUEST_BOOTSTRAP, seed=seed)
        from svt.simulate.hvd import cost_intervals

        refits = cost_intervals(reqs, per_pred, k, costs, taus, points)
        report["hvd_map"], report["two_sided"] = _sweeps(rows, preds, keys, k, costs, seed)
        report["hvd"] = {"costs": {"path": str(costs_path), "kind": costs.kind, "fingerprint": costs.fingerprint(),
                                   "warnings": list(costs.measurement.get("warnings", []))},
                         "k": k, "requests": len(reqs),
                         "coverage": coverage,
                         "batch_size": 1, "collected_batch_size": batch_sizes, "rows": points, "cost_refits": refits,
                         "request_bootstrap": REQUEST_BOOTSTRAP,
                         "best": best_tau(points),
                         "note": "each request replayed at batch 1; the global tree's timing follows the collection's "
                                 f"batches of {'/'.join(map(str, batch_sizes))}; τ chosen on the replayed requests "
                                 "themselves",
                         "live_check": _live_check(lives, fits, fit_paths, points, len(runs))}
    return report


def _live_check(lives: list[dict], fits: list[dict], fit_paths: list[str], points: list[dict], n_runs: int):
    """A live HVD run's cycles against the replay of the same fit and τ on its own trace."""
    if not lives:
        return None
    if n_runs != 1:
        raise DataError("Evaluate a live HVD run alone to compare it with its replay.")
    live = lives[0]
    want = Path(live["fit"]).resolve()
    names = list(dict.fromkeys(r["predictor"] for r in points if "predictor" in r))
    match = [n for n, p in zip(names, fit_paths, strict=False) if Path(p).resolve() == want]
    if not match:
        raise DataError(f"The live HVD run switched with {live['fit']}; pass that fit with --fit to replay it.")
    rep = next((r for r in points if r["group"] == "all" and r.get("predictor") == match[0]
                and r["tau"] == float(live["tau"])), None)
    if rep is None or "cycles" not in live:
        raise DataError(f"The live HVD run's τ ({live.get('tau')!r}) or its cycle count is not usable.")
    return {"fit": live["fit"], "tau": live["tau"], "live_cycles": live["cycles"], "replayed_cycles": rep["cycles"],
            "live_cycles_per_1000": live["cycles_per_1000"], "replayed_cycles_per_1000": rep["cycles_per_1000"],
            "equal": live["cycles"] == rep["cycles"]}
