"""Where Hybrid Verified Decoding pays off: the replay across model-drafter strengths, with τ (or
the two-sided rule's margin) chosen on one set of requests and scored on another.

The model drafter's yields are replaced by a stand-in's (independent per position, conditional
acceptance ``a`` at every position; see :mod:`svt.collect.reference_run`) at strengths from ~1.5 to
~4 tokens per cycle, so one trace of cache drafts answers "with a drafter this good, what would the
cache add?". The two-sided switch predicts the model drafter's yield too, from causal features (the
drafter's recent yields that have already been observed, the position, the cache draft's own
features), and verifies the cache draft when its predicted tokens per unit of cost beat the drafter's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from svt.simulate.costs import CostTable
from svt.simulate.hvd import TAUS, HVDRequest, WalkResult, oracle_walk, walk
from svt.simulate.stand_in import stand_in_yields

STRENGTHS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0)  # tokens per cycle of the stand-in drafter
MARGINS = (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)  # two-sided: cache when its rate > margin x model's


def rate_for_tokens_per_cycle(tokens: float, k: int) -> float:
    """The constant conditional acceptance ``a`` with 1 + a + ... + a^k = ``tokens`` (bisection)."""
    if not 1.0 <= tokens <= k + 1:
        raise ValueError(f"{tokens} tokens per cycle is outside [1, K + 1 = {k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1.0 + sum(mid ** i for i in range(1, k + 1)) < tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


BOOTSTRAP = 200  # request-level resamples of each map cell's gain
FEW_REQUESTS = 10  # a cell scored on fewer requests is drawn hatched


def total(reqs: list[HVDRequest], idx, fn, per_request: list | None = None) -> WalkResult:
    acc = WalkResult()
    for i in idx:
        one = fn(reqs[i])
        if per_request is not None:
            per_request.append(one.ms)
        acc += one
    return acc


def policy_results(reqs: list[HVDRequest], preds: list[np.ndarray], k: int, costs: CostTable, choose: list[int],
                   score: list[int], taus=TAUS) -> dict[str, WalkResult | float]:
    """Greedy, model-only, cache-only, HVD at the τ with the least time on ``choose`` (scored on
    ``score``) and the oracle switch, each summed over ``score``."""
    best_tau, best_ms = None, math.inf
    for tau in taus:
        ms = sum(walk(reqs[i], preds[i] > tau, k, costs, consult=tau < math.inf).ms for i in choose)
        if ms < best_ms:
            best_tau, best_ms = tau, ms
    ms: dict[str, list[float]] = {"model-only": [], "cache-only": [], "hvd": []}
    out = {
        "greedy": total(reqs, score, lambda r: walk(r, None, k, costs, consult=False)),
        "model-only": total(reqs, score, lambda r: walk(r, np.zeros(r.draft_len.size, bool), k, costs, consult=False),
                            ms["model-only"]),
        "cache-only": total(reqs, score, lambda r: walk(r, np.ones(r.draft_len.size, bool), k, costs, consult=True),
                            ms["cache-only"]),
        "oracle-switch": total(reqs, score, lambda r: oracle_walk(r, k, costs)),
    }
    hv = WalkResult()
    for i in score:
        one = walk(reqs[i], preds[i] > best_tau, k, costs, consult=best_tau < math.inf)
        ms["hvd"].append(one.ms)
        hv += one
    out["hvd"] = hv
    out["tau"] = best_tau
    out["per_request_ms"] = {n: np.asarray(v) for n, v in ms.items()}
    return out


def gain_interval(per_request_ms: dict[str, np.ndarray], rng: np.random.Generator,
                  n_boot: int = BOOTSTRAP) -> tuple[float, float]:
    """95 % request-level bootstrap interval of HVD's gain over the better single source (τ fixed
    where it was chosen; the scored requests resampled with replacement)."""
    n = per_request_ms["hvd"].size
    idx = rng.integers(0, n, size=(n_boot, n))
    model, cache, hvd = (per_request_ms[p][idx].sum(1) for p in ("model-only", "cache-only", "hvd"))
    gains = np.minimum(model, cache) / np.where(hvd > 0, hvd, np.nan) - 1.0
    lo, hi = np.nanpercentile(gains, [2.5, 97.5])
    return float(lo), float(hi)


def summarise(res: dict) -> dict:
    g = res["greedy"].ms
    row = {"tau": res["tau"]}
    for name in ("greedy", "model-only", "cache-only", "hvd", "oracle-switch"):
        r = res[name]
        row[name] = {"cycles_per_1000": 1000.0 * r.cycles / max(r.tokens, 1), "ms": r.ms,
                     "speedup_vs_greedy": g / r.ms if r.ms else float("nan"),
                     "cache_share": r.cache_cycles / max(r.cycles, 1)}
    best_single = min(res["model-only"].ms, res["cache-only"].ms)
    row["hvd_gain_over_best_single"] = best_single / res["hvd"].ms - 1.0 if res["hvd"].ms else float("nan")
    row["tokens"] = res["greedy"].tokens
    return row


def with_model_yields(reqs: list[HVDRequest], yields: list[np.ndarray]) -> list[HVDRequest]:
    return [HVDRequest(r.workload, r.draft_len, r.cache_yield, y, r.lookup_ms) for r, y in zip(reqs, yields,
                                                                                                  strict=True)]


@dataclass
class Split:
    """Requests τ is chosen on, requests it is scored on, and how the split was made."""

    choose: list[int]
    score: list[int]
    how: str

    def by_group(self, reqs: list[HVDRequest]):
        """(group, choose, score) for ``all`` and each workload with requests on both sides."""
        for g in ["all", *dict.fromkeys(r.workload for r in reqs)]:
            choose = [i for i in self.choose if g == "all" or reqs[i].workload == g]
            score = [i for i in self.score if g == "all" or reqs[i].workload == g]
            if choose and score:
                yield g, choose, score


def strength_map(reqs: list[HVDRequest], preds: list[np.ndarray], request_ids: list[int], k: int,
                 costs: CostTable, split: Split, seed: int = 0, strengths=STRENGTHS) -> list[dict]:
    """One row per (strength, group): the stand-in drafter at ``strengths`` tokens per cycle."""
    rows = []
    for s in strengths:
        if s > k + 1:
            continue
        a = rate_for_tokens_per_cycle(s, k)
        acc = np.full(k, a)
        sub = with_model_yields(reqs, [stand_in_yields(acc, seed, rid, r.draft_len.size)
                                       for r, rid in zip(reqs, request_ids, strict=True)])
        for gi, (g, choose, score) in enumerate(split.by_group(reqs)):
            res = policy_results(sub, preds, k, costs, choose, score)
            lo, hi = gain_interval(res["per_request_ms"], np.random.default_rng([seed, int(round(s * 100)), gi]))
            rows.append({"strength": s, "rate": a, "group": g, "requests": len(score), **summarise(res),
                         "gain_interval": [lo, hi], "gain_interval_spans_zero": bool(lo <= 0.0 <= hi),
                         "bootstrap": BOOTSTRAP, "few_requests": len(score) < FEW_REQUESTS})
    return rows


# ---- the two-sided switch -------------------------------------------------------------------------------

MODEL_FEATURES = ("decode_pos", "last_known", "known_mean4", "known_mean16", "known_count16", "draft_len",
                  "match_len", "score", "predicted_cache_yield")


def model_yield_features(model_yield: np.ndarray, cache_cols: dict[str, np.ndarray],
                         predicted_cache: np.ndarray) -> np.ndarray:
    """Causal features of the model drafter's yield at each position t of one request: only yields
    already observed at t (the drafter's run from u ended before t: u + m[u] + 1 <= t), the
    position, and the cache draft's features."""
    n = model_yield.size
    known_at = np.arange(n) + model_yield + 1  # the position from which m[u] is known
    feats = np.zeros((n, len(MODEL_FEATURES)))
    order = np.argsort(known_at, kind="stable")
    seen: list[float] = []
    j = 0
    for t in range(n):
        while j < n and known_at[order[j]] <= t:
            seen.append(float(model_yield[order[j]]))
            j += 1
        last = seen[-16:]
        feats[t, 0] = t
        feats[t, 1] = seen[-1] if seen else -1.0
        feats[t, 2] = np.mean(seen[-4:]) if seen else -1.0
        feats[t, 3] = np.mean(last) if last else -1.0
        feats[t, 4] = len(last)
    feats[:, 5] = cache_cols["draft_len"]
    feats[:, 6] = cache_cols["match_len"]
    feats[:, 7] = cache_cols["score"]
    feats[:, 8] = predicted_cache
    return feats


def two_sided(reqs: list[HVDRequest], preds: list[np.ndarray], cache_cols: list[dict[str, np.ndarray]], k: int,
              costs: CostTable, split: Split, seed: int = 0) -> dict:
    """The two-sided rule beside the one-sided one, per group, on the run's own model-drafter yields.

    A gradient-boosted regressor (scikit-learn) predicts the model drafter's yield from causal
    features; fitted on ``split.choose``. A cycle verifies the cache draft when
    (ŷ_cache + 1) / cost_cache > margin x (ŷ_model + 1) / cost_model; the margin is chosen on
    ``split.choose`` like τ. Scored on ``split.score``."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    X = [model_yield_features(r.model_yield, c, p) for r, c, p in zip(reqs, cache_cols, preds, strict=True)]
    Xc = np.concatenate([X[i] for i in split.choose])
    yc = np.concatenate([reqs[i].model_yield for i in split.choose]).astype(np.float64)
    reg = HistGradientBoostingRegressor(max_iter=100, random_state=seed).fit(Xc, yc)
    pm = [np.clip(reg.predict(x), 0, k) for x in X]
    model_ms = costs.draft(1, k) + float(costs.verify(1 + k, rows=1))

    def use_cache(i, margin):
        r = reqs[i]
        yc_hat = np.minimum(np.maximum(preds[i], 0.0), r.draft_len)
        cache_rate = (yc_hat + 1) / (costs.verify(1 + r.draft_len.astype(np.int64), rows=1) + r.lookup_ms)
        model_rate = (pm[i] + 1) / (model_ms + r.lookup_ms)
        return (r.draft_len > 0) & (cache_rate > margin * model_rate)

    out = {"features": list(MODEL_FEATURES), "regressor": "HistGradientBoostingRegressor(max_iter=100)",
           "groups": {}}
    mse = {"model_yield_mse": float(np.mean((np.concatenate([pm[i] for i in split.score])
                                             - np.concatenate([reqs[i].model_yield for i in split.score])) ** 2)),
           "model_yield_var": float(np.var(np.concatenate([reqs[i].model_yield for i in split.score])))}
    out.update(mse)
    for g, choose, score in split.by_group(reqs):
        base = summarise(policy_results(reqs, preds, k, costs, choose, score))
        best_m, best_ms = None, math.inf
        for m in MARGINS:
            ms = sum(walk(reqs[i], use_cache(i, m), k, costs, consult=True).ms for i in choose)
            if ms < best_ms:
                best_m, best_ms = m, ms
        two = WalkResult()
        for i in score:
            two += walk(reqs[i], use_cache(i, best_m), k, costs, consult=True)
        g_ms = base["greedy"]["ms"]
        out["groups"][g] = {
            "requests": len(score), "one_sided_tau": base["tau"], "margin": best_m,
            "greedy_cycles_per_1000": base["greedy"]["cycles_per_1000"],
            "model_only": base["model-only"], "one_sided": base["hvd"], "oracle": base["oracle-switch"],
            "two_sided": {"cycles_per_1000": 1000.0 * two.cycles / max(two.tokens, 1), "ms": two.ms,
                          "speedup_vs_greedy": g_ms / two.ms if two.ms else float("nan"),
                          "cache_share": two.cache_cycles / max(two.cycles, 1)},
        }
    return out
