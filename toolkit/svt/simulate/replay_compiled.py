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
from svt.simulate.steps import StepTrace, step_groups, verify_curve

ORACLE_ITERS = 50  # as av.oracle_choices


@dataclass
class _Layout:
    rows: np.ndarray  # trace rows, step after step
    starts: np.ndarray  # [G + 1]: step g is rows[starts[g]:starts[g + 1]]
    n: np.ndarray  # [G] rows per step
    request: np.ndarray  # [R] request of each laid-out row
    a: np.ndarray  # [R] accepted run of each laid-out row


def _layout(trace: StepTrace, B: int) -> _Layout:
    groups = step_groups(trace, B)
    n = np.array([g.size for g in groups], dtype=np.int64)
    rows = np.concatenate(groups)
    starts = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
    return _Layout(rows, starts, n, trace.request[rows], trace.a[rows].astype(np.int64))


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


def _point(policy: str, B: int, lay: _Layout, tokens: np.ndarray, ms: np.ndarray, n_req: int) -> dict:
    """av._accumulate, vectorised: per-request sums add in time order, as the loop does."""
    tok_req = np.bincount(lay.request, weights=tokens, minlength=n_req)
    time_req = np.bincount(lay.request, weights=np.repeat(ms, lay.n), minlength=n_req)
    total_tok = float(tokens.sum())  # whole numbers: exact in any order
    total_time = float(np.cumsum(ms)[-1])  # in step order, as the loop adds
    active = time_req > 0
    return {"policy": policy, "concurrency": B,
            "tokens_per_step": total_tok / lay.rows.size,
            "step_ms": total_time / lay.n.size,
            "throughput": total_tok / (total_time / 1e3),
            "interactivity": float(np.mean(tok_req[active] / (time_req[active] / 1e3)))}


def replay_points(trace: StepTrace, costs: CostTable, B: int, engine_rule: bool) -> list[dict]:
    """The points of ``av.replay`` at concurrency ``B``, in its order (pareto not yet marked)."""
    lay = _layout(trace, B)
    K = trace.k
    n_max = int(lay.n.max())
    tab = _tables(costs, n_max, K)
    n_req = int(trace.request.max()) + 1
    sizes = lay.n
    points = []
    for k in range(K + 1):  # fixed K=k
        tokens = (np.minimum(lay.a, k) + 1).astype(np.float64)
        ms = tab.draft[sizes, k] + tab.verify[sizes, sizes + sizes * k]
        points.append(_point(f"fixed K={k}", B, lay, tokens, ms, n_req))

    # each predictor's confidences in step order, gathered once for its three policies
    gathered = {name: np.ascontiguousarray(c[lay.rows], dtype=np.float64) for name, c in trace.confidence.items()}
    draft_k = tab.draft[:, K].copy()

    def budget(name: str, curves) -> tuple[np.ndarray, np.ndarray]:
        kept = np.zeros(lay.rows.size, dtype=np.int64)
        rk.av_kept(gathered[name], lay.starts, curves[0], curves[1], draft_k, kept)
        tokens = (np.minimum(lay.a, kept) + 1).astype(np.float64)
        return tokens, tab.draft[sizes, K] + tab.verify[sizes, _verified(sizes, kept, lay, trace.verification)]

    names = list(trace.confidence)
    for name in names:
        points.append(_point(f"AV {name}", B, lay, *budget(name, tab.convex), n_req))
    if engine_rule:
        for name in names:
            points.append(_point(f"AV {name} [engine rule]", B, lay, *budget(name, tab.raw), n_req))
    for name in names:
        conf = gathered[name]
        lengths = np.zeros(lay.rows.size, dtype=np.int64)
        rk.draft_lengths_all(conf, lay.starts, trace.confidence[name].mean(0).astype(np.float64), tab.convex[0],
                             tab.convex[1], tab.draft, lengths)
        kept = np.zeros(lay.rows.size, dtype=np.int64)
        rk.av_length_kept(conf, lay.starts, lengths, tab.convex[0], tab.convex[1], draft_k, kept)
        tokens = (np.minimum(lay.a, kept) + 1).astype(np.float64)
        longest = np.maximum.reduceat(lengths, lay.starts[:-1])
        ms = tab.draft[sizes, longest] + tab.verify[sizes, _verified(sizes, kept, lay, trace.verification)]
        points.append(_point(f"AV+length {name}", B, lay, tokens, ms, n_req))
    tokens = np.zeros(lay.rows.size)
    ms = np.zeros(sizes.size)
    rk.oracle_steps(lay.a, lay.starts, tab.draft, tab.verify, K, ORACLE_ITERS, tokens, ms)
    points.append(_point("oracle", B, lay, tokens, ms, n_req))
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
