"""The replay's input and what every policy reads of it: the request-steps of a trace, the engine
steps they form at a concurrency, and the verify-cost curve over a step's token range (as measured
or its greatest convex minorant)."""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    # tokens each request generated in the run (``[max request + 1]``, from its output): what every
    # policy's replay of it must emit; None: one per request-step plus its accepted drafts
    budget: np.ndarray | None = None


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
    order, starts = step_order(trace, B)
    return [order[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def step_order(trace: StepTrace, B: int) -> tuple[np.ndarray, np.ndarray]:
    """``step_groups`` as one array: the rows step after step, and where each step starts (``[G + 1]``)."""
    if trace.schedule == "continuous":
        tick = continuous_ticks(trace, B)
        order = np.lexsort((trace.request, tick))
        key = tick[order]
    elif trace.schedule == "static":
        _, req_rank = np.unique(trace.request, return_inverse=True)
        chunk = req_rank // B
        order = np.lexsort((trace.request, trace.step, chunk))
        key = chunk[order] * (trace.step.max() + 1) + trace.step[order]
    else:
        raise ValueError(f"Expected a schedule in {SCHEDULES}, but got {trace.schedule!r}.")
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1], True]) if key.size else np.zeros(1, dtype=np.int64)
    return order, starts


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


def dense_steps(trace: StepTrace) -> StepTrace:
    """The trace with each request's steps numbered 0, 1, 2, ... in their order. A censored run keeps
    only its explored steps and a vLLM run may lack some: with their gaps, a static batch would pair
    the trace's own steps otherwise than the steps every other policy runs (numbered densely)."""
    if not trace.request.size:
        return trace
    order = np.lexsort((trace.step, trace.request))
    req = trace.request[order]
    cut = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
    rank = np.empty(req.size, dtype=np.int64)
    rank[order] = np.arange(req.size) - np.repeat(cut, np.diff(np.r_[cut, req.size]))
    if np.array_equal(rank, trace.step):
        return trace
    return replace(trace, step=rank)


def request_tokens(trace: StepTrace) -> np.ndarray:
    """Tokens each request generated (``[max request + 1]``): ``trace.budget`` (its output's length)
    when the trace has it, else one per request-step plus its accepted drafts (which overcounts a
    last step cut short by the request's length or its end of sequence)."""
    if trace.budget is not None:
        return np.asarray(trace.budget, dtype=np.float64)
    n_req = int(trace.request.max()) + 1 if trace.request.size else 0
    return np.bincount(trace.request, weights=trace.a + 1, minlength=n_req)


def policy_rows(trace: StepTrace, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The request-steps a policy runs when row i of the trace emits ``tokens[i]`` under it: each
    request's rows in step order, taken again from its first when they run out, until it has emitted
    what it emitted in the trace (:func:`request_tokens`). A policy that emits fewer tokens a step
    (a shorter K, plain decoding) takes more steps and one that emits more takes fewer, so each
    policy's batches fill and drain on its own step counts, as the engine's would.

    Returns the trace rows in that order (request by request) and each one's step number. Under
    the trace's own policy (``tokens = a + 1``) that is every row once, in step order."""
    if not trace.request.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort((trace.step, trace.request))
    req = trace.request[order]
    cut = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
    count = np.diff(np.r_[cut, req.size])
    t = np.asarray(tokens, dtype=np.float64)[order]
    if (t < 1).any():
        raise ValueError("Every request-step emits at least one token.")
    need = request_tokens(trace)[req[cut]]
    cycle = np.add.reduceat(t, cut)  # tokens of one pass over the request's rows
    full = np.floor((need - 1) / cycle)  # whole passes before the last (partial or whole) one
    rest = need - full * cycle  # in (0, cycle]
    prefix = np.cumsum(t) - np.repeat(np.cumsum(t)[cut] - t[cut], count)  # within each request
    local = np.arange(req.size) - np.repeat(cut, count)
    reach = np.where(prefix >= np.repeat(rest, count), local, count.max())
    last = np.minimum.reduceat(reach, cut) + 1  # rows of the last pass
    n = (full.astype(np.int64) * count + last).astype(np.int64)
    j = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    rows = order[np.repeat(cut, n) + j % np.repeat(count, n)]
    return rows, j


def policy_trace(trace: StepTrace, tokens: np.ndarray) -> StepTrace | None:
    """The trace of the request-steps a policy runs (:func:`policy_rows`): the rows it takes again
    are copies under new step numbers, with their accepted runs and confidences. ``None`` when
    the policy runs the trace's own steps (nothing to re-lay)."""
    rows, step = policy_rows(trace, tokens)
    if same_rows(rows, trace):
        return None
    return StepTrace(trace.request[rows], step, trace.a[rows], trace.k,
                     {name: c[rows] for name, c in trace.confidence.items()}, trace.schedule, trace.verification,
                     trace.budget)


def same_rows(rows: np.ndarray, trace: StepTrace) -> bool:
    """Whether ``policy_rows`` took every row of the trace once (the trace policy's own steps)."""
    return rows.size == trace.request.size and bool(np.array_equal(np.sort(rows), np.arange(rows.size)))


def capped(request: np.ndarray, tokens: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """``tokens`` of rows in time order with each request's running total held to ``budget[request]``
    (its last step emits only what it still needed, as an engine stops a request at its length)."""
    order = np.argsort(request, kind="stable")  # by request, time order kept within
    t = tokens[order]
    req = request[order]
    cut = np.flatnonzero(np.r_[True, req[1:] != req[:-1]]) if req.size else np.zeros(0, dtype=np.int64)
    cum = np.cumsum(t)
    before = cum - t - np.repeat(cum[cut] - t[cut], np.diff(np.r_[cut, req.size]))
    out = np.empty_like(t)
    out[order] = np.clip(budget[req] - before, 0.0, t)
    return out
