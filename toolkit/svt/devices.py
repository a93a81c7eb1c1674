"""Which torch device a config's ``device`` names: shared by the collectors and the fitters (a fit
trains a confidence head or a yield MLP on it), so neither imports the other's package."""

from __future__ import annotations

import torch

from svt.errors import ModelLoadError


def resolve_device(device: str) -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cuda`` without a GPU is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("Expected a CUDA device for `device: cuda`, but torch sees no GPU.")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ModelLoadError(f"Expected `device` to be auto, cpu or cuda[:N], but got {device!r}.")
    return torch.device(device)
