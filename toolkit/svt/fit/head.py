"""A trained confidence head on the drafter's hidden state (the DSpark-style baseline).

    p = sigmoid(head(h) + b_position)

``head`` is a linear layer (default) or a small MLP; trained in torch with binary cross-entropy on
the labelled drafts of the training requests, early stopping on a validation share of them. Saved
as safetensors (weights) plus the JSON fit file (config, training summary). Needs runs collected
with ``log.hidden: true``.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError
from svt.fit.base import FitData, Fitter, PredictContext, check_positions, register_fitter
from svt.fit.files import config, integer, section, text
from svt.fit.head_config import HeadConfig


def hidden_matrix(drafts: pl.DataFrame, runs: list[str | Path]) -> np.ndarray:
    """The drafter's hidden state for each row of ``drafts`` (needs ``_run`` and the keys)."""
    from svt.traces.io import open_run

    frames = []
    for i, path in enumerate(runs):
        run = open_run(path, deep=False)
        if not run.has("hidden"):
            raise DataError(f"{path}: no `hidden` table; collect with `--set log.hidden=true` to train a head.")
        frames.append(run.scan("hidden").with_columns(pl.lit(i).alias("_run")))
    keys = ["_run", "request", "step", "position"]
    joined = drafts.select(keys).join(pl.concat(frames).collect(), on=keys, how="left", maintain_order="left")
    if joined["hidden"].null_count():
        raise DataError(f"{joined['hidden'].null_count()} drafts have no hidden state in the `hidden` table.")
    hidden = joined["hidden"]
    widths = hidden.list.len().unique()
    if widths.len() != 1 or widths[0] == 0:
        raise DataError(f"The `hidden` tables hold states of sizes {sorted(widths.to_list())}: one drafter's "
                        "states are expected.")
    return hidden.explode().cast(pl.Float32).to_numpy(writable=True).reshape(hidden.len(), int(widths[0]))


@register_fitter
class HeadFitter(Fitter):
    """``head``: a confidence head on the drafter's hidden state (needs ``log.hidden: true``)."""

    name = "head"
    supports_live = False  # it needs the drafter's hidden state inside the collector
    model_file = True

    def summary(self) -> list[str]:
        opts = self.log_
        return [*super().summary(), f"{opts['epochs']} epochs, validation log-loss {opts['best_val_log_loss']:.4f}"]

    def __init__(self, mlp_hidden: int = 0, device: str = "auto", seed: int = 0):
        self.mlp_hidden, self.device, self.seed = mlp_hidden, device, seed

    feature = "hidden"
    lossless = True  # a function of the drafting context, not of the sampled token

    def fit(self, data: FitData) -> HeadFitter:
        f = data.frame
        h = hidden_matrix(f, data.runs)
        self.config_ = HeadConfig(hidden_size=h.shape[1], k=data.k, mlp_hidden=self.mlp_hidden, seed=data.seed)
        groups = f.select(pl.struct("_run", "request").rank("dense")).to_series().to_numpy()
        from svt.fit.head_torch import train_head

        self.head_, log = train_head(h, f["position"].to_numpy(), f["label"].to_numpy().astype(np.float64),
                                     groups, self.config_, device=self.device)
        log.pop("config")
        self.log_ = log
        return self

    def predict(self, frame, ctx: PredictContext | None = None) -> np.ndarray:
        check_positions(frame, self.config_.k)
        if ctx is None or not ctx.runs:
            raise DataError("Predicting with a head needs the run paths (hidden states).")
        h = hidden_matrix(frame, ctx.runs)
        if h.shape[1] != self.config_.hidden_size:
            raise DataError(f"The head reads hidden states of size {self.config_.hidden_size}, but these runs "
                            f"logged size {h.shape[1]} (another drafter).")
        from svt.fit.head_torch import predict_head

        return predict_head(self.head_, h, frame["position"].to_numpy())

    def to_dict(self) -> dict:
        return {"model": self.name, "feature": "hidden", "config": asdict(self.config_), "options": self.log_}

    def save_extra(self, path: Path) -> dict:
        weights = path.with_suffix(".safetensors")
        from svt.fit.head_torch import save_head

        save_head(self.head_, weights)
        return {"weights": weights.name}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        """The JSON fields; the weights (safetensors) are checked against the config when read."""
        cfg = config(d, "config", HeadConfig)
        integer(cfg, "hidden_size", "config", minimum=1)
        integer(cfg, "k", "config", minimum=1)
        text(d, "weights")
        section(d, "options", required=False)

    @classmethod
    def from_dict(cls, d: dict, path: Path | None = None) -> HeadFitter:
        if path is None:
            raise ConfigError("A head fit is read from its file (its weights lie beside it).")
        weights = Path(path).parent / d.get("weights", "")
        if not d.get("weights") or not weights.is_file():
            raise ConfigError(f"{path}: its weights file {str(weights)!r} is missing.")
        self = cls()
        self.config_ = HeadConfig(**d["config"])
        from svt.fit.head_torch import load_head

        self.head_ = load_head(self.config_, weights)
        self.log_ = d.get("options", {})
        return self

    def label(self) -> str:
        return "head(hidden)"


def __getattr__(name: str):
    """The torch side (``ConfidenceHead``, ``train_head``, ``predict_head``, ``save_head``,
    ``load_head``) is read from ``svt.fit.head_torch`` on first use."""
    if name in ("ConfidenceHead", "train_head", "predict_head", "save_head", "load_head"):
        from svt.fit import head_torch

        return getattr(head_torch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
