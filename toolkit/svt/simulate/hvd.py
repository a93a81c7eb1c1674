"""Trace-driven replay of Hybrid Verified Decoding on a greedy run.

Each request is walked from decode position 0. A cycle at position t verifies one draft and
advances by its accepted length + 1 (the target's own next token). Per position the trace gives the
cache draft's length ``d[t]`` and oracle yield ``c[t]`` and the model drafter's yield ``m[t]`` (K
drafts). Policies:

- ``greedy``: no speculation, one token per cycle;
- ``model-only``: the model drafter's K drafts every cycle;
- ``cache-only`` (SuffixDecoding): the cache draft every cycle (an empty draft is a plain step);
- ``hvd <predictor> tau=<τ>``: the cache draft when the predicted yield exceeds τ, else the model
  drafter. A position without a cache draft has predicted yield 0 (its empty draft yields 0), so
  τ = -inf is cache-only and τ = +inf model-only, exactly;
- ``oracle-switch``: knows both yields and picks, per cycle, the source that minimises the request's
  total simulated time (dynamic programming over positions): a bound on every switch.

Simulated time at batch 1 under a cost table: a model cycle pays ``draft(1, K) + verify(1 + K)``;
a cache cycle pays the measured lookup time + ``verify(1 + d[t])``; every cycle of a policy that
consults the cache pays the lookup (the predictor's own cost is not modelled: it is an MLP of a few
thousand weights). Greedy pays ``verify(1)`` per token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from svt.simulate.costs import CostTable

TAUS = (-math.inf, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, math.inf)


@dataclass
class HVDRequest:
    """One request's per-position arrays (length = output tokens)."""

    workload: str
    draft_len: np.ndarray
    cache_yield: np.ndarray
    model_yield: np.ndarray
    lookup_ms: np.ndarray


@dataclass
class WalkResult:
    cycles: int = 0
    tokens: int = 0
    ms: float = 0.0
    cache_cycles: int = 0
    accepted: int = 0  # drafts accepted over all cycles

    def __iadd__(self, o: WalkResult) -> WalkResult:
        self.cycles += o.cycles
        self.tokens += o.tokens
        self.ms += o.ms
        self.cache_cycles += o.cache_cycles
        self.accepted += o.accepted
        return self


def walk(req: HVDRequest, use_cache: np.ndarray | None, k: int, costs: CostTable, *,
         consult: bool) -> WalkResult:
    """Walk one request. ``use_cache[t]`` says whether the cycle at t verifies the cache draft
    (``None``: greedy decoding). ``consult``: every cycle pays the cache lookup."""
    n = req.draft_len.size
    res = WalkResult(tokens=n)
    if use_cache is None:
        res.cycles = n
        res.ms = float(costs.verify(1, rows=1)) * n
        return res
    model_ms = costs.draft(1, k) + float(costs.verify(1 + k, rows=1))
    t = 0
    while t < n:
        if use_cache[t]:
            a = int(req.cache_yield[t])
            res.ms += float(costs.verify(1 + int(req.draft_len[t]), rows=1))
            res.cache_cycles += 1
        else:
            a = int(req.model_yield[t])
            res.ms += model_ms
        if consult:
            res.ms += float(req.lookup_ms[t])
        res.cycles += 1
        res.accepted += a
        t += a + 1
    return res


def oracle_walk(req: HVDRequest, k: int, costs: CostTable) -> WalkResult:
    """The switch that knows both yields: minimal total time over every per-cycle choice."""
    n = req.draft_len.size
    model_ms = costs.draft(1, k) + float(costs.verify(1 + k, rows=1))
    cache_ms = costs.verify(1 + req.draft_len.astype(np.int64), rows=1) + req.lookup_ms
    best = np.zeros(n + 1)
    choice = np.zeros(n, dtype=bool)
    for t in range(n - 1, -1, -1):
        via_model = model_ms + req.lookup_ms[t] + best[min(n, t + int(req.model_yield[t]) + 1)]
        via_cache = cache_ms[t] + best[min(n, t + int(req.cache_yield[t]) + 1)]
        choice[t] = via_cache < via_model
        best[t] = min(via_model, via_cache)
    res = walk(req, choice, k, costs, consult=True)
    if abs(res.ms - best[0]) > 1e-6 * max(1.0, best[0]):  # the walk must follow the DP's choices
        raise RuntimeError(f"oracle walk {res.ms} ms differs from its optimum {best[0]} ms")
    return res


def _row(policy: str, group: str, r: WalkResult, base: dict[str, WalkResult], **extra) -> dict:
    return {"policy": policy, "group": group, **extra, "cycles": r.cycles, "tokens": r.tokens,
            "cycles_per_1000": 1000.0 * r.cycles / max(r.tokens, 1),
            "mean_accepted_length": r.tokens / max(r.cycles, 1),  # tokens per cycle (accepted + 1)
            "cache_share": r.cache_cycles / max(r.cycles, 1), "ms": r.ms,
            "ms_per_token": r.ms / max(r.tokens, 1),
            "speedup_vs_greedy": base["greedy"].ms / r.ms if r.ms else float("nan"),
            "speedup_vs_model": base["model-only"].ms / r.ms if r.ms else float("nan"),
            "speedup_vs_cache": base["cache-only"].ms / r.ms if r.ms else float("nan")}


REQUEST_BOOTSTRAP = 200  # request-level resamples behind each replay row's interval
CI_METRICS = ("cycles_per_1000", "speedup_vs_greedy", "speedup_vs_model", "speedup_vs_cache")


def replay_hvd(requests: list[HVDRequest], predictions: dict[str, list[np.ndarray]], k: int,
               costs: CostTable, taus: tuple[float, ...] = TAUS, *, bootstrap: int = 0, seed: int = 0) -> list[dict]:
    """Rows per policy and group (``all`` and each workload). ``predictions[name][i]`` is the
    predicted yield at every position of ``requests[i]``. ``bootstrap``: add ``request_ci95`` to
    every row, the 2.5 and 97.5 percentiles of its cycles per 1000 tokens and of its speed-ups over
    greedy, model-only and cache-only over that many resamples of the group's requests (with
    replacement; every policy of a group priced on the same resample, so a ratio's two sides move
    together)."""
    groups = {"all": list(range(len(requests)))}
    for i, r in enumerate(requests):
        groups.setdefault(r.workload, []).append(i)
    n_of = [r.draft_len.size for r in requests]
    # policy -> (row extras, per request: cycles, tokens, ms, and its cache cycles)
    policies: dict[str, tuple[dict, np.ndarray, np.ndarray]] = {}

    def add(name, fn, **extra):
        walks = [fn(i, r) for i, r in enumerate(requests)]
        policies[name] = (extra, np.array([(w.cycles, w.tokens, w.ms) for w in walks], dtype=np.float64).reshape(-1, 3),
                          np.array([w.cache_cycles for w in walks], dtype=np.float64))

    add("greedy", lambda i, r: walk(r, None, k, costs, consult=False))
    add("model-only", lambda i, r: walk(r, np.zeros(n_of[i], bool), k, costs, consult=False))
    add("cache-only", lambda i, r: walk(r, np.ones(n_of[i], bool), k, costs, consult=True))
    for name, preds in predictions.items():
        for tau in taus:
            add(f"hvd {name} tau={tau:g}", lambda i, r, tau=tau, preds=preds: walk(
                r, preds[i] > tau, k, costs, consult=tau < math.inf), predictor=name, tau=tau)
    add("oracle-switch", lambda i, r: oracle_walk(r, k, costs))
    rows = []
    rng = np.random.default_rng(seed)
    for g, idx in groups.items():
        idx = np.asarray(idx, dtype=np.intp)
        base = {}
        for name in ("greedy", "model-only", "cache-only"):
            _, arr, cc = policies[name]
            base[name] = _sum(arr[idx], cc[idx])
        draws = rng.integers(0, idx.size, size=(bootstrap, idx.size)) if bootstrap and idx.size else None
        base_ms = {n: policies[n][1][idx][draws][..., 2].sum(1) for n in base} if draws is not None else {}
        for name, (extra, arr, cc) in policies.items():
            row = _row(name, g, _sum(arr[idx], cc[idx]), base, **extra)
            if draws is not None:
                row["request_ci95"] = _request_ci(arr[idx][draws].sum(1), base_ms)
            rows.append(row)
    return rows


def _sum(arr: np.ndarray, cache_cycles: np.ndarray) -> WalkResult:
    return WalkResult(cycles=int(arr[:, 0].sum()), tokens=int(arr[:, 1].sum()), ms=float(arr[:, 2].sum()),
                      cache_cycles=int(cache_cycles.sum()))


def _request_ci(sums: np.ndarray, base_ms: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """``sums``: (resamples, 3) cycles, tokens, ms of one policy; ``base_ms``: the single sources'
    ms on the same resamples."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ms = np.where(sums[:, 2] > 0, sums[:, 2], np.nan)
        vals = {"cycles_per_1000": 1000.0 * sums[:, 0] / np.maximum(sums[:, 1], 1),
                "speedup_vs_greedy": base_ms["greedy"] / ms, "speedup_vs_model": base_ms["model-only"] / ms,
                "speedup_vs_cache": base_ms["cache-only"] / ms}
    out = {}
    for m, v in vals.items():
        v = v[np.isfinite(v)]
        if v.size:
            out[m] = [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
    return out


def cost_intervals(requests: list[HVDRequest], predictions: dict[str, list[np.ndarray]], k: int, costs: CostTable,
                   taus: tuple[float, ...], rows: list[dict]) -> int:
    """Add ``cost_ci95`` to each row of :func:`replay_hvd`: the 2.5 and 97.5 percentiles of its
    speed-ups against greedy decoding, model-only and cache-only drafting over replays on the cost
    model's bootstrap refits (``CostTable.replicates``; each refit prices both sides of a ratio).
    Returns how many refits were replayed (0: the table keeps none)."""
    reps = costs.replicates()
    if len(reps) < 2:
        return 0
    draws: dict[tuple, list[float]] = {}
    for rep in reps:
        for r in replay_hvd(requests, predictions, k, rep, taus):
            for m in ("speedup_vs_greedy", "speedup_vs_model", "speedup_vs_cache"):
                draws.setdefault((r["policy"], r["group"], m), []).append(r[m])
    for r in rows:
        ci = {}
        for m in ("speedup_vs_greedy", "speedup_vs_model", "speedup_vs_cache"):
            v = draws.get((r["policy"], r["group"], m))
            if v is not None and np.isfinite(v).all():
                ci[m] = [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
        if ci:
            r["cost_ci95"] = ci
    return len(reps)


def best_tau(rows: list[dict]) -> list[dict]:
    """Per predictor and group, the τ with the least simulated time (chosen on the replayed
    requests themselves: an optimistic choice; pick τ on other requests to deploy it)."""
    out = {}
    for r in rows:
        if "predictor" not in r:
            continue
        key = (r["predictor"], r["group"])
        if key not in out or r["ms"] < out[key]["ms"]:
            out[key] = r
    return [{"predictor": p, "group": g, "tau": r["tau"], "cycles_per_1000": r["cycles_per_1000"],
             "speedup_vs_greedy": r["speedup_vs_greedy"], "speedup_vs_model": r["speedup_vs_model"],
             "speedup_vs_cache": r["speedup_vs_cache"], "cache_share": r["cache_share"],
             **{c: r[c] for c in ("cost_ci95", "request_ci95") if r.get(c)}}
            for (p, g), r in out.items()]
