"""What the report's sections compute from the runs: the options of `svt evaluate`, the runs opened
for evaluation, the feature table (metrics overall, per position, excluding the first position,
soft labels, bootstrap intervals), the fitted predictors' scores, the step tables (acceptance length
and its calibration) and the Adaptive Verification replay."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from svt.cores import available_cores
from svt.errors import DataError
from svt.features import DEFAULT_FEATURES, Feature, feature_values
from svt.metrics import ordered
from svt.metrics.ordered import bootstrap_intervals, order_keys, pack_rows, score_tables
from svt.metrics.tables import length_calibration_from_steps
from svt.traces.identity import data_identity, experiment
from svt.traces.io import common_columns, open_run, open_runs

SOFT_LABELS = ("accept_prob", "accept_prob_expected")


@dataclass
class EvaluateOptions:
    features: list[str] = field(default_factory=lambda: list(DEFAULT_FEATURES))
    feature_module: str | None = None
    n_bins: int = 10
    bootstrap: int = 0
    seed: int = 0
    replay_bootstrap: int = 0  # AV replay: request-level resamples for throughput intervals (whole replays)
    by: str | None = None  # a drafts column to group by, e.g. workload
    fits: list[str] = field(default_factory=list)  # fit files to score beside the features
    costs: str | None = None  # a cost table: adds the Adaptive Verification replay
    live: list[str] = field(default_factory=list)  # live runs of svt's engine: measured against the replay
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    high_yield: int = 6  # yield predictors: "high yield" is oracle_accepted >= this
    in_memory: bool = False  # hold the drafts in memory (they are anyway when a section needs it)
    reference_run: str | None = None  # a reference run of the same prompts: its cache statistics in the realism table
    score_unverified: bool = False  # score a fit on requests svt cannot show it did not train on (said in the report)

    def __post_init__(self):
        if isinstance(self.live, (str, Path)):  # one live run, as a path
            self.live = [str(self.live)]


@dataclass
class Opened:
    """Runs opened for evaluation: each run's drafts shard by shard (lazy, uncensored, with ``run``
    and ``_run`` columns), its dists (lazy) and the report's run blocks."""

    parts: list[list[pl.LazyFrame]]
    dists: list[pl.LazyFrame]
    infos: list[dict]
    lacks: frozenset[str] = frozenset()  # drafts columns some run's source does not carry (imports)

    @property
    def soft_labels(self) -> list[str]:
        """The soft labels every run carries."""
        return [c for c in SOFT_LABELS if c not in self.lacks]

    def missing(self, feat: Feature) -> list[str]:
        """The columns ``feat`` reads that some run lacks (then it is not computed)."""
        return sorted(set(feat.expr.meta.root_names()) & self.lacks)

    @property
    def drafts(self) -> pl.LazyFrame:
        return pl.concat([p for run_parts in self.parts for p in run_parts])


def open_for_evaluation(runs: list[Path]) -> Opened:
    """Open and validate the runs; nothing is loaded but each run's fingerprint, shard by shard."""
    parts, dists, infos, lacks = [], [], [], set()
    names = [Path(r).name for r in runs]
    if len(set(names)) != len(names):
        names = [str(r) for r in runs]
    opened = open_runs(runs)
    cols = common_columns(opened)  # a confidence head's column where every run carries one
    for i, (path, name, run) in enumerate(zip(runs, names, opened, strict=True)):
        parts.append([p.select(cols).with_columns(pl.lit(name).alias("run"), pl.lit(i).alias("_run"))
                      for p in run.uncensored_parts()])
        if run.has("dists"):
            dists.append(run.scan("dists").with_columns(pl.lit(name).alias("run")))
        meta = run.meta
        lacks |= set(run.lacks("drafts"))
        infos.append({"run": name, "path": str(path), "run_id": meta.get("run_id"),
                      "sampling": meta.get("sampling"), "k": meta.get("k"),
                      "models": {k: v.get("path") for k, v in meta.get("models", {}).items()
                                 if isinstance(v, dict)},
                      "counts": meta.get("counts"),
                      "experiment": experiment(meta),
                      **({"workload_reading": meta["workload_reading"]}
                         if isinstance(meta.get("workload_reading"), dict) else {}),
                      "synthetic": bool(meta.get("synthetic")),
                      "labels": _labels_note(run),
                      "shards": ("verified against run.json" if run.verified
                                 else "not verified: run.json records no shards (a foreign or older run)"),
                      **({"import": {k: meta["import"][k] for k in ("format", "source", "lacks", "cannot_study")
                                     if k in meta["import"]}} if isinstance(meta.get("import"), dict) else {}),
                      **_identity(parts[-1])})
    return Opened(parts, dists, infos, frozenset(lacks))


def _identity(parts) -> dict:
    ident = data_identity(parts)
    return {"data_sha256": ident["sha256"], "data_identity": ident}


def _labels_note(run) -> str:
    if run.censored:
        return "live AV run: only explored steps (every draft verified) are used"
    if run.meta.get("engine") == "vllm":
        trimmed = (run.meta.get("vllm") or {}).get("steps_trimmed")
        return ("vLLM run: every draft the engine verified is labelled; drafts its scheduler did not verify "
                f"(near max_tokens or max_model_len: {trimmed} step(s)) are not in the table")
    if run.meta.get("hvd"):
        return ("live HVD run: model drafts only from the cycles that used the model drafter (cache cycles are in "
                "cache_drafts); its steps are HVD cycles, so the AV replay is not run on it")
    if run.meta.get("engine") == "reference":
        return ("reference run: no model drafts and no target probabilities; cache drafts carry oracle yields "
                "against each prompt's reference")
    return "complete (every step verified its drafts)"


def load_drafts(runs: list[Path]) -> tuple[pl.DataFrame, pl.DataFrame | None, list[dict]]:
    """Drafts (with a ``run`` column) and dists of one or more runs, validated, in memory."""
    opened = open_for_evaluation(runs)
    return (opened.drafts.collect(), pl.concat(opened.dists).collect() if opened.dists else None,
            opened.infos)


def _feature_block(labelled: pl.LazyFrame, feat: Feature, opts: EvaluateOptions,
                   orders: list[np.ndarray], cache: dict) -> dict:
    if feat.partial:  # a fitted predictor: only the rows it may be scored on
        labelled = labelled.filter(feat.expr.is_not_null())
        cols = _columns([labelled], opts.bootstrap > 0, cache["_cols"]["soft"])
        scores = feature_values(feat, labelled)
    else:
        cols = cache["_cols"]
        scores = cache["_scores"].pop(feat.name, None)
        if feat.name in cache.get("_starts", ()):
            orders.clear()
        if scores is None:  # one feature at a time (large runs), part by part
            scores = _part_scores(cache["_parts"], feat, cache["_cols"]["counts"])
    if not np.isfinite(scores).all():
        raise DataError(f"Feature {feat.name!r} gives {int((~np.isfinite(scores)).sum())} NaN/inf "
                        "values on labelled drafts.")
    if feat.probability and ((scores < 0) | (scores > 1)).any():
        raise DataError(f"Feature {feat.name!r} is declared a probability but gives "
                        f"{int(((scores < 0) | (scores > 1)).sum())} values outside [0, 1] (min {scores.min():.4g}, "
                        f"max {scores.max():.4g}); declare it `probability=False` or fix it.")
    if feat.direction < 0:  # lower means accept: every AUC (and ROC) is of the negated value
        scores = np.negative(scores, out=scores) if scores.flags.writeable else -scores
    if cache.get("_large"):  # keep one earlier order only (8 bytes per row), rewritten in place
        del orders[:-1]
    key = order_keys(scores, orders, in_place=bool(cache.get("_large")))  # a monotone transform of an
    # earlier score shares its sort
    packed = cols["_packed"]
    table = score_tables(scores, packed["y"], packed["pos"], probability=feat.probability,
                         n_bins=opts.n_bins, soft={c: packed[c] for c in cols["soft"]}, key=key,
                         packed=packed, shared=cols.setdefault("_shared", {}))
    del table["_key"]
    if opts.bootstrap:
        cis = bootstrap_intervals(scores, packed["y"], packed["pos"], cols["_req"], probability=feat.probability,
                                  n_bins=opts.n_bins, n=opts.bootstrap, seed=opts.seed, key=key, packed=packed)
        table["overall"]["ci95"] = cis["overall"]
        table["excluding_first"]["ci95"] = cis["excluding_first"]
        for k, block in table["per_position"].items():
            block["ci95"] = cis.get(k, {})
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


def _part_scores(parts: list[pl.LazyFrame], feat: Feature, counts: list[int]) -> np.ndarray:
    """A feature's values over the parts, filled part by part: float32 while every value so far is
    exactly a float32 (q_max and the other logged probabilities), float64 from the first that is not
    (every feature expression casts to Float64, so the values decide, not the dtype)."""
    from svt.metrics.ranks_kernel import fill_float32

    out, at = None, 0
    for part, m in zip(parts, counts, strict=True):
        v = feature_values(feat, part)
        if v.size != m:
            raise DataError(f"Feature {feat.name!r}: {v.size} values on a part of {m} labelled drafts.")
        if out is None:
            out = np.empty(sum(counts), dtype=np.float32)
        if out.dtype == np.float32 and not fill_float32(v, out[at:at + m]):  # one pass: copied if exact
            out = out.astype(np.float64) if at else np.empty(out.size)  # the values so far are exact
        if out.dtype == np.float64:
            out[at:at + m] = v
        at += m
        del v
    return out if out is not None else np.empty(0)


def _columns(parts: list[pl.LazyFrame], requests: bool, soft: tuple[str, ...] | list[str] = SOFT_LABELS) -> dict:
    """Labels, positions and soft labels packed one record per row, filled part by part (and the
    request keys for the bootstrap); the separate columns are not kept."""
    soft = list(soft)  # the soft labels the runs carry
    counts = [int(p.select(pl.len()).collect().item()) for p in parts]
    n = sum(counts)
    first = parts[0].select("label", "position", *soft).head(1).collect()
    packed = np.empty(n, dtype=pack_rows(first["label"].to_numpy(), first["position"].to_numpy(),
                                         {c: first[c].to_numpy() for c in soft}).dtype)
    req = np.empty(n, dtype=np.int64) if requests else None
    at = 0
    for part, m in zip(parts, counts, strict=True):
        frame = part.select("label", "position", *soft, *(["_req"] if requests else [])).collect()
        if frame.height != m:
            raise DataError(f"A part of the drafts changed while it was read ({frame.height} rows, then {m}).")
        pack_rows(frame["label"].to_numpy(), frame["position"].to_numpy(),
                  {c: frame[c].to_numpy() for c in soft}, out=packed[at:at + m])
        if requests:
            req[at:at + m] = frame["_req"].to_numpy()
        at += m
    cols = {"_packed": packed, "n": n, "counts": counts, "soft": soft}
    if requests:
        cols["_req"] = req
    return cols


def features_table(labelled: pl.LazyFrame | pl.DataFrame, feats: list[Feature], opts: EvaluateOptions,
                    parts: list[pl.LazyFrame] | None = None, soft: list[str] | None = None) -> dict:
    """Every feature's block. ``labelled``: the labelled drafts (``parts``: the same rows in
    pieces, e.g. one per shard, read one at a time). Up to ``ordered.LARGE`` rows the features are
    computed together and scored on a thread pool; beyond, one at a time (a score, its sort keys
    and the packed rows are what memory holds: 25 to 29 bytes per labelled draft)."""
    labelled = labelled.lazy()
    parts = parts or [labelled]
    cache: dict = {"_cols": _columns(parts, opts.bootstrap > 0, SOFT_LABELS if soft is None else soft),
                   "_parts": parts}
    n = cache["_cols"]["n"]
    if n == 0:
        raise DataError("No labelled drafts: every draft's label is null, nothing to evaluate.")
    cache["_large"] = large = n > ordered.LARGE
    orders: list[np.ndarray] = []
    cache["_scores"] = {}
    if not large:  # every complete feature in one polars pass (polars runs them in parallel)
        whole = [f for f in feats if not f.partial]
        try:
            frame = labelled.select([f.expr.cast(pl.Float64).alias(f"_f{i}") for i, f in enumerate(whole)]).collect()
            values = frame.to_numpy(order="fortran")  # one copy; each column a contiguous view
            del frame
            cache["_scores"] = {f.name: values[:, i] for i, f in enumerate(whole)}
            del values
        except Exception:  # one feature fails on some row: find which, and say so (feature_values raises)
            cache["_scores"] = {f.name: feature_values(f, labelled) for f in whole}
    # numpy releases the GIL in sorts and array arithmetic: features run on a small thread pool, a
    # family per task: the features that look monotone in one another run one after the other, so
    # each reuses the order (and, when it ranks the same, the ordered pass) of the one before
    workers = 1 if large else min(4, available_cores())
    families = _monotone_families(feats, cache["_scores"] if not large else _head_scores(labelled, feats))
    # large: a feature that starts a family cannot reuse the kept order (its sample already
    # descends along it), which is freed before the feature's scores are read
    cache["_starts"] = {feats[fam[0]].name for fam in families} if large else set()

    def run(family: list[int]) -> list[dict]:
        return [_feature_block(labelled, feats[i], opts, orders, cache) for i in family]

    blocks: dict[int, dict] = {}
    if workers == 1:  # one at a time: in this thread (profilers see it)
        for family in families:
            blocks.update(zip(family, run(family), strict=True))
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for family, done in zip(families, pool.map(run, families), strict=True):
                blocks.update(zip(family, done, strict=True))
    return {f.name: blocks[i] for i, f in enumerate(feats)}


def _head_scores(labelled: pl.LazyFrame, feats: list[Feature], rows: int = 1 << 16) -> dict[str, np.ndarray]:
    """The complete features' values on the first ``rows`` labelled drafts (a schedule's sample)."""
    whole = [f for f in feats if not f.partial]
    try:
        frame = labelled.head(rows).select([f.expr.cast(pl.Float64).alias(f"_f{i}") for i, f in enumerate(whole)])
        frame = frame.collect()
    except Exception:  # a feature that fails says so when it is scored (feature_values raises)
        return {}
    return {f.name: frame[f"_f{i}"].to_numpy() for i, f in enumerate(whole)}


def _monotone_families(feats: list[Feature], scores: dict[str, np.ndarray], probe: int = 4096) -> list[list[int]]:
    """The features in groups, in order: a feature joins the group of the first earlier one along
    whose order its scores (as scored: negated when ``direction < 0``) do not descend on a fixed
    sample of rows (likely a monotone transform of it); the rest start groups. A schedule only:
    `order_keys` checks every row before it reuses an order."""
    have = [i for i, f in enumerate(feats) if f.name in scores]
    families: list[list[int]] = [[i] for i, f in enumerate(feats) if f.name not in scores]
    if not have:
        return families
    n = scores[feats[have[0]].name].size
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(probe, n), replace=False))
    sample = {i: feats[i].direction * np.asarray(scores[feats[i].name][rows], dtype=np.float64) for i in have}
    heads: list[list[int]] = []
    for i in have:
        for fam in heads:
            if (np.diff(sample[i][np.lexsort((rows, sample[fam[0]]))]) >= 0).all():
                fam.append(i)
                break
        else:
            heads.append([i])
    return heads + families


def add_fits(drafts: pl.DataFrame, runs, infos, fits: list[str]) -> tuple[pl.DataFrame, list[Feature]]:
    """A column of predictions per fit (null where the fit may not be scored) and its Feature."""
    if not fits:
        return drafts, []
    from svt.fit import Fitter, PredictContext, evaluation_mask, load_drafts_for_fit

    replay, _ = load_drafts_for_fit([Path(r) for r in runs])
    keys = ["_run", "request", "step", "position"]
    feats = []
    labels = _fit_labels(fits)
    for i, path in enumerate(fits):
        fit = Fitter.load(path)
        pred = np.asarray(fit.predict(replay, PredictContext(runs=[Path(r) for r in runs])), dtype=np.float64)
        notes: list[str] = []
        ok = evaluation_mask(fit, replay, [r["run_id"] for r in infos], [Path(r) for r in runs], notes)
        check_fit_predictions(path, replay, pred, ok)
        col = f"_fit{i}"
        scored = replay.select(keys).with_columns(pl.Series(col, np.where(ok, pred, np.nan)).fill_nan(None))
        drafts = drafts.join(scored, on=keys, how="left", maintain_order="left")
        lossless = fit.lossless  # a head reads the drafter's context, not the token: lossless
        label = labels[i]
        how = "prequential" if fit.online else fit.training_.get("evaluation", "")
        how += "".join(f"; {n}" for n in notes)
        feats.append(Feature(label, pl.col(col), f"fitted predictor {Path(path).name} ({how})",
                             lossless, probability=True, partial=True))
    return drafts, feats


def check_fit_predictions(path, replay: pl.DataFrame, pred: np.ndarray, ok: np.ndarray) -> None:
    """A prediction that is no probability, on a labelled row the fit is scored on, is an error
    (naming the first), never a row left unscored."""
    bad = ok & replay["label"].is_not_null().to_numpy() & ~(np.isfinite(pred) & (pred >= 0) & (pred <= 1))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        r = replay.row(j, named=True)
        raise DataError(f"The fit {path} predicts {pred[j]!r} for {int(bad.sum()):,} of the {int(ok.sum()):,} drafts "
                        f"it is scored on (first: run {r['_run'] + 1}, request {r['request']}, step {r['step']}, "
                        f"position {r['position']}): not a probability. Check its inputs (a feature null or "
                        "NaN there?) and the fit file.")


def _fit_labels(paths: list[str]) -> list[str]:
    from svt.fit import Fitter, name_fits

    return name_fits(paths, [Fitter.load(p).label() for p in paths])


def _live_run(path: str, opts: EvaluateOptions, feats: list[Feature]) -> dict | None:
    """Tokens per step of a live-AV run (its trimmed steps), to set against the replay of the same
    predictor at the same concurrency (None: not a live-AV run)."""
    run = open_run(path)
    av = run.meta.get("av")
    if not av or av.get("length"):  # AV+length runs are in the live table only
        return None
    fit_path = Path(av["fit"]).resolve()
    match = [i for i, f in enumerate(opts.fits) if Path(f).resolve() == fit_path]
    if not match:
        raise DataError(f"{path} trimmed with {av['fit']}; pass that fit with --fit to replay it.")
    fit_feats = [f for f in feats if f.partial]
    steps = run.scan("steps").filter(~pl.col("explored")).select(
        (pl.col("accepted") + 1).mean().alias("t"), pl.len().alias("n"), pl.col("kept").mean().alias("kept")
    ).collect().row(0, named=True)
    return {"run": str(path), "fit": av["fit"], "predictor": fit_feats[match[0]].name,
            "rule": av.get("rule", "engine"),  # runs made before the lossless rule used the engine's
            "batch_size": int(run.meta["config"]["batch_size"]), "trimmed_steps": steps["n"],
            "live_tokens_per_step": steps["t"], "live_mean_kept": steps["kept"],
            "note": "tokens per step = accepted + 1 on the live run's AV (non-explored) steps; the "
                    "replay applies the same predictor and costs to the complete trace"}


def request_outputs(runs: list) -> pl.DataFrame | None:
    """How many tokens each request of the runs decoded (``_run``, ``request``, ``tokens``): the sum
    of its engine steps' ``emitted`` in the run's steps table, drafted or not (a vLLM run's output
    also holds the token its prefill produced, which no step emits). It is the length every
    policy's replay of the request runs to. None when a run has no steps table (an imported trace):
    the replay then counts the trace's tokens."""
    parts = []
    for i, path in enumerate(runs):
        run = open_run(path, deep=False, tables=["steps"])
        if not run.has("steps"):
            return None
        part = (run.scan("steps").group_by("request").agg(pl.col("emitted").cast(pl.Int64).sum().alias("tokens"))
                .collect())
        if part.height == 0:
            return None
        parts.append(part.with_columns(pl.lit(i).alias("_run")))
    return pl.concat(parts) if parts else None


def simulation(drafts: pl.DataFrame, feats: list[Feature], opts: EvaluateOptions, metas: list[dict] | None = None,
               outputs: pl.DataFrame | None = None) -> dict:
    """AV replay with every lossless probability score as a predictor, on the requests all of them
    may be scored on (held-out requests when an offline fit is among them). ``outputs``
    (:func:`request_outputs`): each request's generated tokens, what each policy's replay emits."""
    from svt.simulate import build_trace, load_costs, replay, run_schedule, run_verification

    costs = load_costs(opts.costs)
    # lossy scores (the q_sampled family) are not candidates: trimming on them biases the output
    preds = [f for f in feats if f.probability and f.lossless]
    frame = drafts.with_columns(*(f.expr.alias(f"_p{i}") for i, f in enumerate(preds)))
    scored = pl.all_horizontal(*(pl.col(f"_p{i}").is_not_null() for i in range(len(preds)))) if preds else pl.lit(True)
    ok = frame.group_by("_run", "request").agg(scored.all().alias("_ok"))
    frame = frame.join(ok.filter("_ok"), on=["_run", "request"], how="semi")
    if frame.height == 0:
        raise DataError("No request is scored by every predictor: nothing to simulate.")
    schedule, verification = run_schedule(metas or []), run_verification(metas or [])
    trace = build_trace(frame, {f.name: f"_p{i}" for i, f in enumerate(preds)}, schedule=schedule,
                        verification=verification,
                        outputs=None if outputs is None else outputs.with_columns(pl.col("_run").cast(frame.schema["_run"])))
    costs.check_covers(trace.k, f"{opts.costs}: ")
    concurrency = tuple(opts.concurrency)
    from svt.report.live import compare_live, read_live

    fit_feats = [f for f in feats if f.partial]
    lives = [read_live(str(p), [str(f) for f in opts.fits], [f.name for f in fit_feats]) for p in opts.live]
    av_lives = [x for x in (_live_run(str(p), opts, feats) for p in opts.live) if x is not None]
    live = av_lives[0] if av_lives else None
    concurrency = tuple(sorted({*concurrency, *(x["batch_size"] for x in lives)}))
    for x in lives:
        if x["k"] > trace.k and not x["policy"].startswith("live HVD"):
            raise DataError(f"{x['run']} drafted K = {x['k']}, more than the evaluated run's K = {trace.k}: the "
                            "replay has no such policy.")
    points = replay(trace, costs, concurrency=concurrency, engine_rule=True)
    if opts.replay_bootstrap:  # each resample is a whole replay: seconds each at CI size, opt-in
        from svt.simulate.av import replay_intervals

        replay_intervals(trace, costs, points, n=opts.replay_bootstrap, seed=opts.seed, engine_rule=True)
    from svt.simulate.av import cost_intervals

    decisions: list[dict] = []  # whether each batch size's winner holds over the cost model's refits
    refits = cost_intervals(trace, costs, points, decisions=decisions)  # when the table keeps its refits
    if live:
        suffix = " [engine rule]" if live["rule"] == "engine" else ""
        rep = next(p for p in points if p["policy"] == f"AV {live['predictor']}{suffix}"
                   and p["concurrency"] == live["batch_size"])
        live["replayed_tokens_per_step"] = float(rep["tokens_per_step"])
        live["gap"] = live["live_tokens_per_step"] - float(rep["tokens_per_step"])
    live_runs = compare_live(lives, points, costs) if lives else None
    if live_runs:
        for r in live_runs["runs"]:
            if r["schedule"] != schedule:
                r["schedule_note"] = (f"collected with {r['schedule']} batching; the replay models {schedule} "
                                      "batches (the evaluated run's)")
    return {"live_check": live, "live": live_runs, "rules": _rule_audit(trace, costs, preds, points, concurrency),
            "costs": {"path": str(opts.costs), "kind": costs.kind, "drafter": costs.drafter,
                      "description": costs.description.strip(), "fingerprint": costs.fingerprint(),
                      "warnings": list(costs.measurement.get("warnings", [])) + costs.pair_problems(metas or []),
                      "decisions": decisions,
                      "beyond_table": costs.beyond(trace.k, concurrency, int(np.unique(trace.request).size))},
            "requests": int(trace.request.max()) + 1, "request_steps": int(trace.a.size), "schedule": schedule,
            "verification": verification,
            "k": trace.k, "predictors": [f.name for f in preds], "points": points, "cost_refits": refits}


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
            row["throughput_given_up"] = 1 - lossless / engine if engine > 0 else None  # a degenerate table
        rows.append(row)
    return rows


def step_parts(opened: Opened, frame: pl.DataFrame | None) -> list[pl.LazyFrame]:
    """Frames whose steps are whole (every draft of a step in one frame): each shard when no request
    spans two shards of a run (the collector writes whole batches per shard), else everything."""
    if frame is not None:
        return [frame.lazy()]
    parts = [p for run_parts in opened.parts for p in run_parts]
    if len(parts) > 1:
        keys = pl.concat([p.select("_run", "request").unique().collect() for p in parts])
        if keys.height != keys.unique().height:
            return [opened.drafts]
    return parts


def step_tables(parts: list[pl.LazyFrame], feats: list[Feature], n_bins: int, *,
                sort: bool = False) -> tuple[float, dict]:
    """Mean acceptance length and each complete probability feature's expected-length calibration,
    from per-step sums computed frame by frame. A frame whose steps are already contiguous with
    ascending positions (the collector's and the synthetic writer's order, checked) is summed in
    file order by one compiled loop; any other frame (or ``sort``, the reference) is sorted first."""
    cols = step_columns(parts, feats, sort=sort)
    steps = sum(a.size for a in cols["a"])
    accepted = sum(float(a.sum()) for a in cols["a"])
    k = max((int(a.max()) for a in cols["k"] if a.size), default=0)
    calib = {f.name: length_calibration_from_steps(cols[f.name], cols["a"], k, n_bins) for f in feats}
    return (1 + accepted / steps if steps else float("nan")), calib


def step_columns(parts: list[pl.LazyFrame], feats: list[Feature], *, sort: bool = False) -> dict[str, list[np.ndarray]]:
    """Per frame, per step: accepted drafts (``a``), drafts (``k``) and each feature's expected
    accepted length (the sum of the cumulative products of its confidences); see :func:`step_tables`."""
    cols: dict[str, list[np.ndarray]] = {"a": [], "k": [], **{f.name: [] for f in feats}}
    for part in parts:
        got = None if sort else _steps_in_order(part, feats)
        if got is None:
            got = _steps_sorted(part, feats)
        for name, v in got.items():
            cols[name].append(v)
    return cols


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a`` contiguous and read-only, whether polars lent its memory (read-only) or copied it (one
    chunk or several): the compiled loop indexes a tuple of such columns, which must share one type."""
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def _steps_sorted(part: pl.LazyFrame, feats: list[Feature]) -> dict[str, np.ndarray]:
    keys = ["run", "request", "step"]
    per_step = (part.sort([*keys, "position"]).group_by(keys, maintain_order=True)
                .agg((pl.col("label") == 1).sum().alias("_a"), pl.len().alias("_k"),
                     *[f.expr.cast(pl.Float64).cum_prod().sum().alias(f"_p{i}") for i, f in enumerate(feats)])
                .collect())
    return {"a": per_step["_a"].to_numpy(), "k": per_step["_k"].to_numpy(),
            **{f.name: per_step[f"_p{i}"].to_numpy() for i, f in enumerate(feats)}}


def _steps_in_order(part: pl.LazyFrame, feats: list[Feature]) -> dict[str, np.ndarray] | None:
    """Per-step sums of a frame read in file order, or None when its steps are not contiguous runs of
    ascending positions, or a score is null somewhere (the sorted path handles both)."""
    from svt.metrics.steps_kernel import step_heads, step_sums

    run = pl.col("_run") if "_run" in part.collect_schema().names() else pl.col("run").rank("dense")
    frame = part.select(run.cast(pl.Int64).alias("_r"), "request", "step", "position",
                        (pl.col("label") == 1).fill_null(False).cast(pl.UInt8).alias("_acc"),
                        *[f.expr.cast(pl.Float64).alias(f"_p{i}") for i, f in enumerate(feats)]).collect()
    n = frame.height
    if n == 0:
        return None
    if any(frame[f"_p{i}"].null_count() for i in range(len(feats))):
        return None
    r, req, st, pos = (frame[c].to_numpy() for c in ("_r", "request", "step", "position"))
    first = np.empty(n, dtype=np.bool_)
    low, span = int(req.min()), int(req.max()) - int(req.min()) + 1
    runs = int(r.max()) + 1 if int(r.min()) >= 0 else 0
    dense = runs * span <= 2 * n  # a last-step table per run and request, when the ids are compact
    last = np.empty(runs * span if dense else 0, dtype=np.int64)
    n_steps, ascending = step_heads(r, req, st, pos, first, low, span, last)
    if n_steps < 0:
        return None  # positions not ascending within a step
    if not ascending:  # a step split into several runs of rows: a repeated (run, request, step) at the heads
        heads = pl.DataFrame({"r": r[first], "q": req[first], "s": st[first]})
        if heads.n_unique() != n_steps:
            return None  # a step split into several runs of rows
    out_a, out_k = np.zeros(n_steps, np.int64), np.zeros(n_steps, np.int64)
    out_p = np.zeros((len(feats), n_steps))
    p = tuple(_read_only(frame[f"_p{i}"].to_numpy()) for i in range(len(feats))) or (np.zeros(0),)
    step_sums(first, frame["_acc"].to_numpy(), p, len(feats), out_a, out_k, out_p)
    return {"a": out_a, "k": out_k, **{f.name: out_p[i] for i, f in enumerate(feats)}}
