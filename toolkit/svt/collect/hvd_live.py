"""Live Hybrid Verified Decoding (greedy) in a static batch: at each engine step every row's cache
proposes a draft, the yield fit predicts its accepted length from the row's features, and the row
verifies the cache draft when the prediction exceeds τ, else the model drafter's K drafts. Rows
switch on their own; one target forward verifies every row's draft (padded to the longest).

The cache is fed exactly as ``svt cache`` replays a greedy run of the same batches
(:func:`svt.collect.cache_run.cache_rows_for_batch`): a proposal (and its feature row) at every
decode position, each request's tokens joining its own tree as they are emitted, and a response
entering the global tree after the step its request finished (finished requests in request order),
so a position decided at step s sees exactly the responses that finished before s. Because greedy
decoding is deterministic, the cycles of a live run equal the HVD replay of its own cache rows, and
those rows equal ``svt cache`` recomputed on the live run (checked by the tests).

The drafter runs over the whole batch when any row needs it (its drafts for cache rows are dropped,
as a serving engine's drafter runs over its batch), and not at all at a step where every row takes
the cache. It keeps up with the tokens the cache rows verified:

- a draft model is fed, before the pending token, the row's *backlog*: the tokens it has not seen
  (the accepted cache drafts; x_{K-1} after a model draft accepted whole);
- a hidden-state head's catch-up slots (``svt.collect.head_draft``) come from the target's taps at
  every verified position, whoever drafted it; a step without the head appends its slots to those
  still waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from svt.collect.cache import CacheDrafter, RequestFeatures
from svt.collect.sampling import draft_features, process_probs
from svt.config import CacheOptions


@dataclass
class HVDLog:
    output: list[int] = field(default_factory=list)
    finish: str = "length"
    cycles: list[dict] = field(default_factory=list)  # one per verification
    rows: list[dict] = field(default_factory=list)  # cache rows, one per decode position
    drafts: list[dict] = field(default_factory=list)  # the model drafter's drafts in model cycles


def concat_catch_up(a, b):
    """A head's catch-up slots ``a`` (not yet fed) followed by ``b``'s: every row's last slot stays
    its last (masked slots in between are neither fed nor kept)."""
    from svt.collect.head_draft import CatchUp

    return CatchUp(torch.cat([a.ids, b.ids], 1), torch.cat([a.feat, b.feat], 1), torch.cat([a.fed, b.fed], 1),
                   torch.cat([a.kept, b.kept], 1))


def _draft_model_k(rows, back: list[list[int]], k: int, pad_id: int):
    """K greedy drafts of a draft model for every row: fed each row's backlog and pending token
    (right-aligned), then one token at a time. Returns q [nb, K, V] and x [nb, K]."""
    nb, device = len(back), rows.pending.device
    S = max((len(b) for b in back), default=0)
    ids = torch.full((nb, S + 1), pad_id, dtype=torch.long)
    mask = torch.zeros((nb, S + 1), dtype=torch.long)
    for j, b in enumerate(back):
        if b:
            ids[j, S - len(b) : S] = torch.tensor(b)
            mask[j, S - len(b) : S] = 1
    ids, mask = ids.to(device), mask.to(device)
    ids[:, S] = rows.pending
    mask[:, S] = 1
    o = rows.dc.forward(ids, mask)
    ones1 = torch.ones((nb, 1), dtype=torch.long, device=device)
    qs, xs = [], []
    for i in range(k):
        q = process_probs(o.logits[:, -1], 0.0, 1.0)
        qs.append(q)
        xs.append(q.argmax(-1))
        if i < k - 1:
            o = rows.dc.forward(xs[-1][:, None], ones1)
    return torch.stack(qs, 1), torch.stack(xs, 1)


@torch.inference_mode()
def decode_hvd(target, draft, prompts: list[list[int]], *, requests: list[int], k: int, max_new_tokens: int,
               eos_id: int | None, pad_id: int, drafter: CacheDrafter, options: CacheOptions,
               classes: np.ndarray, predict_yield, tau: float) -> tuple[list[HVDLog], list[dict]]:
    """Decode a static batch greedily with the HVD switch: one log per prompt, and one ``schedule``
    row per engine step (:data:`svt.traces.schema` SCHEDULE; ``step_ms`` is the whole step: the
    cache's proposals and the yield fit's scores, the drafter, the verify, the emission and the
    bookkeeping). ``predict_yield(row) -> float`` scores a cache row (a dict of the ``cache_drafts``
    columns).

    Long because one engine step's timed phases (proposals, draft, verify, emission) and the order
    in which the cache's trees are fed, which the replay must reproduce, read best in one place."""
    from svt.collect.engine import prefill_rows, sync_device
    from svt.collect.head_draft import is_head

    device = next(target.parameters()).device
    head = is_head(draft)
    n = len(prompts)
    logs = [HVDLog() for _ in range(n)]
    ctx = [list(p) for p in prompts]
    feats = [RequestFeatures(options, classes, len(p)) for p in prompts]
    for r, p in zip(requests, prompts, strict=True):
        drafter.start(r, np.asarray(p))
    sync_device(device)
    t_in = time.perf_counter()
    rows = prefill_rows(target, draft, prompts, pad_id, device)
    sync_device(device)
    prefill_ms = (time.perf_counter() - t_in) * 1e3
    schedule: list[dict] = []
    back: list[list[int]] = [[] for _ in range(n)]  # a draft model's unseen tokens before the pending one
    active = list(range(n))

    def propose_row(i: int, t: int) -> dict:
        context = np.asarray(ctx[i], dtype=np.int64)
        ids, probs, score, match_len, glob, ms = drafter.propose(requests[i], context)
        out_np = np.asarray(logs[i].output[:t], dtype=np.int64)
        row = feats[i].row(t, out_np, context, ids, probs, score, match_len, glob)
        row.update(request=requests[i], decode_pos=t, draft_ids=ids.tolist(), lookup_ms=ms)
        logs[i].rows.append(row)
        return row

    step = 0
    while active:
        nb = len(active)
        before = sum(len(logs[i].output) for i in active)
        sync_device(device)
        t0 = time.perf_counter()
        props = [propose_row(i, len(logs[i].output)) for i in active]
        yhat = [float(predict_yield(row)) for row in props]
        use_cache = [y > tau for y in yhat]
        drafted = not all(use_cache)
        if drafted:  # the model drafter, over the whole batch
            q, xm_np = _model_drafts(draft, rows, [back[i] for i in active], k, pad_id)
        lens = [len(props[j]["draft_ids"]) if use_cache[j] else k for j in range(nb)]
        L = max(lens)
        x_np = np.full((nb, L), pad_id, dtype=np.int64)
        for j in range(nb):
            x_np[j, : lens[j]] = props[j]["draft_ids"] if use_cache[j] else xm_np[j]
        x = torch.from_numpy(x_np).to(device)
        lens_t = torch.tensor(lens, device=device)
        sync_device(device)
        t1 = time.perf_counter()
        ar = torch.arange(L + 1, device=device)[None, :]
        to = rows.tc.forward(torch.cat([rows.pending[:, None], x], 1), (ar <= lens_t[:, None]).long(), hidden=head)
        g = process_probs(to.logits, 0.0, 1.0).argmax(-1)  # [nb, L + 1]: the target's greedy tokens
        agree = (x == g[:, :L]) & (ar[:, :L] < lens_t[:, None])
        acc = agree.long().cumprod(1).sum(1)
        next_token = g.gather(1, acc[:, None])[:, 0]
        sync_device(device)
        t2 = time.perf_counter()
        rows.tc.restrict_last(ar < (acc + 1)[:, None])
        acc_np, g_np = acc.cpu().numpy(), g.cpu().numpy()
        _keep_up(draft, rows, back, active, to, x_np, acc, next_token, use_cache, drafted, k)
        rows.pending = next_token
        done = np.zeros(nb, dtype=bool)
        for j, i in enumerate(active):
            a = int(acc_np[j])
            if drafted and not use_cache[j]:
                logs[i].drafts += _model_rows(requests[i], step, xm_np[j].tolist(), g_np[j].tolist(), q[j],
                                              to.logits[j, :k], a)
            logs[i].cycles.append({"request": requests[i], "step": step, "batch_size": nb,
                                   "source": "cache" if use_cache[j] else "model", "drafted": lens[j],
                                   "accepted": a, "predicted_yield": yhat[j], "draft_ms": (t1 - t0) * 1e3,
                                   "verify_ms": (t2 - t1) * 1e3})
            done[j] = _emit(logs[i], x_np[j, :a].tolist() + [int(g_np[j, a])], max_new_tokens, eos_id,
                            lambda m, i=i: propose_row(i, m), ctx[i], drafter, requests[i])
        for j in sorted(np.flatnonzero(done), key=lambda j: requests[active[j]]):  # into the global tree
            drafter.finish(requests[active[j]], np.asarray(logs[active[j]].output))
        rows.end_step(done, device, True)
        sync_device(device)
        t3 = time.perf_counter()
        schedule.append({"tick": step, "batch_size": nb, "admitted": n if step == 0 else 0,
                         "prefill_ms": prefill_ms if step == 0 else 0.0, "draft_ms": (t1 - t0) * 1e3,
                         "verify_ms": (t2 - t1) * 1e3, "step_ms": (t3 - t0) * 1e3,
                         "draft_passes": k if drafted else 0, "verify_tokens": nb * (L + 1),
                         "emitted": sum(len(logs[i].output) for i in active) - before})
        active = [i for j, i in enumerate(active) if not done[j]]
        step += 1
    return logs, schedule


def _model_drafts(draft, rows, back: list[list[int]], k: int, pad_id: int):
    """The model drafter's K greedy drafts for every row: q [nb, K, V] and the drafts (numpy)."""
    from svt.collect.block_draft import draft_with_block, is_block
    from svt.collect.head_draft import draft_with_head, is_head

    if not is_head(draft):
        q, xm = _draft_model_k(rows, back, k, pad_id)
        return q, xm.cpu().numpy()

    def sample(logits):
        q = process_probs(logits, 0.0, 1.0)
        return q, q.argmax(-1)

    if is_block(draft):
        q, xm, _, _ = draft_with_block(rows.dc, rows.catch, rows.pending, k, sample, False)
    else:
        q, xm, _ = draft_with_head(rows.dc, rows.catch, k, sample, False)
    return q, xm.cpu().numpy()


def _keep_up(draft, rows, back: list[list[int]], active: list[int], to, x_np: np.ndarray, acc: torch.Tensor,
             next_token: torch.Tensor, use_cache: list[bool], drafted: bool, k: int) -> None:
    """After a verify, the drafter keeps up with every row's verified tokens, whoever drafted them: a
    head's next catch-up slots (appended to those still waiting when it did not run); a draft
    model's kept slots and each row's backlog (see the module)."""
    from svt.collect.head_draft import is_head, step_catch_up, taps_of

    device = acc.device
    if is_head(draft):
        new = step_catch_up(draft, taps_of(to, draft.cfg.aux_layer_ids), torch.from_numpy(x_np).to(device), acc,
                            next_token)
        rows.catch = new if drafted else concat_catch_up(rows.catch, new)
        return
    if drafted and k > 1:  # of the drafter's own slots x_0..x_{K-2}, a model row keeps the accepted
        model = torch.tensor([not c for c in use_cache], device=device)
        kr = torch.arange(k - 1, device=device)[None, :]
        rows.dc.restrict_last(model[:, None] & (kr < acc[:, None]))
    acc_np, pending = acc.cpu().numpy(), rows.pending.tolist()
    for j, i in enumerate(active):
        a = int(acc_np[j])
        if not drafted:
            back[i] = back[i] + [int(pending[j])] + x_np[j, :a].tolist()
        elif use_cache[j]:
            back[i] = x_np[j, :a].tolist()
        else:
            back[i] = [int(x_np[j, k - 1])] if a == k else []


def _emit(log: HVDLog, toks: list[int], max_new_tokens: int, eos_id, propose, ctx: list[int], drafter,
          request: int) -> bool:
    """Append a row's verified tokens (cut at ``max_new_tokens`` and after ``eos_id``), each new
    position after the first given its cache proposal as `svt cache` gives it; completes the row's
    last cycle with the tokens emitted; returns whether the row finished."""
    t = len(log.output)
    toks = toks[: max_new_tokens - t]
    done = False
    if eos_id is not None and eos_id in toks:
        toks = toks[: toks.index(eos_id) + 1]
        log.finish, done = "stop", True
    log.cycles[-1]["emitted"] = len(toks)
    for m, tok in enumerate(toks):
        if m > 0:
            propose(t + m)
        log.output.append(int(tok))
        ctx.append(int(tok))
        drafter.extend(request, [int(tok)])
    return done or len(log.output) >= max_new_tokens


def yield_scorer(fit):
    """``row -> predicted yield`` from a yield fit (a fitter; one-row frames through it)."""
    if fit.target != "yield":
        from svt.errors import ConfigError

        raise ConfigError(f"`hvd.fit` must be a yield fit (yield-mlp, yield-linear, yield-gbm), not {fit.name!r}.")

    def score(row: dict) -> float:
        frame = pl.DataFrame([{k: v for k, v in row.items() if k != "draft_ids"}])
        return float(fit.predict(frame)[0])

    return score


def _model_rows(request: int, step: int, x: list[int], g: list[int], q: torch.Tensor, target_logits, a: int) -> list[dict]:
    """The drafts rows of a model cycle (``q`` [K, V]): labelled up to and including the first
    rejection, the soft labels the 0/1 argmax agreement of greedy verification (as the chain engine
    logs them; min(1, p/q) of unscaled softmaxes is no acceptance probability here)."""
    k = len(x)
    p = process_probs(target_logits, 0.0, 1.0)
    f = draft_features(q[None], p[None], torch.tensor([x], device=p.device))
    agree = torch.tensor([[float(x[i] == g[i]) for i in range(k)]], device=p.device)
    f["accept_prob"], f["accept_prob_expected"] = agree, agree
    return [{"request": request, "step": step, "position": i, "token": x[i], "label": int(i < a),
             **{n: float(v[0, i]) for n, v in f.items()}} for i in range(min(k, a + 1))]
