"""Trace-driven replay of Adaptive Verification against fixed draft lengths.

At concurrency B, requests are taken B at a time (in request order); at each step the batch holds
those of them that still have a step in the trace. Each request has K confidences c_i and its real
accepted run a (from the labels). Per step, for B' active requests:

- ``fixed k``: every request keeps min(k, K) drafts; cost = draft(B', k) + verify(B' + B' k);
- ``AV``: survival s_i = prod_{j<=i} c_j, sorted descending over the batch; expected tokens for a
  budget b = B' + sum of the top b survivals; cost(b) = draft(B', K) + verify(B' + b);
  b* = argmax expected / cost; each request keeps its drafts among the top b* (a prefix, since
  survivals fall along a request);
- ``oracle``: knows a, and chooses per step the draft length k and the number b of accepted drafts
  to verify that maximise the run's total throughput (Dinkelbach's method over each step's
  options), on the trace's own request-steps: an upper bound on every policy's per-step choices
  at the trace's occupancy (on one set of steps its options include each policy's choice at no
  more cost). It is not a bound on the schedule: a policy that emits fewer tokens a step runs more
  steps, which keep the batches fuller (below), and can pass it at a large B (plain decoding at
  B = 64 on the demo's CPU table). Taken on such a policy's steps instead, with its tokens past a
  request's end counted, it would bound every policy but mostly by those tokens; held to the
  requests' lengths there, it falls below the policy itself.

A request emits min(a, kept) + 1 tokens per step. Each policy runs its own number of steps per
request: as many of the request's trace steps (in order, taken again from the first when they run
out) as it needs to emit the tokens the request emitted in the trace, its last step emitting only
what is still needed. The batches at B are formed on those steps, so a policy that emits fewer
tokens a step (plain decoding) keeps its batches fuller than the trace's policy did (the engine's
occupancy; ``steps.policy_rows``). The step counts of AV and AV+length come from the
policy run once on the trace's own steps (their tokens depend on the batch): on their own batches
they choose again, so a request can end a little short of its length or pay for a step past it
(each point's ``output_share``, the tokens emitted over the requests' decoded tokens, says how
much: 1 for a fixed K; 0.997-1 for AV on the demo). Each request's steps are numbered 0, 1, ...
first (``steps.dense_steps``): a censored run's explored steps keep no gaps. The replay ignores
the feedback of trimming on later states (the trace's steps are fixed); a live-AV collection
measures that gap.
"""

from __future__ import annotations

import numpy as np

from svt.simulate.costs import CostTable
from svt.simulate.steps import (  # noqa: F401  (re-exported)
    StepTrace,
    capped,
    convex_minorant,
    dense_steps,
    policy_trace,
    request_tokens,
    step_groups,
    verified_tokens,
    verify_curve,
)

CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


RULES = ("convex", "engine")


def av_keep(conf: np.ndarray, costs: CostTable, rule: str = "convex", k_max: int | None = None) -> np.ndarray:
    """Drafts kept per request by the AV budget rule for one step (``conf`` ``[B', K]``).

    ``engine``: the document's rule, b* = argmax expected / cost over the verify-cost curve as
    measured. It is causal only when that curve is convex in tokens; on a curve with plateaus or
    steps the decision to verify draft i can depend on the request's own later confidences (which
    depend on the drafted token itself), and speculative sampling stops being lossless.
    ``convex`` (the default): the same rule on the greatest convex minorant of the curve over the
    step's range of token counts: expected / cost is then unimodal, whether the m-th survival is
    kept depends only on the survivals ranked above it, and a request's later survivals never rank
    above its earlier ones, so every decision is causal (lossless with any lossless feature).
    """
    if rule not in RULES:
        raise ValueError(f"Expected `rule` in {RULES}, but got {rule!r}.")
    n, K = conf.shape
    K_all = max(K, k_max or K)  # the cost curve's range and the draft cost do not depend on
    surv = np.cumprod(conf, axis=1)  # how much was drafted (a causal budget needs that)
    flat = surv.ravel()
    order = np.lexsort((np.tile(np.arange(K), n), -flat))  # by survival, then position: prefixes
    expected = n + np.concatenate([[0.0], np.cumsum(flat[order])])
    verify = verify_curve(costs, n, n * K_all, rule == "convex")
    cost = costs.draft(n, K_all) + verify[: n * K + 1]
    b = int(np.argmax(expected / cost))
    kept = np.zeros(n * K, dtype=bool)
    kept[order[:b]] = True
    return kept.reshape(n, K).sum(1)


def _accumulate(groups, trace, per_step, budget=None, need=None):
    """Totals from per-step (tokens per request, step time) choices; with ``budget`` (tokens per
    request), a request's last step emits only what it still needed (:func:`steps.capped`).
    ``output_share``: the tokens emitted over ``need``, the requests' decoded tokens (1 for a fixed
    K; AV's own steps can end a request short or leave it paying for steps past its end)."""
    n_req = int(trace.request.max()) + 1 if trace.request.size else 0
    tok_req = np.zeros(n_req)
    time_req = np.zeros(n_req)
    total_tok = total_time = 0.0
    for rows in groups:
        tokens, ms = per_step(rows)
        if budget is not None:
            tokens = np.clip(budget[trace.request[rows]] - tok_req[trace.request[rows]], 0.0, tokens)
        tok_req[trace.request[rows]] += tokens
        time_req[trace.request[rows]] += ms
        total_tok += tokens.sum()
        total_time += ms
    active = time_req > 0
    rows_total = sum(len(g) for g in groups)
    return {
        "tokens_per_step": total_tok / rows_total,
        "step_ms": total_time / len(groups),
        "mean_batch": rows_total / len(groups),
        "output_share": float(total_tok / need) if need else None,
        "throughput": total_tok / (total_time / 1e3),
        "interactivity": float(np.mean(tok_req[active] / (time_req[active] / 1e3))),
    }


def _row_tokens(groups, trace, per_step) -> np.ndarray:
    """Tokens each trace row emits under a policy run on ``groups``."""
    out = np.zeros(trace.request.size)
    for rows in groups:
        out[rows] = per_step(rows)[0]
    return out


def _fixed(k: int, trace, costs):
    def per_step(rows):
        n = len(rows)
        kept = min(k, trace.k)
        tokens = np.minimum(trace.a[rows], kept) + 1
        return tokens, costs.draft(n, kept) + float(costs.verify(n + n * kept, rows=n))
    return per_step


def _av(name: str, trace, costs, rule: str = "convex"):
    conf = trace.confidence[name]

    def per_step(rows):
        n = len(rows)
        kept = av_keep(conf[rows], costs, rule)
        tokens = np.minimum(trace.a[rows], kept) + 1
        return tokens, costs.draft(n, trace.k) + float(costs.verify(verified_tokens(n, kept, trace.verification), rows=n))
    return per_step


def draft_lengths(conf: np.ndarray, costs: CostTable, next_conf: np.ndarray,
                  sharing: np.ndarray | None = None) -> np.ndarray:
    """How many drafts each request drafts this step (causal, per request): after drafting position
    j, draft j + 1 while the predicted marginal tokens of one more draft (survival so far times the
    predicted next confidence ``next_conf[j + 1]``, a constant per position) are worth more, at the
    batch's plain-decoding rate (tokens per ms), than one more verified token plus this request's
    share of the extra draft pass. ``sharing[j]``: how many requests are expected to share pass
    j + 2 (from earlier steps; default all of them). Each request's length depends only on its own
    confidences so far, so the lossless verification budget stays causal on top of it."""
    n, K = conf.shape
    surv = np.cumprod(conf, axis=1)
    verify = verify_curve(costs, n, n * K, True)
    rate = n / float(verify[0])  # tokens per ms of plain decoding at this batch size
    per_token = float(verify[1] - verify[0])  # marginal verify cost of one more token (convex)
    share = np.full(K, float(n)) if sharing is None else np.maximum(1.0, sharing)
    lengths = np.ones(n, dtype=np.int64)  # the first draft is always proposed
    for j in range(K - 1):
        extra_pass = (costs.draft(n, j + 2) - costs.draft(n, j + 1)) / share[j]
        worth = surv[:, j] * next_conf[j + 1] > (extra_pass + per_token) * rate
        lengths = np.where((lengths == j + 1) & worth, j + 2, lengths)
    return lengths


def _av_length(name: str, trace, costs, next_conf=None):
    """Draft-length policy + AV: each request drafts its causal length, the batch pays the longest,
    then the lossless budget rule chooses what to verify among the drafted positions. How many
    requests share each extra pass is learned from the previous steps (per batch size).
    ``next_conf``: the predictor's mean confidence at each position (a constant; default this
    trace's)."""
    conf = trace.confidence[name]
    if next_conf is None:
        next_conf = conf.mean(0)
    sharing: dict[int, np.ndarray] = {}

    def per_step(rows):
        n = len(rows)
        c = conf[rows]
        lengths = draft_lengths(c, costs, next_conf, sharing.get(n))
        # what this step shows for the next ones: how many requests went on past each position
        sharing[n] = np.array([(lengths > j + 1).sum() for j in range(trace.k)], dtype=np.float64)
        drafted = np.where(np.arange(trace.k)[None, :] < lengths[:, None], c, 0.0)
        kept = np.minimum(av_keep(drafted, costs, "convex"), lengths)
        tokens = np.minimum(trace.a[rows], kept) + 1
        return tokens, costs.draft(n, int(lengths.max())) + float(
            costs.verify(verified_tokens(n, kept, trace.verification), rows=n))
    return per_step


def _oracle_options(rows, trace, costs):
    """Every (tokens, time) option of one step for an oracle that knows the accepted runs."""
    n = len(rows)
    opts_tok, opts_time = [], []
    for k in range(trace.k + 1):
        bmax = int(np.minimum(trace.a[rows], k).sum())
        b = np.arange(bmax + 1)
        opts_tok.append(n + b)
        opts_time.append(costs.draft(n, k) + costs.verify(n + b, rows=n))
    return np.concatenate(opts_tok).astype(np.float64), np.concatenate(opts_time)


def oracle_choices(groups, trace, costs, iters: int = 50):
    """Dinkelbach: the per-step choices maximising total tokens / total time."""
    options = [_oracle_options(rows, trace, costs) for rows in groups]
    lam = 0.0
    for _ in range(iters):
        picks = [int(np.argmax(t - lam * m)) for t, m in options]
        tok = sum(t[p] for (t, _), p in zip(options, picks, strict=True))
        time = sum(m[p] for (_, m), p in zip(options, picks, strict=True))
        new = tok / time
        if abs(new - lam) <= 1e-12 * max(1.0, new):
            break
        lam = new
    return options, picks


def _oracle(groups, trace, costs):
    options, picks = oracle_choices(groups, trace, costs)
    choice = {id(rows): (options[i][0][picks[i]], options[i][1][picks[i]]) for i, rows in enumerate(groups)}

    def per_step(rows):
        tok, ms = choice[id(rows)]
        # the oracle verifies b of the accepted drafts: spread them over the requests greedily
        n = len(rows)
        b = int(tok) - n
        tokens = np.ones(n)
        a = trace.a[rows].astype(np.int64)
        take = np.minimum(a, np.maximum(0, b - np.concatenate([[0], np.cumsum(a)[:-1]])))
        return tokens + take, float(ms)
    return per_step


def replay(trace: StepTrace, costs: CostTable, *, concurrency=CONCURRENCY, engine_rule: bool = False,
           compiled: bool = True) -> list[dict]:
    """Every policy at every concurrency: tokens per step, step time, interactivity (tokens/s per
    request), throughput (tokens/s); ``pareto`` marks the points no other policy's point dominates
    (the oracle, a bound on per-step choices, is left out of that comparison: its ``pareto`` is None). AV uses the
    lossless (convex) budget rule; ``engine_rule`` adds ``AV <name> [engine rule]`` beside it.

    ``compiled`` (the default) makes every step's choices in compiled loops
    (:mod:`svt.simulate.replay_kernel`), the same numbers bit for bit as the per-step numpy
    definitions above (``compiled=False``, the reference). The kernels compute in float64: a trace
    with other confidences (``build_trace`` makes float64 ones) takes the reference."""
    trace = dense_steps(trace)  # each request's steps 0, 1, ...: as every policy's own steps are numbered
    if compiled and trace.request.size and all(c.dtype == np.float64 for c in trace.confidence.values()):
        from svt.simulate.replay_compiled import replay_points

        points = [p for B in concurrency for p in replay_points(trace, costs, B, engine_rule)]
    else:
        points = _replay_reference(trace, costs, concurrency, engine_rule)
    # the frontier of what can be deployed: the oracle is a bound, not a policy
    mark_pareto([p for p in points if p["policy"] != "oracle"])
    for p in points:
        if p["policy"] == "oracle":
            p["pareto"] = None
    return points


def _policy_makers(trace: StepTrace, costs: CostTable, engine_rule: bool) -> dict:
    """Each policy as ``make(trace, groups) -> per_step`` (a fresh one per run: AV+length learns
    as it goes), in the replay's order."""
    makers = {f"fixed K={k}": (lambda tr, g, k=k: _fixed(k, tr, costs)) for k in range(trace.k + 1)}
    makers.update({f"AV {name}": (lambda tr, g, name=name: _av(name, tr, costs)) for name in trace.confidence})
    if engine_rule:
        makers.update({f"AV {name} [engine rule]": (lambda tr, g, name=name: _av(name, tr, costs, "engine"))
                       for name in trace.confidence})
    means = {name: c.mean(0) for name, c in trace.confidence.items()}  # the whole trace's, on every schedule
    makers.update({f"AV+length {name}": (lambda tr, g, name=name: _av_length(name, tr, costs, means[name]))
                   for name in trace.confidence})
    makers["oracle"] = lambda tr, g: _oracle(g, tr, costs)
    return makers


def _replay_reference(trace: StepTrace, costs: CostTable, concurrency, engine_rule: bool) -> list[dict]:
    """Per concurrency and policy: the policy run on the trace's steps gives each row's tokens; those
    lay out the request-steps the policy itself runs (``steps.policy_trace``: as many steps per
    request as it needs for the request's tokens), and the policy is replayed on their batches."""
    points = []
    budget = request_tokens(trace)
    need = float(budget.sum())
    makers = _policy_makers(trace, costs, engine_rule)
    oracle = makers.pop("oracle")
    for B in concurrency:
        groups = step_groups(trace, B)
        for name, make in makers.items():
            own = policy_trace(trace, _row_tokens(groups, trace, make(trace, groups)))
            tr, g = (trace, groups) if own is None else (own, step_groups(own, B))
            points.append({"policy": name, "concurrency": B, **_accumulate(g, tr, make(tr, g), budget, need)})
        # on the trace's own steps: a bound on per-step choices at the trace's occupancy
        points.append({"policy": "oracle", "concurrency": B,
                       **_accumulate(groups, trace, oracle(trace, groups), None, need)})
    return points


# request-level resamples of the replay behind its intervals (`svt evaluate --replay-bootstrap N`;
# svt's CI uses 20): each is a whole replay, seconds on a CI-sized run, so they are opt-in
REPLAY_BOOTSTRAP = 20


def resample_requests(trace: StepTrace, rng: np.random.Generator) -> StepTrace:
    """A bootstrap draw of the trace: as many requests as it has, drawn with replacement (whole
    requests, every step), renumbered in the order drawn (which also re-forms the batches)."""
    order = np.argsort(trace.request, kind="stable")
    reqs, starts, counts = np.unique(trace.request[order], return_index=True, return_counts=True)
    pick = rng.integers(0, reqs.size, reqs.size)
    rows = np.concatenate([order[starts[i]:starts[i] + counts[i]] for i in pick]) if reqs.size else order
    new_req = np.repeat(np.arange(pick.size), counts[pick])
    budget = None if trace.budget is None else np.asarray(trace.budget)[reqs[pick]]
    return StepTrace(new_req, trace.step[rows], trace.a[rows], trace.k,
                     {name: c[rows] for name, c in trace.confidence.items()}, trace.schedule, trace.verification,
                     budget)


def replay_intervals(trace: StepTrace, costs: CostTable, points: list[dict], *, n: int = REPLAY_BOOTSTRAP,
                     seed: int = 0, engine_rule: bool = False) -> None:
    """Add ``ci95`` (throughput and interactivity) to each replay point: its value ± 1.96 standard
    deviations of the same point over ``n`` request-level bootstrap replays. Requests are the
    independent units of a trace (two draws of one experiment differ by which requests came and
    how they ran), so this is the spread an independent draw of the experiment shows."""
    if n < 2:
        return
    rng = np.random.default_rng(seed)
    concurrency = tuple(sorted({int(p["concurrency"]) for p in points}))
    draws: dict[tuple, list[float]] = {}
    for _ in range(n):
        for q in replay(resample_requests(trace, rng), costs, concurrency=concurrency, engine_rule=engine_rule):
            for m in ("throughput", "interactivity"):
                draws.setdefault((q["policy"], q["concurrency"], m), []).append(q[m])
    for p in points:
        ci = {}
        for m in ("throughput", "interactivity"):
            v = draws.get((p["policy"], p["concurrency"], m))
            if v is not None and len(v) >= 2:
                half = 1.96 * float(np.std(v, ddof=1))
                if half > 1e-9 * abs(p[m]):  # a point no draw moves (fixed K=0 at B=1): its tolerance applies
                    ci[m] = [max(0.0, p[m] - half), p[m] + half]
        p["ci95"] = ci


def _vs_best_fixed(points: list[dict]) -> dict[tuple, float]:
    """Each point's throughput over the best fixed draft length's at the same concurrency."""
    best: dict[int, float] = {}
    for p in points:
        if p["policy"].startswith("fixed K="):
            best[p["concurrency"]] = max(best.get(p["concurrency"], 0.0), p["throughput"])
    return {(p["policy"], p["concurrency"]): p["throughput"] / best[p["concurrency"]] if best.get(p["concurrency"])
            else float("nan") for p in points}


#: a decision holds when in at least this share of the cost model's refits the replay's winner is
#: within ``DECISION_REGRET`` of that refit's best (two policies within the noise of each other are
#: not a doubt: either choice costs nothing)
DECISION_AGREE = 0.95
DECISION_REGRET = 0.02


def winners(points: list[dict]) -> dict[int, str]:
    """The policy a user would pick at each concurrency: the highest throughput among the policies
    an engine can run (the oracle knows the future and is left out)."""
    best: dict[int, tuple[str, float]] = {}
    for p in points:
        c = int(p["concurrency"])
        if p["policy"] != "oracle" and (c not in best or p["throughput"] > best[c][1]):
            best[c] = (p["policy"], float(p["throughput"]))
    return {c: w for c, (w, _) in best.items()}


def _regret(points: list[dict], c: int, policy: str) -> float:
    """How much throughput ``policy`` gives up at concurrency ``c`` against the best there."""
    thr = {p["policy"]: float(p["throughput"]) for p in points if int(p["concurrency"]) == c and p["policy"] != "oracle"}
    best = max(thr.values())
    return (best - thr.get(policy, 0.0)) / best if best > 0 else 0.0


def _policy_k(policy: str, k: int) -> int | None:
    """A fixed policy's draft length (None for AV policies, which may verify any of 0..K)."""
    return int(policy.removeprefix("fixed K=")) if policy.startswith("fixed K=") else None


def decision_cells(costs: CostTable, batch: int, policies: list[str], k: int) -> list[dict]:
    """The cost cells at ``batch`` on which ``policies`` differ (a fixed K's draft of K and its
    verify of K + 1 tokens a row; an AV policy's draft of K and its verify of 1..K + 1), widest 95 %
    interval first (``measurement.fit.interval95``, relative to the fitted value; None when the
    table keeps no intervals)."""
    ivl = ((costs.measurement or {}).get("fit") or {}).get("interval95") or {}
    ks = {_policy_k(p, k) for p in policies}
    draft = sorted({x for x in ks if x} | ({k} if None in ks else set()))
    verify = sorted({x + 1 for x in ks if x is not None} | (set(range(1, k + 2)) if None in ks else set()))

    def width(kind: str, j: int) -> float | None:
        row = ivl.get(kind, {}).get(batch, ivl.get(kind, {}).get(str(batch), {}))
        cell = row.get(j, row.get(str(j)))
        if not cell:
            return None
        fitted = costs.draft_ms.get(batch, {}).get(j) if kind == "draft" else costs.verify(j * batch, rows=batch)
        return float(max(cell[1] - fitted, fitted - cell[0]) / fitted) if fitted else None

    cells = [{"cell": f"draft_ms[{batch}][{j}]", "interval95": width("draft", j)} for j in draft]
    cells += [{"cell": f"verify {batch} rows x {m} tokens", "interval95": width("verify", m)} for m in verify]
    return sorted(cells, key=lambda c: -(c["interval95"] or 0.0))


def decision_audit(points: list[dict], refit_points: list[list[dict]], costs: CostTable, k: int) -> list[dict]:
    """Per concurrency: the replay's winner; how many of the cost model's refits pick it
    (``agree``) and which others they pick; in how many it stays within ``DECISION_REGRET`` of the
    refit's best (``within``); and ``in_doubt`` when that is fewer than ``DECISION_AGREE`` of them,
    with the cells the rivals differ on, widest interval first."""
    out = []
    picks = [winners(r) for r in refit_points]
    for c, w in sorted(winners(points).items()):
        votes: dict[str, int] = {}
        for pk in picks:
            votes[pk.get(c, "")] = votes.get(pk.get(c, ""), 0) + 1
        agree = votes.pop(w, 0)
        regrets = [_regret(r, c, w) for r in refit_points]
        within = sum(x <= DECISION_REGRET for x in regrets)
        d = {"concurrency": c, "winner": w, "refits": len(picks), "agree": agree,
             "others": dict(sorted(votes.items(), key=lambda kv: -kv[1])), "within": within,
             "worst_regret": max(regrets, default=0.0),
             "in_doubt": bool(picks) and within < DECISION_AGREE * len(picks)}
        if d["in_doubt"]:
            d["cells"] = decision_cells(costs, c, [w, *d["others"]], k)
        out.append(d)
    return out


def cost_intervals(trace: StepTrace, costs: CostTable, points: list[dict], *, engine_rule: bool = False,
                   decisions: list | None = None) -> int:
    """Add ``cost_ci95`` to each replay point: the 2.5 and 97.5 percentiles of its throughput, its
    interactivity and its throughput over the best fixed draft length at the same concurrency
    (``vs_best_fixed``), over replays on the cost model's bootstrap refits
    (``CostTable.replicates``). The ratio is paired (one refit prices both policies), so it says
    whether a gain survives the uncertainty of the costs. With ``decisions`` (a list), the winner
    audit of each concurrency is appended to it (:func:`decision_audit`). Returns how many refits
    were replayed (0: the table keeps none, nothing added)."""
    reps = costs.replicates()
    if len(reps) < 2:
        return 0
    concurrency = tuple(sorted({int(p["concurrency"]) for p in points}))
    draws: dict[tuple, list[float]] = {}
    refit_points = []
    for rep in reps:
        got = replay(trace, rep, concurrency=concurrency, engine_rule=engine_rule)
        refit_points.append(got)
        ratio = _vs_best_fixed(got)
        for q in got:
            key = (q["policy"], q["concurrency"])
            for m, v in (("throughput", q["throughput"]), ("interactivity", q["interactivity"]),
                         ("vs_best_fixed", ratio[key])):
                draws.setdefault((*key, m), []).append(v)
    for p in points:
        ci = {}
        for m in ("throughput", "interactivity", "vs_best_fixed"):
            v = draws.get((p["policy"], p["concurrency"], m))
            if v is not None and np.isfinite(v).all():
                ci[m] = [float(np.percentile(v, 2.5)), float(np.percentile(v, 97.5))]
        if ci:
            p["cost_ci95"] = ci
    if decisions is not None:
        decisions += decision_audit(points, refit_points, costs, trace.k)
    return len(reps)


def mark_pareto(points: list[dict]) -> None:
    """``pareto`` = no other point has both higher-or-equal interactivity and throughput (one strictly)."""
    inter = np.array([p["interactivity"] for p in points])
    thr = np.array([p["throughput"] for p in points])
    for i, p in enumerate(points):
        dominated = ((inter >= inter[i]) & (thr >= thr[i]) & ((inter > inter[i]) | (thr > thr[i]))).any()
        p["pareto"] = not bool(dominated)


def non_convexity(costs: CostTable, n: int, k: int) -> float:
    """How far the verify-cost curve over a step's token range [n, n (k + 1)] lies above its
    greatest convex minorant: the largest gap, relative to the cost there (0 for a convex curve)."""
    v = verify_curve(costs, n, n * k, False)
    return float(np.max((v - verify_curve(costs, n, n * k, True)) / v))


def flip_rate(trace: StepTrace, name: str, costs: CostTable, B: int, *, rule: str = "engine",
              max_steps: int = 200, seed: int = 0, compiled: bool = True) -> dict:
    """How often a rule's decision to verify a draft changes when only the same request's later
    confidences change (replaced by 0.01 and by 0.99): each change is a decision that depends on
    the request's own continuation, i.e. on the drafted token. Measured on up to ``max_steps``
    engine steps at concurrency B. ``compiled``: each step's variants in one compiled call (the
    same decisions as this loop over ``av_keep``, ``compiled=False``)."""
    if rule not in RULES:
        raise ValueError(f"Expected `rule` in {RULES}, but got {rule!r}.")
    trace = dense_steps(trace)  # batched as the replay batches it
    conf = trace.confidence[name]
    groups = step_groups(trace, B)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(groups), size=min(max_steps, len(groups)), replace=False) if groups else []
    if compiled and conf.dtype == np.float64 and len(picks):
        from svt.simulate.replay_compiled import flip_counts

        decisions, flips = flip_counts(conf, [groups[g] for g in picks], costs, trace.k, rule == "convex")
        return {"decisions": decisions, "flips": flips, "rate": flips / decisions if decisions else float("nan")}
    decisions = flips = 0
    for g in picks:
        c = conf[groups[g]]
        base = av_keep(c, costs, rule)
        n, K = c.shape
        for r in range(n):
            for i in range(K - 1):
                decisions += 1
                kept_i = base[r] > i
                for v in (0.01, 0.99):
                    alt = c.copy()
                    alt[r, i + 1:] = v
                    if (av_keep(alt, costs, rule)[r] > i) != kept_i:
                        flips += 1
                        break
    return {"decisions": decisions, "flips": flips, "rate": flips / decisions if decisions else float("nan")}
