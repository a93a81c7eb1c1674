"""Live Hybrid Verified Decoding (greedy, one request at a time): at each cycle the cache proposes
a draft, the yield fit predicts its accepted length from the row's features, and the target
verifies the cache draft when the prediction exceeds τ, else the model drafter's K drafts.

The cache is fed exactly as ``svt cache`` replays a batch-1 greedy run: a proposal (and its feature
row) at every decode position, the request's tokens joining its own tree as they are emitted, and
its response entering the global tree when it finishes. So, because greedy decoding is
deterministic, the cycles of a live run equal the HVD replay of the same fit and τ on a batch-1
greedy run of the same requests (checked by the tests and by ``svt evaluate`` on the live run).

Each model keeps one ``DynamicCache`` (batch 1), cropped to the kept prefix after verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from svt.collect.cache import CacheDrafter, RequestFeatures
from svt.collect.kv_cache import cache_kwarg
from svt.collect.sampling import draft_features, process_probs
from svt.config import CacheOptions


@dataclass
class HVDLog:
    output: list[int] = field(default_factory=list)
    finish: str = "length"
    cycles: list[dict] = field(default_factory=list)  # one per verification
    rows: list[dict] = field(default_factory=list)  # cache rows, one per decode position
    drafts: list[dict] = field(default_factory=list)  # the model drafter's drafts in model cycles


class _Model:
    """A causal LM with a batch-1 KV cache holding ``length`` tokens of the sequence."""

    def __init__(self, model):
        from svt.collect.kv_cache import growing_cache

        self.model, self.cache, self.length = model, growing_cache(model.config), 0
        self.device = next(model.parameters()).device

    def feed(self, tokens: list[int]) -> torch.Tensor:
        """Append ``tokens``; return their logits ``[len, V]``."""
        ids = torch.tensor([tokens], dtype=torch.long, device=self.device)
        pos = torch.arange(self.length, self.length + len(tokens), device=self.device)[None]
        mask = torch.ones((1, self.length + len(tokens)), dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **{cache_kwarg(self.model): self.cache})
        self.length += len(tokens)
        return out.logits[0].float()

    def crop(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative count drops that many slots
            self.length = length


@torch.inference_mode()
def decode_hvd(target, draft, prompt: list[int], *, request: int, k: int, max_new_tokens: int,
               eos_id: int | None, drafter: CacheDrafter, options: CacheOptions, classes: np.ndarray,
               predict_yield, tau: float) -> HVDLog:
    """Decode one request greedily with the HVD switch. ``predict_yield(row) -> float`` scores a
    cache row (a dict of the ``cache_drafts`` columns)."""
    log = HVDLog()
    tm, dm = _Model(target), _Model(draft)
    ctx = list(prompt)
    feats = RequestFeatures(options, classes, len(prompt))
    drafter.start(request, np.asarray(prompt))
    out_np = np.zeros(0, dtype=np.int64)
    done = False

    def propose_row(t: int) -> dict:
        context = np.asarray(ctx, dtype=np.int64)
        ids, probs, score, match_len, glob, ms = drafter.propose(request, context)
        row = feats.row(t, out_np[:t], context, ids, probs, score, match_len, glob)
        row.update(request=request, decode_pos=t, draft_ids=ids.tolist(), lookup_ms=ms)
        log.rows.append(row)
        return row

    step = 0
    while not done:
        t = len(log.output)
        row = propose_row(t)
        yhat = float(predict_yield(row))
        use_cache = yhat > tau
        n_ctx = len(ctx)
        t0 = time.perf_counter()
        if use_cache:
            x = list(row["draft_ids"])
            source = "cache"
        else:  # the model drafter: K greedy drafts from its own cache, caught up with ctx first
            logits = dm.feed(ctx[dm.length:])[-1:]
            x, qs = [], []
            for i in range(k):
                q = process_probs(logits[-1], 0.0, 1.0)
                x.append(int(q.argmax()))
                qs.append(q)
                if i < k - 1:
                    logits = dm.feed([x[-1]])
            source = "model"
        t1 = time.perf_counter()
        tl = tm.feed(ctx[tm.length:] + x)[-(len(x) + 1):]  # logits at ctx[-1], x_0 .. x_{n-1}
        g = tl.argmax(-1).tolist()
        t2 = time.perf_counter()
        a = 0
        while a < len(x) and x[a] == g[a]:
            a += 1
        new = x[:a] + [g[a]]
        if source == "model":
            log.drafts += _model_rows(request, step, x, g, qs, tl[:k], a)
        tm.crop(n_ctx + a)
        dm.crop(min(dm.length, n_ctx + a))
        room = max_new_tokens - t
        new = new[:room]
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
            log.finish, done = "stop", True
        log.cycles.append({"request": request, "step": step, "source": source, "drafted": len(x),
                           "accepted": a, "emitted": len(new), "predicted_yield": yhat,
                           "draft_ms": (t1 - t0) * 1e3 + row["lookup_ms"], "verify_ms": (t2 - t1) * 1e3})
        for j, tok in enumerate(new):  # every position gets its proposal, as in `svt cache`
            if j > 0:
                propose_row(t + j)
            log.output.append(int(tok))
            ctx.append(int(tok))
            out_np = np.asarray(log.output, dtype=np.int64)
            drafter.extend(request, [int(tok)])
        step += 1
        if len(log.output) >= max_new_tokens:
            done = True
    drafter.finish(request, np.asarray(log.output))
    return log


def yield_scorer(fit):
    """``row -> predicted yield`` from a yield fit (a fitter; one-row frames through it)."""
    if fit.target != "yield":
        from svt.errors import ConfigError

        raise ConfigError(f"`hvd.fit` must be a yield fit (yield-mlp, yield-linear, yield-gbm), not {fit.name!r}.")

    def score(row: dict) -> float:
        frame = pl.DataFrame([{k: v for k, v in row.items() if k != "draft_ids"}])
        return float(fit.predict(frame)[0])

    return score


def _model_rows(request: int, step: int, x: list[int], g: list[int], qs: list, target_logits, a: int) -> list[dict]:
    """The drafts rows of a model cycle: labelled up to and including the first rejection, the soft
    labels the 0/1 argmax agreement of greedy verification (as the chain engine logs them; min(1, p/q)
    of unscaled softmaxes is no acceptance probability here)."""
    k = len(x)
    p = process_probs(target_logits, 0.0, 1.0)
    f = draft_features(torch.stack(qs)[None], p[None], torch.tensor([x], device=p.device))
    agree = torch.tensor([[float(x[i] == g[i]) for i in range(k)]], device=p.device)
    f["accept_prob"], f["accept_prob_expected"] = agree, agree
    return [{"request": request, "step": step, "position": i, "token": x[i], "label": int(i < a),
             **{n: float(v[0, i]) for n, v in f.items()}} for i in range(min(k, a + 1))]
