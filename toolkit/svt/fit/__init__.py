"""Fitting acceptance predictors on run directories, saving them as files, and predicting with them.

Fitters (``FITTERS``): ``irls-online`` (the source estimator, evaluated prequentially), ``logistic``
(the same parametrisation fitted offline by Newton; per-position slopes and several features as
options), ``sts`` (per-position temperature scaling of the drafter's probability), ``platt`` and
``isotonic`` (calibrators of one score). Offline fitters train on a request-level split and are
scored on the held-out requests.

A fit is a JSON file: ``model``, ``feature`` (or ``features``), ``slope`` (a number, or a list by
position), ``intercepts`` (a list by position), ``path`` (online fits: coefficients per cycle),
``options``, ``training`` (runs, rows, requests, split) and ``svt_version``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import numpy as np
import polars as pl
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit

from svt import __version__
from svt.errors import ConfigError, DataError
from svt.features import get_feature
from svt.fileio import read_json
from svt.fit.irls_online import PRESETS, IRLSOnline, OnlineOptions
from svt.fit.logistic import design, fit_newton
from svt.traces.io import open_run

FITTERS = ("irls-online", "logistic", "sts", "platt", "isotonic", "head")
EPS = 1e-6


def get_fitter(name: str) -> str:
    if name not in FITTERS:
        raise ConfigError(f"Unknown fitter {name!r}; known fitters: {', '.join(FITTERS)}.")
    return name


def load_drafts_for_fit(runs: list[str | Path], where: pl.Expr | None = None) -> tuple[pl.DataFrame, list[dict]]:
    """All drafts of the runs in replay (decode-step) order, with a ``decode_step`` column.

    A decode step is one engine step: the requests decoded together in a batch (``request //
    batch_size`` from the run's config; one request at a time for foreign runs) at the same step.
    """
    frames, infos = [], []
    for i, path in enumerate(runs):
        run = open_run(path)
        bs = int((run.meta.get("config") or {}).get("batch_size", 1) or 1)
        frames.append(run.uncensored_drafts().with_columns(pl.lit(i).alias("_run"),
                                                      (pl.col("request") // bs).alias("_batch")))
        infos.append({"path": str(path), "run_id": run.meta.get("run_id"), "k": run.meta.get("k")})
    lf = pl.concat(frames)
    if where is not None:
        lf = lf.filter(where)
    drafts = lf.sort("_run", "_batch", "step", "request", "position").collect()
    if drafts.height == 0:
        raise DataError("No drafts to fit on" + (" after the filter." if where is not None else "."))
    drafts = drafts.with_columns(pl.struct("_run", "_batch", "step").rank("dense").cast(pl.Int64).sub(1)
                                 .alias("decode_step"))
    return drafts, infos


def split_mask(drafts: pl.DataFrame, test_fraction: float, seed: int) -> np.ndarray:
    """True for rows of held-out requests: a seeded permutation of the (run, request) pairs."""
    if not 0 <= test_fraction < 1:
        raise ConfigError(f"Expected `test_fraction` in [0, 1), but got {test_fraction}.")
    keys = drafts.select("_run", "request").unique().sort("_run", "request")
    rng = np.random.default_rng(seed)
    n_test = int(round(test_fraction * keys.height))
    test = np.zeros(keys.height, dtype=bool)
    test[rng.permutation(keys.height)[:n_test]] = True
    keys = keys.with_columns(pl.Series("_test", test))
    return drafts.join(keys, on=["_run", "request"], how="left", maintain_order="left")["_test"].to_numpy()


def _values(drafts: pl.DataFrame, feature: str) -> np.ndarray:
    f = get_feature(feature)
    x = drafts.select(f.expr.alias("x"))["x"].to_numpy().astype(np.float64)
    if not np.isfinite(x).all():
        raise DataError(f"Feature {feature!r} gives NaN/inf values; cannot fit on it.")
    return x


def _labelled(drafts: pl.DataFrame) -> pl.DataFrame:
    lab = drafts.filter(pl.col("label").is_not_null())
    if lab.height == 0:
        raise DataError("No labelled drafts: nothing to fit.")
    if lab["label"].n_unique() < 2:
        raise DataError(f"Only one class among the {lab.height} labelled drafts: a predictor cannot be fitted.")
    return lab


def fit_runs(runs: list[str | Path], model: str, *, feature: str | None = None,
             features: list[str] | None = None, per_position_slope: bool = False,
             online: OnlineOptions | None = None, test_fraction: float = 0.3, seed: int = 0,
             where: pl.Expr | None = None, mlp_hidden: int = 0, device: str = "auto") -> dict:
    """Fit ``model`` on the runs' labelled drafts; return the fit as a dict (see module doc)."""
    get_fitter(model)
    drafts, infos = load_drafts_for_fit(runs, where)
    k = int(drafts["position"].max()) + 1
    out: dict = {"model": model, "svt_version": __version__,
                 "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if model == "irls-online":
        opts = online or OnlineOptions()
        lab = _labelled(drafts)
        est = IRLSOnline(opts).fit(_values(lab, opts.feature), lab["position"].to_numpy(),
                                   lab["label"].to_numpy(), lab["decode_step"].to_numpy(), k=k)
        out.update(est.to_dict())
        out["training"] = {"runs": infos, "rows": lab.height, "k": k, "cycles": len(est.path_),
                           "accept_rate": float(lab["label"].mean()), "evaluation": "prequential"}
        return out
    test = split_mask(drafts, test_fraction, seed)
    train = _labelled(drafts.filter(~pl.Series(test)))
    y = train["label"].to_numpy().astype(np.float64)
    pos = train["position"].to_numpy()
    if model == "logistic":
        names = features or [feature or "logit_qmax"]
        X = design(np.column_stack([_values(train, f) for f in names]), pos, k,
                   per_position_slope=per_position_slope)
        beta, iters = fit_newton(X, y)
        m = len(names)
        slopes = beta[: m * k].reshape(m, k) if per_position_slope else beta[:m]
        out.update({"feature": names[0], "features": names,
                    "slope": (slopes[0].tolist() if m == 1 else slopes.tolist()) if per_position_slope
                    else (float(slopes[0]) if m == 1 else slopes.tolist()),
                    "intercepts": beta[-k:].tolist(),
                    "options": {"per_position_slope": per_position_slope, "newton_iterations": iters}})
    elif model == "head":
        from svt.fit.head import HeadConfig, hidden_matrix, train_head

        h = hidden_matrix(train, runs)
        cfg = HeadConfig(hidden_size=h.shape[1], k=k, mlp_hidden=mlp_hidden, seed=seed)
        head, log = train_head(h, pos, y, train.select(pl.struct("_run", "request").rank("dense"))
                               .to_series().to_numpy(), cfg, device=device)
        out.update({"feature": "hidden", "config": log.pop("config"), "options": log, "_head": head})
    elif model == "sts":
        name = feature or "q_max"
        q = np.clip(_values(train, name), EPS, 1 - EPS)
        temps = []
        for kk in range(k):
            m_ = pos == kk
            if m_.sum() == 0 or len(set(y[m_])) < 2:
                temps.append(1.0)
                continue
            z, yy = logit(q[m_]), y[m_]

            def loss(log_t, z=z, yy=yy):
                zz = z / np.exp(log_t)
                return float(np.mean(np.logaddexp(0, zz) - yy * zz))

            temps.append(float(np.exp(minimize_scalar(loss, bounds=(-5, 5), method="bounded").x)))
        out.update({"feature": name, "temperatures": temps,
                    "slope": [1 / t for t in temps], "intercepts": [0.0] * k,
                    "options": {"note": "p = sigmoid(logit(q) / T_position)"}})
    elif model == "platt":
        name = feature or "q_max"
        s = _values(train, name)
        beta, _ = fit_newton(np.column_stack([s, np.ones_like(s)]), y)
        out.update({"feature": name, "slope": float(beta[0]), "intercepts": [float(beta[1])] * k,
                    "options": {"note": "p = sigmoid(a * score + b), one intercept for all positions"}})
    elif model == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        name = feature or "q_max"
        iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(_values(train, name), y)
        out.update({"feature": name, "x_thresholds": iso.X_thresholds_.tolist(),
                    "y_thresholds": iso.y_thresholds_.tolist(), "options": {}})
    out["training"] = {"runs": infos, "rows": train.height, "k": k, "test_fraction": test_fraction,
                       "split_seed": seed, "train_requests": int(train.select("_run", "request").n_unique()),
                       "accept_rate": float(y.mean()), "evaluation": "held-out requests"}
    return out


def save_fit(fit: dict, path: str | Path) -> Path:
    """The JSON fit file (and, for a head, its safetensors weights beside it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = fit.get("_head")
    fit = {k: v for k, v in fit.items() if not k.startswith("_")}
    if fit.get("model") == "head":
        from svt.fit.head import save_head

        if head is None:
            raise ConfigError("A head fit must carry its trained model to be saved.")
        weights = path.with_suffix(".safetensors")
        save_head(head, weights)
        fit["weights"] = weights.name
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(fit, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def load_fit(path: str | Path) -> dict:
    path = Path(path)
    fit = read_json(path, "Fit file")
    if not isinstance(fit, dict) or fit.get("model") not in FITTERS:
        raise ConfigError(f"{path}: not an svt fit (expected `model` in {', '.join(FITTERS)}).")
    if fit["model"] == "head":
        weights = path.parent / fit.get("weights", "")
        if not weights.is_file():
            raise ConfigError(f"{path}: its weights file {str(weights)!r} is missing.")
        fit["_weights_path"] = str(weights)
    else:
        get_feature(fit.get("feature", "q_max"))
    return fit


def predict(fit: dict, drafts: pl.DataFrame) -> np.ndarray:
    """Predictions for ``drafts`` (from ``load_drafts_for_fit``; every row, labelled or not).

    Online fits are replayed on these drafts and each row gets the coefficients in force at its
    decode step (prequential). Offline fits predict every row; ``evaluation_mask`` says which rows
    are fair to score.
    """
    model = fit["model"]
    k_run = int(drafts["position"].max()) + 1
    k_fit = fit.get("training", {}).get("k") or len(fit.get("intercepts", [])) or k_run
    if model not in ("platt", "isotonic") and k_run > k_fit:
        raise DataError(f"The fit knows {k_fit} draft positions but the run has {k_run}.")
    if model == "head":
        from svt.fit.head import HeadConfig, hidden_matrix, load_head, predict_head

        head = fit.get("_head") or load_head(HeadConfig(**fit["config"]), Path(fit["_weights_path"]))
        runs = fit.get("_runs")
        if runs is None:
            raise DataError("Predicting with a head needs the run paths (hidden states).")
        return predict_head(head, hidden_matrix(drafts, runs), drafts["position"].to_numpy())
    for name in fit.get("features") or [fit["feature"]]:
        get_feature(name)
    if model == "irls-online":
        opts = OnlineOptions(**fit["options"])
        lab = _labelled(drafts)
        est = IRLSOnline(opts).fit(_values(lab, opts.feature), lab["position"].to_numpy(),
                                   lab["label"].to_numpy(), lab["decode_step"].to_numpy(), k=k_fit)
        return est.predict_prequential(_values(drafts, opts.feature), drafts["position"].to_numpy(),
                                       drafts["decode_step"].to_numpy())
    pos = drafts["position"].to_numpy()
    if model == "isotonic":
        return np.interp(_values(drafts, fit["feature"]), fit["x_thresholds"], fit["y_thresholds"])
    b = np.asarray(fit["intercepts"], dtype=np.float64)
    if model == "sts":
        return expit(logit(np.clip(_values(drafts, fit["feature"]), EPS, 1 - EPS))
                     / np.asarray(fit["temperatures"])[pos] + b[pos])
    if model == "platt":
        return expit(fit["slope"] * _values(drafts, fit["feature"]) + b[pos])
    names = fit.get("features") or [fit["feature"]]
    Xf = np.column_stack([_values(drafts, f) for f in names])
    slope = np.asarray(fit["slope"], dtype=np.float64)
    if fit["options"].get("per_position_slope"):
        slope = slope.reshape(len(names), -1)  # [m, k]
        z = np.sum(Xf * slope[:, pos].T, axis=1)
    else:
        z = Xf @ np.atleast_1d(slope)
    return expit(z + b[pos])


def evaluation_mask(fit: dict, drafts: pl.DataFrame, run_ids: list[str | None]) -> np.ndarray:
    """Rows on which a fit may be scored: all rows for online fits (prequential) and for runs the
    fit was not trained on; the held-out requests of its own training runs otherwise."""
    if fit["model"] == "irls-online":
        return np.ones(drafts.height, dtype=bool)
    trained = {r.get("run_id") for r in fit.get("training", {}).get("runs", [])}
    if not trained.intersection(run_ids):
        return np.ones(drafts.height, dtype=bool)
    if [r for r in run_ids] != [r.get("run_id") for r in fit["training"]["runs"]]:
        raise DataError("Evaluate an offline fit on exactly the runs it was trained on (for its held-out "
                        "split) or on runs it has never seen.")
    return split_mask(drafts, fit["training"]["test_fraction"], fit["training"]["split_seed"])


def live_confidence(fit: dict):
    """A function (q-feature arrays ``[nb, K]``, positions ``[nb, K]``) -> confidences, for live
    AV in the collector. Only lossless predictors on q (no head, no q_sampled features): trimming
    on anything else would bias the output distribution."""
    if fit["model"] == "head":
        raise ConfigError("Live AV with a confidence head is not supported (it needs the drafter's hidden "
                          "state inside the collector); use a fit on a q feature.")
    names = fit.get("features") or [fit["feature"]]
    for name in names:
        if not get_feature(name).lossless:
            raise ConfigError(f"Live AV needs a lossless predictor, but feature {name!r} depends on the "
                              "sampled token: trimming on it biases the output distribution.")
    est = IRLSOnline.from_dict(fit) if fit["model"] == "irls-online" else None

    def confidence(feats: dict, position: np.ndarray) -> np.ndarray:
        frame = pl.DataFrame({**{k: v.ravel() for k, v in feats.items()}, "position": position.ravel()})
        if est is not None:  # the fit's final coefficients (no updates during collection)
            p = est.predict_proba(_values(frame, est.options.feature), frame["position"].to_numpy())
        else:
            p = predict(fit, frame)
        return p.reshape(position.shape)

    return confidence


__all__ = ["FITTERS", "PRESETS", "IRLSOnline", "OnlineOptions", "evaluation_mask", "fit_runs",
           "get_fitter", "live_confidence", "load_drafts_for_fit", "load_fit", "predict", "save_fit", "split_mask"]
