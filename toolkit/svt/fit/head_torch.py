"""The confidence head's torch side: the module, its training loop, safetensors files and
prediction. Imported only when a head is trained, loaded or applied, so reading a fit file or the
fitter registry does not import torch."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from svt.errors import DataError
from svt.fit.head_config import HeadConfig


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
