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
    # how an engine at concurrency B schedules the requests (SCHEDULES): static batches of B that
    # drain, or continuous batching (B in flight; a finished request's slot takes the next one)
    schedule: str = "static"
    # how the engine verifies a step whose rows keep different numbers of drafts (VERIFICATIONS):
    # packed (one forward over the kept tokens alone, as vLLM's flattened batch) or padded (every
    # row padded to the longest kept row, as svt's engine): what AV's steps are charged
    verification: str = "packed"


SCHEDULES = ("static", "continuous")
VERIFICATIONS = ("packed", "padded")


def verified_tokens(n: int, kept: np.ndarray, verification: str) -> int:
    """Tokens of a step's verify forward: n rows, ``kept`` drafts each."""
    if verification == "padded":
        return int(n * (1 + int(kept.max()))) if kept.size else n
    return int(n + kept.sum())


def step_groups(trace: StepTrace, B: int) -> list[np.ndarray]:
    """Row indices of each engine step at concurrency B, in time order, under ``trace.schedule``:

    - ``static``: requests are taken B at a time in request order, and a batch's step s holds those
      of them that still have an s-th step (the batch drains; the next starts when it is empty);
    - ``continuous``: B slots; each request, in request order, takes the first slot to free up and
      runs its steps (in step order) at consecutive engine steps from there, as svt's engine with
      ``schedule: continuous`` (and vLLM, SGLang) run them while requests wait.
    """
    if trace.schedule == "continuous":
        return _continuous_groups(trace, B)
    if trace.schedule != "static":
        raise ValueError(f"Expected a schedule in {SCHEDULES}, but got {trace.schedule!r}.")
    _, req_rank = np.unique(trace.request, return_inverse=True)
    chunk = req_rank // B
    order = np.lexsort((trace.request, trace.step, chunk))
    key = chunk[order] * (trace.step.max() + 1) + trace.step[order]
    cuts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True])
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def continuous_ticks(trace: StepTrace, B: int) -> np.ndarray:
    """The engine step each row runs at under continuous batching with B slots (see ``step_groups``)."""
    import heapq

    if not trace.request.size:
        return np.zeros(0, dtype=np.int64)
    _, inv, counts = np.unique(trace.request, return_inverse=True, return_counts=True)
    free = [(0, s) for s in range(min(B, counts.size))]  # (free from engine step, slot)
    start = np.empty(counts.size, dtype=np.int64)
    for r, n in enumerate(counts.tolist()):
        t, s = heapq.heappop(free)
        start[r] = t
        heapq.heappush(free, (t + n, s))
    order = np.lexsort((trace.step, inv))  # each request's rows in step order
    rank = np.empty(inv.size, dtype=np.int64)
    rank[order] = np.arange(inv.size) - np.repeat(np.cumsum(counts) - counts, counts)
    return start[inv] + rank


def _continuous_groups(trace: StepTrace, B: int) -> list[np.ndarray]:
    tick = continuous_ticks(trace, B)
    order = np.lexsort((trace.request, tick))
    cuts = np.flatnonzero(np.r_[True, tick[order][1:] != tick[order][:-1], True])
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
