"""The AV replay at one concurrency with every step's choices made in compiled loops.

The steps are laid out once (rows gathered in time order, each step's bounds), the costs become
tables indexed by batch size and token count, and each policy yields per-row tokens and per-step
times that one vectorised sum turns into the replay's point. What each policy decides is defined in
:mod:`svt.simulate.av` (the per-step numpy reference); the kernels are
:mod:`svt.simulate.replay_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svt.simulate import replay_kernel as rk
from svt.simulate.costs import CostTable
from svt.simulate.steps import (
    StepTrace,
    capped,
    policy_rows,
    request_tokens,
    same_rows,
    step_order,
    verify_curve,
)

ORACLE_ITERS = 50  # as av.oracle_choices


@dataclass
class _Layout:
    rows: np.ndarray  # trace rows, step after step
    starts: np.ndarray  # [G + 1]: step g is rows[starts[g]:starts[g + 1]]
    n: np.ndarray  # [G] rows per step
    request: np.ndarray  # [R] request of each laid-out row
    a: np.ndarray  # [R] accepted run of each laid-out row
    source: np.ndarray  # [R] the row of the replayed trace each laid-out row copies (its confidences)


def _layout(trace: StepTrace, B: int, source: np.ndarray | None = None) -> _Layout:
    rows, starts = step_order(trace, B)
    return _Layout(rows, starts, np.diff(starts), trace.request[rows], trace.a[rows].astype(np.int64),
                   rows if source is None else source[rows])


@dataclass
class _Tables:
    draft: np.ndarray  # [n_max + 1, K + 1]: draft(n, k)
    verify: np.ndarray  # [n_max + 1, n_max (K + 1) + 1]: verify(t) over n rows, as measured
    convex: tuple[np.ndarray, np.ndarray]  # curves and offsets by n (convex minorants)
    raw: tuple[np.ndarray, np.ndarray]  # the same as measured


def _curves(costs: CostTable, n_max: int, K: int, convex: bool) -> tuple[np.ndarray, np.ndarray]:
    off = np.zeros(n_max + 2, dtype=np.int64)
    parts = [np.zeros(0)]
    for n in range(1, n_max + 1):
        off[n] = off[n - 1] + parts[-1].size
        parts.append(verify_curve(costs, n, n * K, convex))
    return np.concatenate(parts), off


def _tables(costs: CostTable, n_max: int, K: int) -> _Tables:
    draft = np.zeros((n_max + 1, K + 1))
    for n in range(1, n_max + 1):
        for k in range(K + 1):
            draft[n, k] = costs.draft(n, k)
    verify = np.zeros((n_max + 1, n_max * (K + 1) + 1))
    for n in range(1, n_max + 1):
        verify[n] = costs.verify(np.arange(n_max * (K + 1) + 1), rows=n)
    return _Tables(draft, verify, _curves(costs, n_max, K, True), _curves(costs, n_max, K, False))


def _point(policy: str, B: int, lay: _Layout, tokens: np.ndarray, ms: np.ndarray, n_req: int, need: float) -> dict:
    """av._accumulate, vectorised: per-request sums add in time order, as the loop does."""
    tok_req = np.bincount(lay.request, weights=tokens, minlength=n_req)
    time_req = np.bincount(lay.request, weights=np.repeat(ms, lay.n), minlength=n_req)
    total_tok = float(tokens.sum())  # whole numbers: exact in any order
    total_time = float(np.cumsum(ms)[-1])  # in step order, as the loop adds
    active = time_req > 0
    return {"policy": policy, "concurrency": B,
            "tokens_per_step": total_tok / lay.rows.size,
            "step_ms": total_time / lay.n.size,
            "mean_batch": lay.rows.size / lay.n.size,
            "output_share": float(total_tok / need) if need else None,
            "throughput": total_tok / (total_time / 1e3),
            "interactivity": float(np.mean(tok_req[active] / (time_req[active] / 1e3)))}


def _policies(trace: StepTrace, lay0: _Layout, tab: _Tables, engine_rule: bool) -> dict:
    """Each policy of ``av.replay`` as ``fn(lay) -> (tokens per laid-out row, ms per step)`` on
    request-steps of ``trace`` laid out as ``lay``, in the replay's order."""
    K = trace.k
    draft_k = tab.draft[:, K].copy()
    means = {name: c.mean(0).astype(np.float64) for name, c in trace.confidence.items()}  # the whole trace's
    shared: dict[str, np.ndarray] = {}  # on the trace's own steps, one gather for a predictor's three policies

    def conf(lay: _Layout, name: str) -> np.ndarray:
        if lay is not lay0:  # a policy's own steps: laid out for that policy alone
            return np.ascontiguousarray(trace.confidence[name][lay.source], dtype=np.float64)
        if name not in shared:
            shared[name] = np.ascontiguousarray(trace.confidence[name][lay.source], dtype=np.float64)
        return shared[name]

    def fixed(k: int):
        def fn(lay):
            tokens = (np.minimum(lay.a, k) + 1).astype(np.float64)
            return tokens, tab.draft[lay.n, k] + tab.verify[lay.n, lay.n + lay.n * k]
        return fn

    def budget(name: str, curves):
        def fn(lay):
            kept = np.zeros(lay.rows.size, dtype=np.int64)
            rk.av_kept(conf(lay, name), lay.starts, curves[0], curves[1], draft_k, kept)
            tokens = (np.minimum(lay.a, kept) + 1).astype(np.float64)
            return tokens, tab.draft[lay.n, K] + tab.verify[lay.n, _verified(lay.n, kept, lay, trace.verification)]
        return fn

    def av_length(name: str):
        def fn(lay):
            c = conf(lay, name)
            lengths = np.zeros(lay.rows.size, dtype=np.int64)
            rk.draft_lengths_all(c, lay.starts, means[name], tab.convex[0], tab.convex[1], tab.draft, lengths)
            kept = np.zeros(lay.rows.size, dtype=np.int64)
            rk.av_length_kept(c, lay.starts, lengths, tab.convex[0], tab.convex[1], draft_k, kept)
            tokens = (np.minimum(lay.a, kept) + 1).astype(np.float64)
            longest = np.maximum.reduceat(lengths, lay.starts[:-1])
            return tokens, tab.draft[lay.n, longest] + tab.verify[lay.n, _verified(lay.n, kept, lay, trace.verification)]
        return fn

    def oracle(lay):
        tokens = np.zeros(lay.rows.size)
        ms = np.zeros(lay.n.size)
        rk.oracle_steps(lay.a, lay.starts, tab.draft, tab.verify, K, ORACLE_ITERS, tokens, ms)
        return tokens, ms

    names = list(trace.confidence)
    fns = {f"fixed K={k}": fixed(k) for k in range(K + 1)}
    fns.update({f"AV {name}": budget(name, tab.convex) for name in names})
    if engine_rule:
        fns.update({f"AV {name} [engine rule]": budget(name, tab.raw) for name in names})
    fns.update({f"AV+length {name}": av_length(name) for name in names})
    fns["oracle"] = oracle
    return fns


def replay_points(trace: StepTrace, costs: CostTable, B: int, engine_rule: bool) -> list[dict]:
    """The points of ``av.replay`` at concurrency ``B``, in its order (pareto not yet marked): each
    policy run on the trace's steps, then on the request-steps it runs itself
    (``steps.policy_trace``), its requests' tokens held to what they emitted in the trace."""
    lay0 = _layout(trace, B)
    n_req = int(trace.request.max()) + 1
    n_max = min(B, int(np.unique(trace.request).size))  # no step holds more rows, on any policy's steps
    tab = _tables(costs, n_max, trace.k)
    budget = request_tokens(trace)
    need = float(budget.sum())
    points = []
    fns = _policies(trace, lay0, tab, engine_rule)
    oracle = fns.pop("oracle")
    for name, fn in fns.items():
        tokens, ms = fn(lay0)
        row_tokens = np.empty(trace.request.size)
        row_tokens[lay0.rows] = tokens
        rows, step = policy_rows(trace, row_tokens)
        lay = lay0
        if not same_rows(rows, trace):  # the policy runs its own request-steps: lay those out
            own = StepTrace(trace.request[rows], step, trace.a[rows], trace.k, {}, trace.schedule, trace.verification)
            lay = _layout(own, B, rows)
            tokens, ms = fn(lay)
        points.append(_point(name, B, lay, capped(lay.request, tokens, budget), ms, n_req, need))
    points.append(_point("oracle", B, lay0, *oracle(lay0), n_req, need))  # on the trace's own steps
    return points


def _verified(sizes: np.ndarray, kept: np.ndarray, lay: _Layout, verification: str) -> np.ndarray:
    """Each step's verify tokens (steps.verified_tokens, vectorised)."""
    if verification == "padded":
        return sizes * (1 + np.maximum.reduceat(kept, lay.starts[:-1]))
    return sizes + np.add.reduceat(kept, lay.starts[:-1])


FLIP_VALUES = (0.01, 0.99)  # as av.flip_rate


def flip_counts(conf: np.ndarray, steps: list[np.ndarray], costs: CostTable, K: int, convex: bool) -> tuple[int, int]:
    """av.flip_rate's decisions and flips over ``steps`` (row indices of each): per step, the step
    as it is and every variant with one row's later confidences set to each of ``FLIP_VALUES``,
    decided together in one compiled call."""
    n_max = max(int(rows.size) for rows in steps)
    tab = _tables(costs, n_max, K)
    curves, off = tab.convex if convex else tab.raw
    draft_k = tab.draft[:, K].copy()
    decisions = flips = 0
    for rows in steps:
        c = np.ascontiguousarray(conf[rows], dtype=np.float64)
        n = c.shape[0]
        variants = [c]
        for r in range(n):
            for i in range(K - 1):
                for v in FLIP_VALUES:
                    alt = c.copy()
                    alt[r, i + 1:] = v
                    variants.append(alt)
        stacked = np.concatenate(variants)
        starts = np.arange(len(variants) + 1, dtype=np.int64) * n
        kept = np.zeros(stacked.shape[0], dtype=np.int64)
        rk.av_kept(stacked, starts, curves, off, draft_k, kept)
        base = kept[:n]
        alt_kept = kept[n:].reshape(n, K - 1, len(FLIP_VALUES), n)  # variant (r, i, v), then its rows
        r_idx = np.arange(n)
        own = alt_kept[r_idx, :, :, r_idx]  # [n, K - 1, values]: the changed row's own decision
        kept_i = base[:, None] > np.arange(K - 1)[None, :]
        flipped = ((own > np.arange(K - 1)[None, :, None]) != kept_i[:, :, None]).any(axis=2)
        decisions += n * (K - 1)
        flips += int(flipped.sum())
    return decisions, flips
