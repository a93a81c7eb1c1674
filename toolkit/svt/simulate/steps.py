"""The replay's input and what every policy reads of it: the request-steps of a trace, the engine
steps they form at a concurrency, and the verify-cost curve over a step's token range (as measured
or its greatest convex minorant)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svt.simulate.costs import CostTable


@dataclass
class StepTrace:
    """Request-steps of a trace: ``request`` and ``step`` ``[S]``, accepted run ``a`` ``[S]``,
    number of drafts ``k`` (K), and predictors' confidences ``{name: [S, K]}``."""

    request: np.ndarray
    step: np.ndarray
    a: np.ndarray
    k: int
    confidence: dict[str, np.ndarray]


def step_groups(trace: StepTrace, B: int) -> list[np.ndarray]:
    """Row indices of each engine step at concurrency B, in time order."""
    _, req_rank = np.unique(trace.request, return_inverse=True)
    chunk = req_rank // B
    order = np.lexsort((trace.request, trace.step, chunk))
    key = chunk[order] * (trace.step.max() + 1) + trace.step[order]
    cuts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def convex_minorant(y: np.ndarray) -> np.ndarray:
    """The greatest convex minorant of ``y`` sampled at 0, 1, 2, ... (its lower convex hull,
    evaluated at the same points).

    >>> convex_minorant(np.array([1.0, 2.0, 2.4])).round(3).tolist()
    [1.0, 1.7, 2.4]
    """
    x = np.arange(y.size, dtype=np.float64)
    hull: list[int] = []
    for i in range(y.size):  # Andrew's monotone chain, lower hull
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return np.interp(x, x[hull], y[hull])


def verify_curve(costs: CostTable, n: int, width: int, convex: bool) -> np.ndarray:
    """verify(n .. n + width) as measured or its convex minorant over that range (cached per table:
    the replay asks for the same few ranges thousands of times)."""
    cache = costs.__dict__.setdefault("_curves", {})
    key = (n, width, convex)
    if key not in cache:
        v = np.asarray(costs.verify(n + np.arange(width + 1), rows=n), dtype=np.float64)
        cache[key] = convex_minorant(v) if convex else v
    return cache[key]
