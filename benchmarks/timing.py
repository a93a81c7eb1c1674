"""Timing helpers shared by the benchmarks: every figure is the median of several repeats with the
range beside it, and a comparison runs its contenders side by side (one of each per round), so that
a slow moment of the machine hits them alike; a ratio is taken per round, then summarised."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def rounds(fns: dict[str, Callable[[], object]], repeats: int,
           warmup: bool = True) -> tuple[dict[str, list[float]], dict[str, object]]:
    """Seconds of each function over ``repeats`` rounds (each round runs every function once, in
    order), and each function's last result. With ``warmup`` every function first runs once,
    untimed, so that one-time costs (imports, loading compiled code, first-touch allocations) fall
    on no contender's figure; the rounds measure the steady state."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    last: dict[str, object] = {}
    if warmup:
        for fn in fns.values():
            fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            last[name] = fn()
            times[name].append(time.perf_counter() - t0)
    return times, last


def summary(values: list[float]) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()), "n": int(v.size),
            "values": [float(x) for x in v]}


def ratios(ref: list[float], other: list[float]) -> dict:
    """ref / other per round (how many times faster ``other`` is), summarised."""
    return summary([a / b for a, b in zip(ref, other, strict=True)])


def fmt(s: dict, unit: str = "", digits: int = 2) -> str:
    return f"{s['median']:.{digits}f}{unit} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"
