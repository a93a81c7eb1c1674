"""Which torch device a config's ``device`` names: shared by the collectors and the fitters (a fit
trains a confidence head or a yield MLP on it), so neither imports the other's package."""

from __future__ import annotations

import os

import torch

from svt.cores import available_cores  # noqa: F401  (re-exported)
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


def set_threads(threads: int | None = None) -> int:
    """torch's intra-op threads: ``threads``, or the cores available to the process. More threads
    than free cores makes every parallel region wait for the slowest (measured: one speculative
    step 24x slower with 2 threads on 2 busy cores than with 1), so processes that share a machine
    (``--shard`` processes started together) should each pass their share. Returns the count set."""
    if threads is not None and threads < 1:
        raise ModelLoadError(f"Expected --threads >= 1, but got {threads}.")
    n = threads or available_cores()
    torch.set_num_threads(n)
    return n


def machine_load() -> dict:
    """The 1-minute load average against the cores available to this process."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = float("nan")
    return {"load_1min": round(load, 2), "cores": available_cores(), "threads": torch.get_num_threads()}
