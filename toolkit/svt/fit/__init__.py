"""Fitting predictors on run directories, saving them as files, and predicting with them.

Fitters are a registry of small estimator classes (``FITTERS``, ``svt.fit.base``; one module per
family, each registered with ``@register_fitter``). Acceptance predictors on the drafts table:
``irls-online`` (the source estimator, evaluated prequentially), ``logistic`` (the same
parametrisation fitted offline by Newton; per-position slopes and several features as options),
``sts`` (per-position temperature scaling), ``platt`` and ``isotonic`` (calibrators of one score),
``head`` (a confidence head on hidden states). Yield predictors on the cache_drafts table (Hybrid
Verified Decoding): ``yield-mlp``, ``yield-linear``, ``yield-gbm``. Offline fitters train on a
request-level split and are scored on the held-out requests.

:func:`fit_runs` returns the fitted fitter (``training_`` says on what); ``fit.save(path)`` writes
it as a JSON fit file: ``model``, ``feature`` (or ``features``), ``slope`` (a number, or a list by
position), ``intercepts`` (a list by position), ``path`` (online fits: coefficients per cycle),
``options``, ``training`` (runs, rows, requests, split) and ``svt_version``; ``Fitter.load(path)``
reads one back.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from svt import __version__
from svt.errors import ConfigError, DataError, SvtError
from svt.features import get_feature
from svt.fit.base import (
    FITTERS,
    FitData,
    Fitter,
    PredictContext,
    feature_values,
    get_fitter,
    register_fitter,
)
from svt.fit.files import check_fit_out, fit_outs, name_fits  # noqa: F401  (re-exported)

# the registry: one import per fitter family (each module registers its classes)
from svt.fit import calibrators, head, irls_online, logistic, tree_logistic, tree_yield, yield_models  # noqa: E402, F401  isort: skip
from svt.fit.irls_online import PRESETS, IRLSOnline, OnlineOptions  # noqa: E402  isort: skip
from svt.traces.identity import (  # noqa: E402  isort: skip
    request_signatures,
    run_identity,
    run_record,
)
from svt.traces.io import common_columns, open_run, open_runs  # noqa: E402  isort: skip
from svt.fit.held_out import check_pair, evaluation_mask, scoring_unverified, split_mask, training_tokens  # noqa: E402, F401  isort: skip


def no_drafts(runs: list, where: pl.Expr | None = None) -> DataError:
    """Why there is nothing to fit on, naming each run and what it holds instead of chain drafts."""
    from svt.traces.io import read_meta

    said = []
    for path in runs:
        meta = read_meta(path)
        if isinstance(meta.get("tree"), dict):
            said.append(f"{path} is a tree run: its drafts are tree nodes (`tree_drafts`), fitted with "
                        "--model tree-logistic")
        elif meta.get("engine") == "reference":
            said.append(f"{path} is a reference run: it has no model drafts, only cache drafts, fitted with "
                        "--model yield-mlp, yield-linear or yield-gbm")
        else:
            said.append(f"{path} ({meta.get('engine', 'svt')} run) holds no labelled chain drafts")
    return DataError("No drafts to fit on" + (" after the filter" if where is not None else "") + ": "
                     + "; ".join(said) + ".")


def load_drafts_for_fit(runs: list[str | Path], where: pl.Expr | None = None) -> tuple[pl.DataFrame, list[dict]]:
    """All drafts of the runs in replay (decode-step) order, with a ``decode_step`` column.

    A decode step is one engine step: the requests decoded together in a batch (``request //
    batch_size`` from the run's config; one request at a time for foreign runs) at the same step.
    """
    frames, infos = [], []
    opened = open_runs(runs)
    cols = common_columns(opened)  # a confidence head's column where every run carries one
    for i, (path, run) in enumerate(zip(runs, opened, strict=True)):
        bs = int((run.meta.get("config") or {}).get("batch_size", 1) or 1)
        frames.append(run.uncensored_drafts().select(cols).with_columns(pl.lit(i).alias("_run"),
                                                      (pl.col("request") // bs).alias("_batch")))
        infos.append(run_record(path, run))
    lf = pl.concat(frames)
    if where is not None:
        lf = lf.filter(where)
    drafts = lf.sort("_run", "_batch", "step", "request", "position").collect()
    if drafts.height == 0:
        raise no_drafts(runs, where)
    drafts = drafts.with_columns(pl.struct("_run", "_batch", "step").rank("dense").cast(pl.Int64).sub(1)
                                 .alias("decode_step"))
    return drafts, infos


def replay_arrays(runs: list[str | Path], feature: str, where: pl.Expr | None = None
                  ) -> tuple[dict[str, np.ndarray], list[dict], int] | None:
    """The labelled drafts of the runs as replay arrays (``x`` the feature, ``position``,
    ``label``, ``decode_step``), read shard by shard into arrays of 19 bytes per labelled draft,
    with decode steps numbered over all drafts exactly as :func:`load_drafts_for_fit` numbers them.

    Needs the shards in replay order (run, batch, step, request, position: how the collector and
    `svt.traces.synthetic` write them), which is checked; returns None when they are not (then
    :func:`load_drafts_for_fit` sorts in memory).
    """
    from svt.features import check_feature, feature_values, get_feature

    f = get_feature(feature)
    parts, infos = [], []
    opened = open_runs(runs)
    cols = common_columns(opened)
    for i, (path, run) in enumerate(zip(runs, opened, strict=True)):
        bs = int((run.meta.get("config") or {}).get("batch_size", 1) or 1)
        for p in run.uncensored_parts():
            p = p.select(cols)
            p = p.filter(where) if where is not None else p
            parts.append((i, bs, p))
        infos.append(run_record(path, run))
    if parts:
        check_feature(f, parts[0][2])
    counts = [int(p.select(pl.col("label").is_not_null().sum()).collect().item()) for _, _, p in parts]
    n = sum(counts)
    out = {"x": np.empty(n, np.float64), "position": np.empty(n, np.int16), "label": np.empty(n, np.int8),
           "decode_step": np.empty(n, np.int64)}
    at, expected, last, step_id, k = 0, 0, None, -1, 0
    for (run_i, bs, part), m in zip(parts, counts, strict=True):
        try:
            d = part.select("request", "step", "position", "label", f.expr.cast(pl.Float64).alias("_x")).collect()
        except Exception:  # the feature fails on some row of this part: say which feature and why
            feature_values(f, part)
            raise
        for c in range(0, d.height, 1 << 21):  # slices: the order checks' temporaries stay small
            sl = d.slice(c, 1 << 21)
            req, step, pos = sl["request"].to_numpy(), sl["step"].to_numpy(), sl["position"].to_numpy()
            keys = [np.full(sl.height, run_i), req // bs, step, req, pos]
            if last is not None:  # the previous slice's last row comes first
                keys = [np.r_[lk, kk] for lk, kk in zip(last, keys, strict=True)]
            ahead = np.zeros(keys[0].size - 1, dtype=bool)  # row i+1 after row i (lexicographically)
            same = np.ones(keys[0].size - 1, dtype=bool)
            for kk in keys:
                dk = np.diff(kk)
                ahead |= same & (dk > 0)
                same &= dk == 0
            if not ahead.all():
                return None
            new_step = np.diff(keys[0]) != 0
            for kk in keys[1:3]:
                new_step |= np.diff(kk) != 0
            if last is None:
                new_step = np.r_[True, new_step]
            ids = step_id + np.cumsum(new_step)
            step_id = int(ids[-1])
            last = [kk[-1:] for kk in keys]
            lab = sl["label"].is_not_null().to_numpy()
            j = int(lab.sum())
            out["x"][at:at + j] = sl["_x"].to_numpy()[lab]
            out["position"][at:at + j] = pos[lab]
            out["label"][at:at + j] = sl["label"].to_numpy()[lab]
            out["decode_step"][at:at + j] = ids[lab]
            k = max(k, int(pos.max()) + 1)
            at += j
        del d
        expected += m
        if at != expected:
            raise DataError(f"A shard's drafts changed while they were read ({at} labelled so far, {expected} counted).")
    if n == 0:
        raise no_drafts(runs, where)
    return out, infos, k


def _labelled(drafts: pl.DataFrame) -> pl.DataFrame:
    lab = drafts.filter(pl.col("label").is_not_null())
    if lab.height == 0:
        raise DataError("No labelled drafts: nothing to fit.")
    if lab["label"].n_unique() < 2:
        raise DataError(f"Only one class among the {lab.height} labelled drafts: a predictor cannot be fitted.")
    return lab


MAX_HIDDEN = 4096  # a yield MLP or a head on tens of features: wider is a typo, not a study


def check_options(*, seed: int = 0, test_fraction: float = 0.3, **options) -> None:
    """One clear ConfigError for an option no fitter can use, before any data is read."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"Expected --seed to be an integer from 0 to 2**32 - 1, but got {seed!r}.")
    if not 0.0 <= float(test_fraction) < 1.0:
        raise ConfigError(f"Expected --test-fraction to be from 0 (train on every request) to below 1, "
                          f"but got {test_fraction!r}.")
    hidden = options.get("mlp_hidden")
    if hidden is not None and not 0 <= hidden <= MAX_HIDDEN:
        raise ConfigError(f"Expected --mlp-hidden to be from 0 (the default width) to {MAX_HIDDEN}, but got {hidden}.")
    device = options.get("device")
    if device not in (None, "auto"):
        from svt.devices import resolve_device

        try:
            resolve_device(str(device))
        except SvtError as exc:
            raise ConfigError(f"--device {device}: {exc}") from None
    feats = options.get("features") or []
    twice = sorted({f for f in feats if feats.count(f) > 1})
    if twice:
        raise ConfigError(f"--features names {', '.join(twice)} more than once.")


def prepare_fit(model: str, *, test_fraction: float | None = None, seed: int | None = None, **options):
    """The fitter class, an unfitted estimator from ``options``, the split fraction and seed:
    everything :func:`fit_runs` checks before reading data (an unknown model, an option the fitter
    does not take, a bad value), so several fits can be checked before the first one runs."""
    cls = get_fitter(model)
    if cls.online:  # scored prequentially on every labelled draft: no held-out split to set
        given = [flag for flag, v in (("--test-fraction", test_fraction), ("--seed", seed)) if v is not None]
        if given:
            raise cls.refuse(given)
    test_fraction = 0.3 if test_fraction is None else test_fraction
    seed = 0 if seed is None else seed
    check_options(seed=seed, test_fraction=test_fraction, **options)
    return cls, cls.from_options(seed=seed, **options), test_fraction, seed


def fit_runs(runs: list[str | Path], model: str, *, test_fraction: float | None = None, seed: int | None = None,
             where: pl.Expr | None = None, **options) -> Fitter:
    """Fit ``model`` on the runs and return the fitted fitter (see the module doc).

    ``options`` go to the fitter's ``__init__`` (those it accepts: ``feature``, ``features``,
    ``per_position_slope``, ``online``, ``mlp_hidden``, ``device``, ...). Online fitters replay every
    labelled draft (scored prequentially); offline fitters train on the requests outside a seeded
    request-level split of ``test_fraction`` and are scored on the others.
    """
    cls, est, test_fraction, seed = prepare_fit(model, test_fraction=test_fraction, seed=seed, **options)
    try:
        return fit_prepared(runs, cls, est, test_fraction, seed, where)
    except np.linalg.LinAlgError as exc:
        raise DataError(f"{model}: the fit's linear system is singular ({exc}): a position whose feature does not "
                        "vary, or too few labels, with no ridge to regularise it; use --ridge > 0.") from None


@dataclass
class Trained:
    """What a fitter was trained on: the runs' records, K, the training rows and their label
    statistic, and the training rows' (run, request) keys (None for an online fitter: it saw every
    labelled draft, scored prequentially)."""

    infos: list[dict]
    k: int
    rows: int
    stats: dict
    requests: pl.DataFrame | None
    signatures: list[str] | None = None  # the training requests' acceptance sequences (drafts only)


def _check_not_lacking(runs, est: Fitter) -> None:
    """A feature that reads a column an imported run lacks (null throughout) is refused by name."""
    from svt.features import FEATURES

    lacks = set().union(*(open_run(r, deep=False).lacks("drafts") for r in runs))
    for name in getattr(est, "features", None) or [getattr(est, "feature", "")]:
        f = FEATURES.get(name)
        need = sorted(set(f.expr.meta.root_names()) & lacks) if f is not None else []
        if need:
            raise DataError(f"Feature {name!r} reads {', '.join(need)}, which the imported run lacks "
                            "(run.json `import.lacks`); fit on a feature of the columns it carries.")


def _train_on_drafts(runs, est: Fitter, test_fraction: float, seed: int, where) -> Trained:
    """The drafts table: an online fitter that streams trains on replay arrays read shard by shard
    (runs larger than memory); every other fitter on the drafts frame, offline ones on the
    requests outside the split."""
    _check_not_lacking(runs, est)
    if est.streams and (streamed := replay_arrays(runs, est.feature, where)) is not None:
        arrays, infos, k = streamed
        y = arrays["label"]
        if y.size == 0:
            raise DataError("No labelled drafts: nothing to fit.")
        if y.min() == y.max():
            raise DataError(f"Only one class among the {y.size} labelled drafts: a predictor cannot be fitted.")
        est.fit_arrays(arrays["x"], arrays["position"], y, arrays["decode_step"], k)
        return Trained(infos, k, int(y.size), {"accept_rate": float(y.mean())}, None)
    drafts, infos = load_drafts_for_fit(runs, where)
    k = int(drafts["position"].max()) + 1
    train = _labelled(drafts if est.online else drafts.filter(~pl.Series(split_mask(drafts, test_fraction, seed))))
    est.fit(FitData(train, k, [Path(r) for r in runs], seed))
    if est.online:
        return Trained(infos, k, train.height, {"accept_rate": float(train["label"].mean())}, None)
    return Trained(infos, k, train.height, {"accept_rate": float(train["label"].mean())},
                    train.select("_run", "request"), sorted(request_signatures(train)["signature"].to_list()))


def _train_on_cache_drafts(runs, est: Fitter, test_fraction: float, seed: int, where) -> Trained:
    """The cache_drafts table (yield fitters): the rows of the requests outside the split."""
    from svt.fit.yield_data import load_cache_drafts_for_fit

    rows, infos = load_cache_drafts_for_fit(runs, where)
    train = rows.filter(~pl.Series(split_mask(rows, test_fraction, seed)))
    if train.height == 0:
        raise DataError("No cache-draft rows in the training requests.")
    k = int(rows["draft_len"].max())
    est.fit(FitData(train, k, [Path(r) for r in runs], seed))
    return Trained(infos, k, train.height, {"mean_yield": float(train["oracle_accepted"].mean())},
                    train.select("_run", "request"))


def load_tree_nodes_for_fit(runs, where=None) -> tuple[pl.DataFrame, list[dict], bool]:
    """The ``tree_drafts`` nodes of tree runs with per-node rows (with ``_run``), sorted by run,
    request, step and node; and whether the runs are greedy (all of them, or none)."""
    frames, infos, greedy = [], [], set()
    for i, (path, run) in enumerate(zip(runs, open_runs(runs), strict=True)):
        tree = run.meta.get("tree")
        if not isinstance(tree, dict) or not run.has("tree_drafts"):
            raise DataError(f"{path}: not a tree run with a tree_drafts table; a node predictor trains on tree "
                            "runs (a `tree:` collect config).")
        if not tree.get("per_node", True):
            raise DataError(f"{path}: an imported tree run with counts per step only: no nodes to fit on.")
        run.require_complete()
        greedy.add(bool((run.meta.get("sampling") or {}).get("greedy")))
        frames.append(run.scan("tree_drafts").with_columns(pl.lit(i).alias("_run")))
        infos.append(run_record(path, run))
    if len(greedy) > 1:
        raise DataError("These tree runs mix greedy and sampling verification, whose node labels differ "
                        "(match against accepted given tried): fit them separately.")
    lf = pl.concat(frames)
    if where is not None:
        lf = lf.filter(where)
    nodes = lf.sort("_run", "request", "step", "node").collect()
    if nodes.is_empty():
        raise DataError("No tree nodes to fit on" + (" after the filter." if where is not None else "."))
    return nodes, infos, greedy.pop()


def _train_on_tree_drafts(runs, est: Fitter, test_fraction: float, seed: int, where) -> Trained:
    """The tree_drafts table (node predictors): the nodes of the requests outside the split."""
    nodes, infos, greedy = load_tree_nodes_for_fit(runs, where)
    train = nodes.filter(~pl.Series(split_mask(nodes, test_fraction, seed))).with_columns(
        pl.lit(greedy).alias("_greedy"))
    if train.height == 0:
        raise DataError("No tree nodes in the training requests.")
    k = int(nodes["depth"].max()) + 1
    est.fit(FitData(train, k, [Path(r) for r in runs], seed))
    target = train["match"] if greedy else train["label"].drop_nulls()
    return Trained(infos, k, train.height, {"node_rate": float(target.mean()), "greedy": greedy},
                    train.select("_run", "request"))


def _train_on_cache_trees(runs, est: Fitter, test_fraction: float, seed: int, where) -> Trained:
    """The cache_trees table (tree yield fitters): the positions with a tree of the requests
    outside the split, with the cache features and the tree's size, score and yield."""
    from svt.fit.yield_data import load_cache_drafts_for_fit, load_cache_trees, tree_positions

    rows, infos = load_cache_drafts_for_fit(runs, where, with_empty=True)
    pos = tree_positions(rows, load_cache_trees(runs, rows)).filter(pl.col("tree_size") > 0)
    if pos.height == 0:
        raise DataError("No tree cache drafts to fit on: the cache proposed no tree.")
    train = pos.filter(~pl.Series(split_mask(pos, test_fraction, seed)))
    if train.height == 0:
        raise DataError("No tree cache drafts in the training requests.")
    est.fit(FitData(train, int(pos["tree_size"].max()), [Path(r) for r in runs], seed))
    return Trained(infos, int(pos["tree_size"].max()), train.height,
                    {"mean_yield": float(train["tree_yield"].mean())}, train.select("_run", "request"))


# one data source per table a fitter trains on (``Fitter.table``)
TRAINING_DATA = {"drafts": _train_on_drafts, "cache_drafts": _train_on_cache_drafts,
                 "tree_drafts": _train_on_tree_drafts, "cache_trees": _train_on_cache_trees}


def fit_prepared(runs, cls, est, test_fraction: float, seed: int, where, training=None) -> Fitter:
    """Train ``est`` (from :func:`prepare_fit`) and record what it was trained on. ``training``
    replaces the table's own way of reading the training data (:data:`TRAINING_DATA`): a cluster's
    (svt.distributed.fit_run) returns the same :class:`Trained` record without loading the drafts."""
    est.created_ = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    est.svt_version_ = __version__
    t = (training or TRAINING_DATA[cls.table])(runs, est, test_fraction, seed, where)
    if cls.online:
        est.training_ = {"runs": t.infos, "rows": t.rows, "k": t.k, "cycles": len(est.est_.path_), **t.stats,
                         "evaluation": "prequential"}
        return est
    if any("data" not in info for info in t.infos):  # (a cluster's training step reads it on the workers)
        for info, run in zip(t.infos, open_runs(runs), strict=True):  # a re-collection is recognised by its data
            info["data"] = run_identity(run, cls.table)
    ids = t.requests.unique().sort("_run", "request")
    est.training_ = {"runs": t.infos, "rows": t.rows, "k": t.k, "test_fraction": test_fraction, "split_seed": seed,
                     "train_requests": ids.height,
                     # the training requests themselves: evaluation scores every other request,
                     # whatever rows a later reading of the runs holds
                     "train_request_ids": [[int(a), int(b)] for a, b in ids.rows()],
                     # and how to know them in a run that does not say where it came from (an
                     # import of an export of the training run): their acceptance sequences
                     **({"train_request_signatures": t.signatures} if t.signatures is not None else {}),
                     # and their tokens, which identify short requests too (where the runs hold them)
                     **training_tokens([Path(r) for r in runs], t.requests),
                     **t.stats,
                     "evaluation": "held-out requests" if test_fraction > 0 else
                     "none held out (--test-fraction 0): only runs it was not trained on are scored"}
    if cls.table in ("cache_drafts", "cache_trees"):
        est.training_["cache_options"] = [open_run(r, deep=False, tables=["requests"]).meta.get("cache", {})
                                          .get("options") for r in runs]
    return est


def live_confidence(fit: Fitter):
    """A function (q-feature arrays ``[nb, K]``, positions ``[nb, K]``) -> confidences, for live
    AV in the collector. Only lossless predictors on q (no head, no q_sampled features): trimming
    on anything else would bias the output distribution."""
    if not fit.supports_live:
        raise ConfigError(f"Live AV with a {fit.name} fit is not supported (it needs more than the draft's "
                          "q features inside the collector, e.g. a head's hidden state); use a fit on a q feature.")
    if fit.target != "acceptance":
        raise ConfigError(f"Live AV needs an acceptance predictor, but {fit.name!r} predicts {fit.target}.")
    names = getattr(fit, "features", None) or [fit.feature]
    for name in names:
        if not get_feature(name).lossless:
            raise ConfigError(f"Live AV needs a lossless predictor, but feature {name!r} depends on the "
                              "sampled token: trimming on it biases the output distribution.")
    est = fit.est_ if fit.online else None
    fast = get_feature(est.options.feature).numpy if est is not None else None

    def confidence(feats: dict, position: np.ndarray) -> np.ndarray:
        if fast is not None:  # the feature in numpy: no polars query per engine step
            x = fast({k: v.ravel() for k, v in feats.items()})
            if not np.isfinite(x).all():
                raise DataError(f"Feature {est.options.feature!r} gives NaN/inf values on these drafts.")
            return est.predict_proba(x, position.ravel()).reshape(position.shape)
        frame = pl.DataFrame({**{k: v.ravel() for k, v in feats.items()}, "position": position.ravel()})
        if est is not None:  # the fit's final coefficients (no updates during collection)
            p = est.predict_proba(feature_values(frame, est.options.feature), frame["position"].to_numpy())
        else:
            p = fit.predict(frame)
        return p.reshape(position.shape)

    return confidence


def split_fits(paths: list[str]) -> tuple[list[str], list[str]]:
    """Acceptance fits (scored on drafts) and yield fits (scored on cache drafts)."""
    acc, yld = [], []
    for p in paths:
        fit = Fitter.load(p)
        if fit.table == "tree_drafts":
            raise DataError(f"{p} is a node predictor for draft trees: evaluate it on a tree run.")
        (yld if fit.target == "yield" else acc).append(p)
    return acc, yld


__all__ = ["FITTERS", "PRESETS", "FitData", "Fitter", "IRLSOnline", "OnlineOptions", "PredictContext",
           "Trained", "check_fit_out", "evaluation_mask", "fit_prepared", "fit_runs", "get_fitter", "live_confidence", "load_drafts_for_fit",
           "name_fits", "register_fitter", "split_fits", "split_mask"]
