"""The batched speculative-sampling engine: one target and one draft KV cache for a batch of rows.

Cache layout (measured exact against unbatched forwards; tested against fresh forwards): each model keeps one
``DynamicCache`` for the batch; every forward appends the same number of slots to every row;
slots a row does not keep (rejected drafts, padding) stay as *holes* masked out forever by a
cumulative 2D attention mask; ``position_ids`` are each row's count of live tokens, so RoPE positions
stay contiguous per row.

Per step, for rows with pending token y (emitted last step, not yet in either cache):

- draft: feed ``[a, y]`` where ``a`` is x_{K-1} of the previous step if all K drafts were accepted
  (the draft never saw it), else a masked hole; then sample x_0 from the last logits and feed x_0,
  ..., x_{K-2} one at a time (K forwards in all); q_0..q_{K-1} are the processed distributions;
- target: feed ``[y, x_0, ..., x_{K-1}]`` (K + 1 tokens) in one forward, giving p_0..p_K;
- verify: accept the leading run, resample or take the bonus token -> new pending token; keep
  ``accepted + 1`` of the target's new slots and ``accepted`` (+ the hole logic) of the draft's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from svt.collect.sampling import draft_features, draft_token, process_probs, trim, verify


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    k: int = 5
    max_new_tokens: int = 128

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class LiveAV:
    """Live Adaptive Verification: ``confidence(q_features, position) -> [nb, K]`` (numpy; from a
    lossless predictor), the cost table, and the share of steps that verify every draft anyway
    (exploration: uncensored labels for later evaluation)."""

    confidence: object
    costs: object
    explore: float = 0.0
    # an online estimator learning while collecting: observe(labels [nb, K], -1 = none) after each
    # step; warming_up() -> True while every draft must be verified (uncensored warm-up refits)
    observe: object = None
    warming_up: object = None
    rule: str = "convex"  # the budget rule: convex (lossless, default) or engine (the document's)


@dataclass
class LogOptions:
    hidden: bool = False
    dists_fraction: float = 0.0
    dists_top_k: int = 32


@dataclass
class BatchLog:
    """Everything one batch produced, as numpy columns ready for the trace tables."""

    drafts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    steps: dict[str, list[np.ndarray]] = field(default_factory=dict)
    hidden: list[np.ndarray] = field(default_factory=list)
    dists: dict[str, list] = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)

    def add(self, table: dict, **cols) -> None:
        for k, v in cols.items():
            table.setdefault(k, []).append(v)


class _Cache:
    """A model, its DynamicCache and the running 2D mask / live counts for a batch."""

    def __init__(self, model, batch: int, device):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)
        self.live = torch.zeros(batch, dtype=torch.long, device=device)

    def forward(self, ids: torch.Tensor, new_mask: torch.Tensor, hidden: bool = False):
        """Append ``ids`` ``[B, T]`` (``new_mask`` marks real slots); return logits [B, T, V]."""
        pos = self.live[:, None] + (new_mask.cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], 1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=pos,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=hidden,
        )
        self.live = self.live + new_mask.sum(1)
        return out

    def restrict_last(self, keep_mask: torch.Tensor) -> None:
        """Mask out, among the last ``keep_mask.shape[1]`` slots, those where ``keep_mask`` is 0."""
        n_new = keep_mask.shape[1]
        old = self.mask[:, -n_new:]
        kept = keep_mask.long() * old
        self.live = self.live - old.sum(1) + kept.sum(1)
        self.mask[:, -n_new:] = kept

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch (finished requests leave)."""
        self.cache.batch_select_indices(rows)
        self.mask = self.mask.index_select(0, rows)
        self.live = self.live.index_select(0, rows)


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def run_batch(
    target,
    draft,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    eos_id: int | None,
    pad_id: int,
    generator: torch.Generator,
    log: LogOptions | None = None,
    request_ids: list[int] | None = None,
    on_step=None,
    av: LiveAV | None = None,
) -> BatchLog:
    """Speculative sampling for a batch of prompts until every row has finished; log everything.

    ``prompts`` are token-id lists (non-empty). Rows finish at ``max_new_tokens`` or after emitting
    ``eos_id``; finished rows leave the batch. ``on_step(n_rows)`` is called after every step.
    """
    log = log or LogOptions()
    device = next(target.parameters()).device
    B, K, greedy = len(prompts), params.k, params.greedy
    request_ids = request_ids if request_ids is not None else list(range(B))
    out = BatchLog(outputs=[[] for _ in range(B)], finish=["length"] * B)

    # Prefill both models with prompt[:-1] (left-padded); prompt[-1] is each row's pending token.
    width = max(len(p) for p in prompts) - 1
    ids = torch.full((B, max(width, 1)), pad_id, dtype=torch.long)
    pmask = torch.zeros((B, max(width, 1)), dtype=torch.long)
    for b, p in enumerate(prompts):
        if len(p) > 1:
            ids[b, width - (len(p) - 1) :] = torch.tensor(p[:-1])
            pmask[b, width - (len(p) - 1) :] = 1
    ids, pmask = ids.to(device), pmask.to(device)
    tc, dc = _Cache(target, B, device), _Cache(draft, B, device)
    tc.forward(ids, pmask)
    dc.forward(ids, pmask)
    pending = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=device)
    unseen = torch.full((B,), pad_id, dtype=torch.long, device=device)  # x_{K-1} the draft missed
    has_unseen = torch.zeros(B, dtype=torch.long, device=device)
    active = torch.arange(B, device=device)  # original row index of each batch row
    n_out = torch.zeros(B, dtype=torch.long)
    step_no = 0
    ones1 = torch.ones((B, 1), dtype=torch.long, device=device)

    while active.numel():
        nb = active.numel()
        rows = active.cpu().numpy()
        # ---- draft K tokens -------------------------------------------------------------
        _sync(device)
        t0 = time.perf_counter()
        feed = torch.stack([unseen, pending], 1)
        fmask = torch.stack([has_unseen, torch.ones_like(has_unseen)], 1)
        o = dc.forward(feed, fmask, hidden=log.hidden)
        qs, toks, hid = [], [], []
        for i in range(K):
            logits = o.logits[:, -1]
            q = process_probs(logits, params.temperature, params.top_p)
            x = draft_token(q, greedy, generator)
            qs.append(q)
            toks.append(x)
            if log.hidden:
                hid.append(o.hidden_states[-1][:, -1])
            if i < K - 1:
                o = dc.forward(x[:, None], ones1[:nb], hidden=log.hidden)
        q = torch.stack(qs, 1)  # [nb, K, V]
        x = torch.stack(toks, 1)  # [nb, K]
        _sync(device)
        t1 = time.perf_counter()
        # ---- verify with one target forward ---------------------------------------------
        tfeed = torch.cat([pending[:, None], x], 1)
        to = tc.forward(tfeed, torch.ones((nb, K + 1), dtype=torch.long, device=device))
        p = process_probs(to.logits, params.temperature, params.top_p)  # [nb, K + 1, V]
        res = verify(p, q, x, greedy=greedy, generator=generator)
        acc, next_token = res.accepted, res.next_token
        kept = torch.full_like(acc, K)
        explored = True
        if av is not None:
            kept, explored = _live_av(av, q, nb, K, generator)
            acc, next_token = trim(p, acc, next_token, kept, greedy=greedy, generator=generator)
        _sync(device)
        t2 = time.perf_counter()
        # ---- caches: target keeps y + accepted drafts; draft keeps its fed accepted drafts --
        kr = torch.arange(K + 1, device=device)[None, :]
        tc.restrict_last(kr < (acc + 1)[:, None])
        # draft's slots this step: [a, y, x_0 .. x_{K-2}]; keep a (when real), y, x_0..x_{acc-1}
        dc.restrict_last((kr < 2) | (kr - 2 < acc[:, None]))
        all_acc = acc == K
        unseen = torch.where(all_acc, x[:, K - 1], torch.full_like(pending, pad_id))
        has_unseen = all_acc.long()
        pending = next_token

        # ---- log: two device-to-host transfers per step ---------------------------------
        feats = draft_features(q, p[:, :K], x)
        if greedy:  # acceptance is argmax agreement: the soft labels are the 0/1 outcome
            feats["accept_prob"] = res.label_ok.float()
            feats["accept_prob_expected"] = res.label_ok.float()
        ar = torch.arange(K, device=device)[None, :]
        verified = ar < kept[:, None]  # trimmed drafts carry no label (null)
        label = torch.where(ar < acc[:, None], 1, torch.where((ar == acc[:, None]) & verified, 0, -1))
        floats = torch.stack(list(feats.values())).float().cpu().numpy()  # [n_feats, nb, K]
        ints = torch.cat([x, pending[:, None], label, acc[:, None], kept[:, None]], 1).cpu().numpy()
        new_tok, label_np = ints[:, : K + 1], ints[:, K + 1 : 2 * K + 1]
        acc_np, kept_np = ints[:, -2], ints[:, -1]
        if av is not None and av.observe is not None:
            av.observe(label_np)
        emitted = np.zeros(nb, dtype=np.int64)
        done = np.zeros(nb, dtype=bool)
        for j, r in enumerate(rows):  # per row, not per token: append the accepted run + next
            toks_r = list(new_tok[j, : acc_np[j]]) + [int(new_tok[j, K])]
            room = params.max_new_tokens - int(n_out[r])
            toks_r = toks_r[:room]
            if eos_id is not None and eos_id in toks_r:
                toks_r = toks_r[: toks_r.index(eos_id) + 1]
                out.finish[r] = "stop"
                done[j] = True
            out.outputs[r].extend(int(t) for t in toks_r)
            n_out[r] += len(toks_r)
            emitted[j] = len(toks_r)
            if n_out[r] >= params.max_new_tokens:
                done[j] = True
        req = np.asarray([request_ids[r] for r in rows], dtype=np.int64)
        out.add(
            out.drafts,
            request=np.repeat(req, K),
            step=np.full(nb * K, step_no, dtype=np.int32),
            position=np.tile(np.arange(K, dtype=np.int16), nb),
            token=new_tok[:, :K].reshape(-1),
            label=label_np.reshape(-1),
            **{k: floats[i].reshape(-1) for i, k in enumerate(feats)},
        )
        out.add(
            out.steps,
            request=req,
            step=np.full(nb, step_no, dtype=np.int32),
            drafted=np.full(nb, K, dtype=np.int16),
            accepted=acc_np.astype(np.int16),
            emitted=emitted.astype(np.int16),
            draft_ms=np.full(nb, (t1 - t0) * 1e3, dtype=np.float32),
            verify_ms=np.full(nb, (t2 - t1) * 1e3, dtype=np.float32),
            batch_size=np.full(nb, nb, dtype=np.int16),
            kept=kept_np.astype(np.int16),
            explored=np.full(nb, explored, dtype=bool),
        )
        if log.hidden:
            out.hidden.append(torch.stack(hid, 1).to(torch.float16).cpu().numpy().reshape(nb * K, -1))
        if log.dists_fraction > 0:
            _log_dists(out, q, p[:, :K], x, req, step_no, log, generator)
        step_no += 1
        if on_step is not None:
            on_step(nb)
        if done.any():
            keep = torch.from_numpy(np.flatnonzero(~done)).to(device)
            active = active.index_select(0, keep)
            pending, unseen, has_unseen = pending[keep], unseen[keep], has_unseen[keep]
            tc.select(keep)
            dc.select(keep)
    return out


def _live_av(av: LiveAV, q: torch.Tensor, nb: int, K: int, generator) -> tuple[torch.Tensor, bool]:
    """Drafts kept per row by the AV budget rule (all of them on an exploration step)."""
    from svt.simulate.av import av_keep

    explore = av.explore > 0 and float(torch.rand((), generator=generator, device=q.device)) < av.explore
    top2 = q.topk(2, dim=-1).values
    feats = {"q_max": top2[..., 0], "q_margin": top2[..., 0] - top2[..., 1],
             "q_entropy": -(q * q.clamp_min(1e-12).log()).sum(-1)}
    feats = {k: v.float().cpu().numpy() for k, v in feats.items()}
    # always scored, so an online estimator sees the confidences in force at drafting time
    conf = np.asarray(av.confidence(feats, np.tile(np.arange(K), (nb, 1))), dtype=np.float64)
    if explore or (av.warming_up is not None and av.warming_up()):
        return torch.full((nb,), K, dtype=torch.long, device=q.device), True
    return torch.from_numpy(av_keep(conf, av.costs, av.rule)).to(q.device), False


def _log_dists(out: BatchLog, q, p, x, req, step_no, log: LogOptions, generator) -> None:
    """Top-k of q and p (plus tail mass) for a random fraction of this step's draft positions."""
    nb, K, V = q.shape
    pick = torch.rand((nb, K), generator=generator, device=q.device) < log.dists_fraction
    idx = pick.nonzero()
    if idx.numel() == 0:
        return
    k = min(log.dists_top_k, V)
    qs, ps = q[idx[:, 0], idx[:, 1]], p[idx[:, 0], idx[:, 1]]
    qv, qi = qs.topk(k, -1)
    pv, pi = ps.topk(k, -1)
    idx_np = idx.cpu().numpy()
    out.add(
        out.dists,
        request=req[idx_np[:, 0]],
        step=np.full(len(idx_np), step_no, dtype=np.int32),
        position=idx_np[:, 1].astype(np.int16),
        token=x[idx[:, 0], idx[:, 1]].cpu().numpy(),
        q_top_ids=qi.cpu().numpy(),
        q_top_probs=qv.cpu().numpy(),
        q_tail=(1 - qv.sum(-1)).clamp(0, 1).cpu().numpy(),
        p_top_ids=pi.cpu().numpy(),
        p_top_probs=pv.cpu().numpy(),
        p_tail=(1 - pv.sum(-1)).clamp(0, 1).cpu().numpy(),
    )
