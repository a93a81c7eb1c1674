"""A trained confidence head on the drafter's hidden state (the DSpark-style baseline).

    p = sigmoid(head(h) + b_position)

``head`` is a linear layer (default) or a small MLP; trained in torch with binary cross-entropy on
the labelled drafts of the training requests, early stopping on a validation share of them. Saved
as safetensors (weights) plus the JSON fit file (config, training summary). Needs runs collected
with ``log.hidden: true``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from svt.errors import ConfigError, DataError
from svt.fit.base import FitData, Fitter, PredictContext, check_positions, register_fitter
from svt.fit.files import config, integer, section, text


@dataclass
class HeadConfig:
    hidden_size: int
    k: int
    mlp_hidden: int = 0  # 0 = linear head
    lr: float = 3e-3
    weight_decay: float = 1e-4
    batch_size: int = 512
    max_epochs: int = 100
    patience: int = 5
    val_fraction: float = 0.15
    seed: int = 0


class ConfidenceHead(nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        if cfg.mlp_hidden:
            self.body = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.mlp_hidden), nn.GELU(),
                                      nn.Linear(cfg.mlp_hidden, 1))
        else:
            self.body = nn.Linear(cfg.hidden_size, 1)
        self.position_bias = nn.Embedding(cfg.k, 1)
        nn.init.zeros_(self.position_bias.weight)

    def forward(self, h: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Logits ``[n]`` from hidden states ``[n, H]`` and positions ``[n]``."""
        return self.body(h).squeeze(-1) + self.position_bias(position).squeeze(-1)


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
    return np.asarray(joined["hidden"].to_list(), dtype=np.float32)


def train_head(h: np.ndarray, position: np.ndarray, y: np.ndarray, group: np.ndarray, cfg: HeadConfig,
               device: str = "auto") -> tuple[ConfidenceHead, dict]:
    """Train on rows; ``group`` (request ids) decides the validation split. Returns (head, log)."""
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    groups = np.unique(group)
    val_groups = rng.permutation(groups)[: max(1, int(round(cfg.val_fraction * len(groups))))]
    val = np.isin(group, val_groups)
    if val.all() or not val.any():
        raise DataError("Too few requests to hold out a validation split for the head.")
    mean, std = h[~val].mean(0), h[~val].std(0) + 1e-6
    tensors = [torch.from_numpy(a).to(dev) for a in ((h - mean) / std, position.astype(np.int64),
                                                      y.astype(np.float32))]
    model = ConfidenceHead(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    loss_fn = nn.BCEWithLogitsLoss()
    tr_idx = torch.from_numpy(np.flatnonzero(~val)).to(dev)
    va_idx = torch.from_numpy(np.flatnonzero(val)).to(dev)
    best, best_state, bad, history = float("inf"), None, 0, []
    for _ in range(cfg.max_epochs):
        model.train()
        perm = tr_idx[torch.randperm(tr_idx.numel(), device=dev)]
        for batch in perm.split(cfg.batch_size):
            hb, pb, yb = (t[batch] for t in tensors)
            loss = loss_fn(model(hb, pb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            hv, pv, yv = (t[va_idx] for t in tensors)
            val_loss = float(loss_fn(model(hv, pv), yv))
        history.append(val_loss)
        if val_loss < best - 1e-5:
            best, bad = val_loss, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    model.load_state_dict(best_state)
    model = model.cpu().eval()
    model.register_buffer("input_mean", torch.from_numpy(mean))
    model.register_buffer("input_std", torch.from_numpy(std))
    return model, {"epochs": len(history), "best_val_log_loss": best, "val_history": history,
                   "device": str(dev), "config": asdict(cfg)}


def save_head(model: ConfidenceHead, path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def load_head(cfg: HeadConfig, path: Path) -> ConfidenceHead:
    from safetensors.torch import load_file

    state = load_file(str(path))
    model = ConfidenceHead(cfg)
    model.register_buffer("input_mean", state["input_mean"])
    model.register_buffer("input_std", state["input_std"])
    model.load_state_dict(state)
    return model.eval()


@torch.no_grad()
def predict_head(model: ConfidenceHead, h: np.ndarray, position: np.ndarray) -> np.ndarray:
    x = (torch.from_numpy(h) - model.input_mean) / model.input_std
    return torch.sigmoid(model(x, torch.from_numpy(position.astype(np.int64)))).numpy().astype(np.float64)


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
        return predict_head(self.head_, h, frame["position"].to_numpy())

    def to_dict(self) -> dict:
        return {"model": self.name, "feature": "hidden", "config": asdict(self.config_), "options": self.log_}

    def save_extra(self, path: Path) -> dict:
        weights = path.with_suffix(".safetensors")
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
        self.head_ = load_head(self.config_, weights)
        self.log_ = d.get("options", {})
        return self

    def label(self) -> str:
        return "head(hidden)"
