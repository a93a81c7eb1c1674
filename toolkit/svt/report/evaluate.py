"""`svt evaluate`: the feature table (metrics overall, per position, excluding the first position),
soft-label variants, acceptance by position, expected-length calibration and the losslessness
audit, as one report dict (written as report.json and report.md)."""

from __future__ import annotations

import datetime as dt
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from svt import __version__
from svt.errors import DataError
from svt.features import DEFAULT_FEATURES, Feature, check_feature, get_feature, load_feature_module
from svt.metrics.ordered import order_keys, pack_rows, score_tables
from svt.metrics.tables import ScoreData, acceptance_by_position, length_calibration, score_table
from svt.report.lossless_audit import audit
from svt.traces.io import open_run, open_runs

SOFT_LABELS = ("accept_prob", "accept_prob_expected")


@dataclass
class EvaluateOptions:
    features: list[str] = field(default_factory=lambda: list(DEFAULT_FEATURES))
    feature_module: str | None = None
    n_bins: int = 10
    bootstrap: int = 0
    seed: int = 0
    by: str | None = None  # a drafts column to group by, e.g. workload
    fits: list[str] = field(default_factory=list)  # fit files to score beside the features
    costs: str | None = None  # a cost table: adds the Adaptive Verification replay
    live: str | None = None  # a run collected with live AV: its tokens/step against the replay
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    high_yield: int = 6  # yield predictors: "high yield" is oracle_accepted >= this


def load_drafts(runs: list[Path]) -> tuple[pl.DataFrame, pl.DataFrame | None, list[dict]]:
    """Drafts (with a ``run`` column) and dists of one or more runs, validated."""
    frames, dists, infos = [], [], []
    names = [Path(r).name for r in runs]
    if len(set(names)) != len(names):
        names = [str(r) for r in runs]
    for i, (path, name, run) in enumerate(zip(runs, names, open_runs(runs), strict=True)):
        frames.append(run.uncensored_drafts().with_columns(pl.lit(name).alias("run"), pl.lit(i).alias("_run")))
        if run.has("dists"):
            dists.append(run.scan("dists").with_columns(pl.lit(name).alias("run")))
        meta = run.meta
        infos.append({"run": name, "path": str(path), "run_id": meta.get("run_id"),
                      "sampling": meta.get("sampling"), "k": meta.get("k"),
                      "models": {k: v.get("path") for k, v in meta.get("models", {}).items()
                                 if isinstance(v, dict)},
                      "counts": meta.get("counts"),
                      "experiment": experiment(meta),
                      "labels": ("live AV run: only explored steps (every draft verified) are used"
                                 if run.censored else "complete (every step verified its drafts)"),
                      "shards": ("verified against run.json" if run.verified
                                 else "not verified: run.json records no shards (a foreign or older run)")})
    drafts = pl.concat(frames).collect()
    for i, info in enumerate(infos):
        info["data_sha256"] = data_fingerprint(drafts.filter(pl.col("_run") == i))
    return drafts, (pl.concat(dists).collect() if dists else None), infos


REPORT_SCHEMA = 1  # report.json's layout; `svt compare` refuses reports of another schema


def data_fingerprint(drafts: pl.DataFrame) -> str:
    """SHA-256 (16 hex digits) of the drafts a report scored: ids, tokens, labels and the draft's
    probabilities, in a fixed order, from the raw bytes (stable across polars versions). Two reports
    with equal fingerprints scored the same draw, so their differences are not sampling noise."""
    import hashlib

    cols = [c for c in ("request", "step", "position", "token", "label", "q_max", "q_sampled", "q_entropy")
            if c in drafts.columns]
    d = drafts.select(cols).sort("request", "step", "position")
    h = hashlib.sha256()
    for c in cols:
        col = d[c]
        h.update(c.encode())
        h.update(col.is_null().to_numpy().tobytes())
        h.update(col.fill_null(0).to_numpy().tobytes())
    return h.hexdigest()[:16]


def experiment(meta: dict) -> dict:
    """What defines a run as an experiment (two runs with equal experiments are draws of the same
    thing and may be compared): the models' weights, K, sampling, the workloads' contents and the
    sizes. Not the seed, batch size or device, which change the draw but not what is measured."""
    cfg = meta.get("config") or {}
    models = meta.get("models") or {}
    sampling = meta.get("sampling") or {}
    return {"target_weights": (models.get("target") or {}).get("weights_sha256_16"),
            "draft_weights": (models.get("draft") or {}).get("weights_sha256_16"),
            "k": meta.get("k"), "temperature": sampling.get("temperature", cfg.get("temperature")),
            "top_p": sampling.get("top_p", cfg.get("top_p")),
            "workloads": meta.get("workload_sha256") or cfg.get("workloads"),
            "requests": cfg.get("requests"), "max_new_tokens": cfg.get("max_new_tokens"),
            "max_prompt_tokens": cfg.get("max_prompt_tokens")}


def _feature_block(labelled: pl.DataFrame, feat: Feature, opts: EvaluateOptions,
                   orders: list[np.ndarray], cache: dict) -> dict:
    if feat.partial:  # a fitted predictor: only the rows it may be scored on
        labelled = labelled.filter(feat.expr.is_not_null())
    scores = (cache["_scores"][feat.name] if feat.name in cache.get("_scores", {})
              else labelled.select(feat.expr.cast(pl.Float64).alias("s"))["s"].to_numpy())
    if not np.isfinite(scores).all():
        raise DataError(f"Feature {feat.name!r} gives {int((~np.isfinite(scores)).sum())} NaN/inf "
                        "values on labelled drafts.")
    if feat.probability and ((scores < 0) | (scores > 1)).any():
        raise DataError(f"Feature {feat.name!r} is declared a probability but gives "
                        f"{int(((scores < 0) | (scores > 1)).sum())} values outside [0, 1] (min {scores.min():.4g}, "
                        f"max {scores.max():.4g}); declare it `probability=False` or fix it.")
    if feat.direction < 0:  # lower means accept: every AUC (and ROC) is of the negated value
        scores = -scores
    if feat.partial:
        cols = _columns(labelled)
    else:
        cols = cache["_cols"]
    key = order_keys(scores, orders)  # a monotone transform of an earlier score shares its sort
    table = score_tables(scores, cols["label"], cols["position"], probability=feat.probability,
                         n_bins=opts.n_bins, soft={c: cols[c] for c in SOFT_LABELS}, key=key,
                         packed=cols["_packed"], shared=cols.setdefault("_shared", {}))
    del table["_key"]
    if opts.bootstrap:
        y = cols["label"].astype(np.float64)
        order = (key & np.uint64(0xFFFFFFFF)).astype(np.intp)
        d = ScoreData(y, scores, cols["position"], cols["_req"], order, {})
        cis = score_table(d, probability=feat.probability, n_bins=opts.n_bins, bootstrap=opts.bootstrap,
                          seed=opts.seed)
        table["overall"]["ci95"] = cis["overall"]["ci95"]
        table["excluding_first"]["ci95"] = cis["excluding_first"]["ci95"]
        for k, block in table["per_position"].items():
            block["ci95"] = cis["per_position"][k]["ci95"]
    block = {"lossless": feat.lossless, "probability": feat.probability, "direction": feat.direction,
             "shown_as": feat.shown_as, "description": feat.description, **table.pop("overall")}
    block["excluding_first"] = table["excluding_first"]
    block["per_position"] = table["per_position"]
    block["curves"] = table["curves"]
    block["soft"] = table["soft"]
    if feat.direction < 0:
        _add_raw_auc(block)
    return block


def _add_raw_auc(block: dict) -> None:
    """Beside each AUC of a negated feature, the AUC of its raw value: 1 - AUC exactly (ties count
    one half either way)."""
    if block.get("auc") is not None:
        block["auc_raw"] = 1.0 - block["auc"]
    for key, sub in block.items():
        if key in ("curves", "ci95", "reasons"):
            continue
        if isinstance(sub, dict):
            _add_raw_auc(sub)


def _columns(labelled: pl.DataFrame) -> dict:
    cols = {c: labelled[c].to_numpy() for c in ("label", "position", "_req", *SOFT_LABELS)}
    cols["_packed"] = pack_rows(cols["label"], cols["position"], {c: cols[c] for c in SOFT_LABELS})
    return cols


def _features_table(labelled: pl.DataFrame, feats: list[Feature], opts: EvaluateOptions) -> dict:
    if labelled.height == 0:
        raise DataError("No labelled drafts: every draft's label is null, nothing to evaluate.")
    orders: list[np.ndarray] = []
    cache: dict = {"_cols": _columns(labelled)}
    # every complete feature in one polars pass (polars runs the expressions in parallel)
    whole = [f for f in feats if not f.partial]
    frame = labelled.select([f.expr.cast(pl.Float64).alias(f"_f{i}") for i, f in enumerate(whole)])
    cache["_scores"] = {f.name: frame[f"_f{i}"].to_numpy() for i, f in enumerate(whole)}
    # numpy releases the GIL in sorts and array arithmetic: features run on a small thread pool
    # (sharing sorts: a feature monotone in an earlier one reuses its order when it is ready)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        blocks = list(pool.map(lambda f: _feature_block(labelled, f, opts, orders, cache), feats))
    return {f.name: b for f, b in zip(feats, blocks, strict=True)}


def _add_fits(drafts: pl.DataFrame, runs, infos, fits: list[str]) -> tuple[pl.DataFrame, list[Feature]]:
    """A column of predictions per fit (null where the fit may not be scored) and its Feature."""
    if not fits:
        return drafts, []
    from svt.fit import estimator, evaluation_mask, load_drafts_for_fit, load_fit, predict

    replay, _ = load_drafts_for_fit([Path(r) for r in runs])
    keys = ["_run", "request", "step", "position"]
    feats = []
    for i, path in enumerate(fits):
        fit = load_fit(path)
        fit["_runs"] = [Path(r) for r in runs]
        pred = predict(fit, replay)
        ok = evaluation_mask(fit, replay, [r["run_id"] for r in infos])
        col = f"_fit{i}"
        scored = replay.select(keys).with_columns(pl.Series(col, np.where(ok, pred, np.nan)).fill_nan(None))
        drafts = drafts.join(scored, on=keys, how="left", maintain_order="left")
        est = estimator(fit)
        lossless = est.lossless  # a head reads the drafter's context, not the token: lossless
        label = est.label()
        label = label if label not in [f.name for f in feats] else f"{label} [{Path(path).stem}]"
        how = "prequential" if fit["model"] == "irls-online" else fit.get("training", {}).get("evaluation", "")
        feats.append(Feature(label, pl.col(col), f"fitted predictor {Path(path).name} ({how})",
                             lossless, probability=True, partial=True))
    return drafts, feats


def _split_fits(paths: list[str]) -> tuple[list[str], list[str]]:
    """Acceptance fits (scored on drafts) and yield fits (scored on cache drafts)."""
    from svt.fit import estimator, load_fit

    acc, yld = [], []
    for p in paths:
        (yld if estimator(load_fit(p)).target == "yield" else acc).append(p)
    return acc, yld


def _live_run(opts: EvaluateOptions, feats: list[Feature]) -> dict:
    """Tokens per step of a live-AV run (its trimmed steps), to set against the replay of the same
    predictor at the same concurrency."""
    run = open_run(opts.live)
    av = run.meta.get("av")
    if not av:
        raise DataError(f"{opts.live}: not collected with live AV (no `av` in run.json).")
    fit_path = Path(av["fit"]).resolve()
    match = [i for i, f in enumerate(opts.fits) if Path(f).resolve() == fit_path]
    if not match:
        raise DataError(f"{opts.live} trimmed with {av['fit']}; pass that fit with --fit to replay it.")
    fit_feats = [f for f in feats if f.partial]
    steps = run.scan("steps").filter(~pl.col("explored")).select(
        (pl.col("accepted") + 1).mean().alias("t"), pl.len().alias("n"), pl.col("kept").mean().alias("kept")
    ).collect().row(0, named=True)
    return {"run": str(opts.live), "fit": av["fit"], "predictor": fit_feats[match[0]].name,
            "rule": av.get("rule", "engine"),  # runs made before the lossless rule used the engine's
            "batch_size": int(run.meta["config"]["batch_size"]), "trimmed_steps": steps["n"],
            "live_tokens_per_step": steps["t"], "live_mean_kept": steps["kept"],
            "note": "tokens per step = accepted + 1 on the live run's AV (non-explored) steps; the "
                    "replay applies the same predictor and costs to the complete trace"}


def _simulation(drafts: pl.DataFrame, feats: list[Feature], opts: EvaluateOptions) -> dict:
    """AV replay with every lossless probability score as a predictor, on the requests all of them
    may be scored on (held-out requests when an offline fit is among them)."""
    from svt.simulate import build_trace, load_costs, replay

    costs = load_costs(opts.costs)
    # lossy scores (the q_sampled family) are not candidates: trimming on them biases the output
    preds = [f for f in feats if f.probability and f.lossless]
    frame = drafts.with_columns(*(f.expr.alias(f"_p{i}") for i, f in enumerate(preds)))
    scored = pl.all_horizontal(*(pl.col(f"_p{i}").is_not_null() for i in range(len(preds)))) if preds else pl.lit(True)
    ok = frame.group_by("_run", "request").agg(scored.all().alias("_ok"))
    frame = frame.join(ok.filter("_ok"), on=["_run", "request"], how="semi")
    if frame.height == 0:
        raise DataError("No request is scored by every predictor: nothing to simulate.")
    trace = build_trace(frame, {f.name: f"_p{i}" for i, f in enumerate(preds)})
    costs.check_covers(trace.k, f"{opts.costs}: ")
    concurrency = tuple(opts.concurrency)
    live = _live_run(opts, feats) if opts.live else None
    if live and live["batch_size"] not in concurrency:
        concurrency = tuple(sorted({*concurrency, live["batch_size"]}))
    points = replay(trace, costs, concurrency=concurrency, engine_rule=True)
    if live:
        suffix = " [engine rule]" if live["rule"] == "engine" else ""
        rep = next(p for p in points if p["policy"] == f"AV {live['predictor']}{suffix}"
                   and p["concurrency"] == live["batch_size"])
        live["replayed_tokens_per_step"] = float(rep["tokens_per_step"])
        live["gap"] = live["live_tokens_per_step"] - float(rep["tokens_per_step"])
    return {"live_check": live, "rules": _rule_audit(trace, costs, preds, points, concurrency),
            "costs": {"path": str(opts.costs), "kind": costs.kind, "drafter": costs.drafter,
                      "description": costs.description.strip(), "fingerprint": costs.fingerprint()},
            "requests": int(trace.request.max()) + 1, "request_steps": int(trace.a.size),
            "k": trace.k, "predictors": [f.name for f in preds], "points": points}


def _rule_audit(trace, costs, preds: list[Feature], points: list[dict], concurrency) -> list[dict]:
    """Per concurrency: how non-convex the verify-cost curve is over a step's token range, how often
    the engine rule's decision for a draft flips with the request's own later confidences (and the
    lossless rule's, which must be 0), and the throughput the lossless rule gives up."""
    from svt.simulate.av import flip_rate, non_convexity

    rows = []
    for B in concurrency:
        row = {"concurrency": B, "non_convexity": non_convexity(costs, B, trace.k)}
        if preds:
            name = preds[0].name
            row["predictor"] = name
            row["engine_flip"] = flip_rate(trace, name, costs, B, rule="engine", max_steps=40)
            row["convex_flip"] = flip_rate(trace, name, costs, B, rule="convex", max_steps=40)
            by = {p["policy"]: p for p in points if p["concurrency"] == B}
            lossless, engine = by[f"AV {name}"]["throughput"], by[f"AV {name} [engine rule]"]["throughput"]
            row["throughput_convex"], row["throughput_engine"] = lossless, engine
            row["throughput_given_up"] = 1 - lossless / engine
        rows.append(row)
    return rows


def evaluate(runs: list[str | Path], opts: EvaluateOptions | None = None) -> dict:
    """Build the evaluation report for one or more run directories."""
    opts = opts or EvaluateOptions()
    if opts.feature_module:
        load_feature_module(opts.feature_module)
    feats = [get_feature(n) for n in opts.features]
    drafts, dists, infos = load_drafts([Path(r) for r in runs])
    for f in feats:
        check_feature(f, drafts)
    if opts.by is not None and opts.by not in drafts.columns:
        raise DataError(f"Cannot group by {opts.by!r}: the drafts table has no such column "
                        f"(columns: {', '.join(drafts.columns)}).")
    drafts = drafts.with_columns(pl.struct("run", "request").rank("dense").alias("_req"))
    acc_fits, yield_fits = _split_fits(opts.fits)
    drafts, fit_feats = _add_fits(drafts, runs, infos, acc_fits)
    feats = feats + fit_feats
    labelled = drafts.filter(pl.col("label").is_not_null())
    report: dict = {
        "report_schema": REPORT_SCHEMA,
        "svt_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": infos,
        "settings": {"features": opts.features, "n_bins": opts.n_bins, "bootstrap": opts.bootstrap,
                     "seed": opts.seed, "by": opts.by, "labels": "hard labels (label not null)",
                     "soft_labels": list(SOFT_LABELS)},
        "features": _features_table(labelled, feats, opts),
    }
    steps = drafts.group_by("run", "request", "step").agg((pl.col("label") == 1).sum().alias("a"))
    report["acceptance"] = {
        "labelled": labelled.height,
        "rate": float(labelled["label"].mean()),
        "mean_acceptance_length": float(1 + steps["a"].mean()),
        "by_position": acceptance_by_position(drafts).to_dicts(),
    }
    report["length_calibration"] = {
        f.name: length_calibration(drafts.with_columns(f.expr.alias("_c")).filter(pl.col("_c").is_not_null()), "_c",
                                   n_bins=opts.n_bins, keys=("run", "request", "step"))
        for f in feats if f.probability
    }
    if dists is not None and dists.height:
        audit_rows = {}
        for f in feats:
            if f.partial:  # fitted predictors: see the lossless flag of their feature
                continue
            thr = float(labelled.select(f.expr.median()).item())
            audit_rows[f.name] = {"lossless": f.lossless, **audit(drafts, dists, f, thr)}
        report["lossless_bias"] = audit_rows
    else:
        report["lossless_bias"] = None
    report["simulation"] = _simulation(drafts, feats, opts) if opts.costs else None
    has_cache = [open_run(r, deep=False, tables=["requests", "cache_drafts"]).has("cache_drafts") for r in runs]
    if yield_fits or all(has_cache):
        from svt.report.hvd import hvd_report

        report.update(hvd_report([Path(r) for r in runs], yield_fits, [i["run_id"] for i in infos],
                                 costs_path=opts.costs, high_yield=opts.high_yield))
        report["settings"]["high_yield"] = opts.high_yield
    else:
        report.update({"cache": None, "yield": None, "hvd": None})
    groups = []
    if len(infos) > 1:
        groups.append("run")
    if opts.by and opts.by != "run":
        groups.append(opts.by)
    report["groups"] = {}
    for g in groups:
        report["groups"][g] = {
            str(key): _features_table(part, feats, EvaluateOptions(**{**opts.__dict__, "fits": []}))
            for key, part in sorted(((k[0], v) for k, v in labelled.group_by(g)), key=lambda kv: str(kv[0]))
        }
        for blocks in report["groups"][g].values():  # figures draw the overall curves only
            for block in blocks.values():
                block.pop("curves", None)
    return report
