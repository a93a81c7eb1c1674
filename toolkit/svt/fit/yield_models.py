"""Yield predictors for Hybrid Verified Decoding: the cache draft's accepted length, predicted
before verification from its suffix-match features (``svt.features.cache``).

- ``yield-mlp``: the paper's g_theta, a torch MLP regressing ``oracle_accepted`` with squared error,
  early stopping on a request-level validation split; weights in safetensors beside the fit file;
- ``yield-linear``: least squares on the standardised features (scikit-learn ``Ridge``, tiny alpha);
- ``yield-gbm``: scikit-learn's ``HistGradientBoostingRegressor``, a strong tabular baseline, kept as
  a pickle beside the fit file whose SHA-256 and scikit-learn version the fit file records (a
  pickle runs code when loaded: load only fits you made).

Trained on the training requests' rows that have a draft; predictions are clipped to
[0, draft_len] (a draft cannot yield more tokens than it has).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError
from svt.features.cache import TREE_FEATURES, YIELD_FEATURES, get_cache_features
from svt.fit.base import FitData, Fitter, register_fitter
from svt.fit.files import config, finite, integer, names, text


def yield_matrix(frame: pl.DataFrame, names: list[str]) -> np.ndarray:
    """``[n, d]`` float64 features of cache-draft rows; NaN/inf is an error."""
    X = frame.select(get_cache_features(names)).to_numpy().astype(np.float64)
    if not np.isfinite(X).all():
        raise DataError("Cache-draft features hold NaN/inf values; cannot fit or predict on them.")
    return X


class _YieldFitter(Fitter):
    table = "cache_drafts"
    target = "yield"
    lossless = True  # greedy verification is exact whichever draft is verified
    label_column = "oracle_accepted"  # the yield it learns
    size_column = "draft_len"  # the predictions are clipped to [0, this]
    default_features = YIELD_FEATURES

    def __init__(self, features: list[str] | None = None, seed: int = 0):
        self.features = list(features or self.default_features)
        self._check_tree_features()
        self.feature = "cache features"
        self.seed = seed

    def label(self) -> str:
        return self.name

    @classmethod
    def check_standardisation(cls, d: dict) -> int:
        """``mean`` and ``std`` (above 0: the features are divided by it), one per feature; the
        number of features."""
        n = len(names(d, "features"))
        finite(d, "mean", (n,), why=f"{n}, one per feature")
        finite(d, "std", (n,), positive=True, why=f"{n}, one per feature: the features are divided by it")
        return n

    def check(self) -> None:
        get_cache_features(self.features)
        self._check_tree_features()

    def _check_tree_features(self) -> None:
        tree = sorted(set(self.features) & set(TREE_FEATURES))
        if tree and self.table != "cache_trees":
            raise ConfigError(f"{', '.join(tree)} describe tree cache drafts; a chain yield fitter cannot use them "
                              f"(fit a tree-{self.name} on a run with cache trees).")

    def _xy(self, data: FitData) -> tuple[np.ndarray, np.ndarray]:
        return yield_matrix(data.frame, self.features), data.frame[self.label_column].to_numpy().astype(np.float64)

    def predict(self, frame, ctx=None) -> np.ndarray:
        raw = self._raw(yield_matrix(frame, self.features))
        return np.clip(raw, 0.0, frame[self.size_column].to_numpy().astype(np.float64))


@register_fitter
class YieldLinear(_YieldFitter):
    name = "yield-linear"

    def fit(self, data: FitData) -> YieldLinear:
        from sklearn.linear_model import Ridge

        X, y = self._xy(data)
        self.mean_, self.std_ = X.mean(0), X.std(0) + 1e-9
        reg = Ridge(alpha=1e-3).fit((X - self.mean_) / self.std_, y)
        self.coef_, self.intercept_ = reg.coef_, float(reg.intercept_)
        return self

    def _raw(self, X):
        return ((X - self.mean_) / self.std_) @ self.coef_ + self.intercept_

    def to_dict(self) -> dict:
        return {"model": self.name, "features": self.features, "mean": self.mean_.tolist(), "std": self.std_.tolist(),
                "coef": self.coef_.tolist(), "intercept": self.intercept_, "options": {"alpha": 1e-3}}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        n = cls.check_standardisation(d)
        finite(d, "coef", (n,), why=f"{n}, one per feature")
        finite(d, "intercept")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> YieldLinear:
        self = cls(d["features"])
        self.mean_, self.std_, self.coef_ = (np.asarray(d[k], dtype=np.float64) for k in ("mean", "std", "coef"))
        self.intercept_ = float(d["intercept"])
        return self


@register_fitter
class YieldGBM(_YieldFitter):
    name = "yield-gbm"

    def fit(self, data: FitData) -> YieldGBM:
        from sklearn.ensemble import HistGradientBoostingRegressor

        X, y = self._xy(data)
        self.model_ = HistGradientBoostingRegressor(max_iter=200, learning_rate=0.1, early_stopping=True,
                                                    validation_fraction=0.15, random_state=self.seed).fit(X, y)
        return self

    def _raw(self, X):
        return self.model_.predict(X)

    def to_dict(self) -> dict:
        import sklearn

        return {"model": self.name, "features": self.features, "sklearn": sklearn.__version__,
                "options": {"iterations": int(self.model_.n_iter_)}}

    def save_extra(self, path: Path) -> dict:
        import pickle

        blob = pickle.dumps(self.model_)
        side = path.with_suffix(".gbm.pkl")
        side.write_bytes(blob)
        return {"weights": side.name, "weights_sha256": hashlib.sha256(blob).hexdigest()}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        """The JSON fields; the pickle is checked against its SHA-256 and the features when read."""
        names(d, "features")
        for key in ("weights", "weights_sha256", "sklearn"):
            text(d, key)

    @classmethod
    def from_dict(cls, d: dict, path=None) -> YieldGBM:
        import pickle

        import sklearn

        if path is None:
            raise ConfigError("A yield-gbm fit is read from its file (its model lies beside it).")
        side = Path(path).parent / d.get("weights", "")
        if not d.get("weights") or not side.is_file():
            raise ConfigError(f"{path}: its model file {str(side)!r} is missing.")
        blob = side.read_bytes()
        if hashlib.sha256(blob).hexdigest() != d.get("weights_sha256"):
            raise ConfigError(f"{path}: {side.name} does not match the SHA-256 the fit file records.")
        if d.get("sklearn") != sklearn.__version__:
            raise ConfigError(f"{path}: fitted with scikit-learn {d.get('sklearn')}, this is "
                              f"{sklearn.__version__}; refit (pickled models do not move across versions).")
        self = cls(d["features"])
        self.model_ = pickle.loads(blob)
        if getattr(self.model_, "n_features_in_", len(self.features)) != len(self.features):
            raise ValueError(f"the model takes {self.model_.n_features_in_} features, the fit lists "
                             f"{len(self.features)}")
        return self


@dataclass
class MLPConfig:
    n_features: int
    hidden: int = 64
    layers: int = 2
    lr: float = 3e-3
    weight_decay: float = 1e-4
    batch_size: int = 512
    max_epochs: int = 200
    patience: int = 10
    val_fraction: float = 0.15
    seed: int = 0


def _mlp(cfg: MLPConfig):
    from torch import nn

    mods, width = [], cfg.n_features
    for _ in range(cfg.layers):
        mods += [nn.Linear(width, cfg.hidden), nn.GELU()]
        width = cfg.hidden
    mods.append(nn.Linear(width, 1))
    return nn.Sequential(*mods)


@register_fitter
class YieldMLP(_YieldFitter):
    """g_theta: an MLP on the standardised cache features, squared error on the oracle yield."""

    name = "yield-mlp"

    def summary(self) -> list[str]:
        opts = self.log_
        return [*super().summary(), f"{opts['epochs']} epochs, validation MSE {opts['best_val_mse']:.3f}"]

    def __init__(self, features: list[str] | None = None, seed: int = 0, mlp_hidden: int = 0,
                 device: str = "auto"):
        super().__init__(features, seed)
        self.hidden = mlp_hidden or 64
        self.device = device

    def fit(self, data: FitData) -> YieldMLP:
        import torch

        X, y = self._xy(data)
        groups = data.frame.select(pl.struct("_run", "request").rank("dense")).to_series().to_numpy()
        cfg = MLPConfig(n_features=X.shape[1], hidden=self.hidden, seed=self.seed)
        rng = np.random.default_rng(cfg.seed)
        uniq = np.unique(groups)
        val = np.isin(groups, rng.permutation(uniq)[: max(1, int(round(cfg.val_fraction * uniq.size)))])
        if val.all() or not val.any():
            raise DataError("Too few requests to hold out a validation split for the yield MLP.")
        self.mean_, self.std_ = X[~val].mean(0), X[~val].std(0) + 1e-6
        dev = torch.device("cuda" if self.device == "auto" and torch.cuda.is_available()
                           else ("cpu" if self.device == "auto" else self.device))
        torch.manual_seed(cfg.seed)
        Xt = torch.from_numpy(((X - self.mean_) / self.std_).astype(np.float32)).to(dev)
        yt = torch.from_numpy(y.astype(np.float32)).to(dev)
        net = _mlp(cfg).to(dev)
        opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        tr, va = (torch.from_numpy(np.flatnonzero(m)).to(dev) for m in (~val, val))
        best, best_state, bad, history = float("inf"), None, 0, []
        for _ in range(cfg.max_epochs):
            net.train()
            for batch in tr[torch.randperm(tr.numel(), device=dev)].split(cfg.batch_size):
                loss = torch.mean((net(Xt[batch]).squeeze(-1) - yt[batch]) ** 2)
                opt.zero_grad()
                loss.backward()
                opt.step()
            net.eval()
            with torch.no_grad():
                v = float(torch.mean((net(Xt[va]).squeeze(-1) - yt[va]) ** 2))
            history.append(v)
            if v < best - 1e-6:
                best, bad = v, 0
                best_state = {k: t.detach().cpu().clone() for k, t in net.state_dict().items()}
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
        net.load_state_dict(best_state)
        self.net_, self.config_ = net.cpu().eval(), cfg
        self.log_ = {"epochs": len(history), "best_val_mse": best, "device": str(dev)}
        return self

    def _raw(self, X):
        import torch

        with torch.no_grad():
            x = torch.from_numpy(((X - self.mean_) / self.std_).astype(np.float32))
            return self.net_(x).squeeze(-1).numpy().astype(np.float64)

    def to_dict(self) -> dict:
        return {"model": self.name, "features": self.features, "config": asdict(self.config_),
                "mean": self.mean_.tolist(), "std": self.std_.tolist(), "options": self.log_}

    def save_extra(self, path: Path) -> dict:
        from safetensors.torch import save_file

        weights = path.with_suffix(".safetensors")
        save_file({k: v.contiguous() for k, v in self.net_.state_dict().items()}, str(weights))
        return {"weights": weights.name, "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        """The JSON fields; the weights (safetensors) are checked against the config when read."""
        n = cls.check_standardisation(d)
        cfg = config(d, "config", MLPConfig)
        if integer(cfg, "n_features", "config", minimum=1) != n:
            raise ConfigError(f"`config.n_features` is {cfg['n_features']}, but the fit lists {n} features")
        integer(cfg, "hidden", "config", minimum=1)
        text(d, "weights")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> YieldMLP:
        from safetensors.torch import load_file

        if path is None:
            raise ConfigError("A yield-mlp fit is read from its file (its weights lie beside it).")
        weights = Path(path).parent / d.get("weights", "")
        if not d.get("weights") or not weights.is_file():
            raise ConfigError(f"{path}: its weights file {str(weights)!r} is missing.")
        if d.get("weights_sha256") and hashlib.sha256(weights.read_bytes()).hexdigest() != d["weights_sha256"]:
            raise ConfigError(f"{path}: {weights.name} does not match the SHA-256 the fit file records.")
        self = cls(d["features"])
        self.config_ = MLPConfig(**d["config"])
        self.mean_, self.std_ = np.asarray(d["mean"], dtype=np.float64), np.asarray(d["std"], dtype=np.float64)
        self.net_ = _mlp(self.config_)
        self.net_.load_state_dict(load_file(str(weights)))
        self.net_.eval()
        self.log_ = d.get("options", {})
        return self
