"""What a confidence head is and how it is trained: its shape and its training settings (read by
the fitter, which does not import torch, and by the torch side that trains and loads it)."""

from __future__ import annotations

from dataclasses import dataclass


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
