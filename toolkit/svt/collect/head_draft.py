"""Drafting with a hidden-state head (EAGLE-3, MTP) inside svt's batched engine.

The head keeps its own KV cache (``engine._Cache`` over a one-layer ``growing_cache``: holes, a 2D
mask and live counts exactly as for a draft model). Its slot ``i`` pairs the target's fused feature
of token ``t_i`` with the embedding of ``t_{i+1}``; the slots a row keeps are the verified prefix's,
computed from the target's own tapped hidden states, so they are always the features the head was
trained on. Per step, for rows whose pending token is ``y``:

- **catch-up + first draft**: the slots of the tokens the target verified last step (or, after the
  prefill, of the prompt) are fed in one forward, left-padded so each row's last slot pairs the
  feature of the token before ``y`` with ``y``; its logits give ``q_0``;
- **later drafts**: one slot a step, the layer's own pre-norm output as the feature and the token
  just drafted; these ``K - 1`` slots become holes after the verify;
- **after the verify**: the target's taps at ``[y, x_0, .., x_{K-1}]`` give the next catch-up: the
  ``accepted + 1`` slots ``(feature(y), x_0), .., (feature(x_{a-1}), next_token)``.

A prompt of one token has no feature before ``y``: its first draft reads a zero feature in a slot
that is dropped after that draft (the drafts stay lossless: any q is).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from svt.models.eagle3 import HiddenStateHead


def is_head(draft) -> bool:
    """Whether ``draft`` drafts from the target's features: a hidden-state head (EAGLE-3, MTP) or a
    block-parallel drafter (DFlash, DSpark), which read the same catch-up slots."""
    from svt.models.block import BlockDrafter

    return isinstance(draft, (HiddenStateHead, BlockDrafter))


def drafter_kind(draft) -> str:
    return draft.kind if is_head(draft) else "model"


def taps_of(out, aux: tuple[int, ...]) -> torch.Tensor:
    """The concatenated tapped hidden states ``[B, T, 3H]`` of a target forward."""
    return torch.cat([out.hidden_states[k] for k in aux], -1)


@dataclass
class CatchUp:
    """The slots to feed before the next draft: tokens [nb, S], fused features [nb, S, H], the mask
    of slots fed and of slots kept after the draft (a one-token prompt's zero-feature slot is fed,
    not kept)."""

    ids: torch.Tensor
    feat: torch.Tensor
    fed: torch.Tensor
    kept: torch.Tensor

    def select(self, keep: torch.Tensor) -> CatchUp:
        return CatchUp(self.ids[keep], self.feat[keep], self.fed[keep], self.kept[keep])


def merge_catch_up(a: CatchUp, b: CatchUp) -> CatchUp:
    """``a``'s rows then ``b``'s (rows just prefilled join a batch): the narrower is left-padded with
    slots neither fed nor kept, so every row's last slot stays its last."""
    width = max(a.ids.shape[1], b.ids.shape[1])
    pad = torch.nn.functional.pad

    def wide(c: CatchUp) -> CatchUp:
        n = width - c.ids.shape[1]
        return CatchUp(pad(c.ids, (n, 0)), pad(c.feat, (0, 0, n, 0)), pad(c.fed, (n, 0)), pad(c.kept, (n, 0)))

    a, b = wide(a), wide(b)
    return CatchUp(torch.cat([a.ids, b.ids]), torch.cat([a.feat, b.feat]), torch.cat([a.fed, b.fed]),
                   torch.cat([a.kept, b.kept]))


def prefill_catch_up(head: HiddenStateHead, ids: torch.Tensor, pmask: torch.Tensor, taps: torch.Tensor,
                     pending: torch.Tensor) -> CatchUp:
    """After the target's prefill of the left-padded ``ids`` (prompt[:-1]): slot j holds token p_i's
    feature and p_{i+1} (the last real slot: p_{n-2} and ``pending`` = p_{n-1})."""
    nxt = torch.cat([ids[:, 1:], pending[:, None]], 1)
    feat = head.fuse(taps)
    feat = torch.where(pmask[..., None].bool(), feat, torch.zeros_like(feat))  # a hole's feature: 0, never NaN
    fed = pmask.clone()
    fed[:, -1] = 1
    return CatchUp(nxt, feat, fed, pmask)


def prefill_head(dc, catch: CatchUp) -> CatchUp:
    """Feed a prefill's catch-up slots but the last into the head's cache (``dc``, an
    ``engine._Cache``), as the prefill step of a serving engine runs the draft head over the prompt;
    returns the last slot alone, which the first draft feeds. Without it the first draft after an
    admission would run the head over the whole prompt for every row of the batch it joined. The
    same slots reach the cache in the same order either way."""
    if catch.ids.shape[1] > 1:
        dc.forward(catch.ids[:, :-1], catch.fed[:, :-1], features=catch.feat[:, :-1], last_only=True)
        dc.restrict_last(catch.kept[:, :-1])
    return CatchUp(catch.ids[:, -1:], catch.feat[:, -1:], catch.fed[:, -1:], catch.kept[:, -1:])


def step_catch_up(head: HiddenStateHead, taps: torch.Tensor, x: torch.Tensor, acc: torch.Tensor,
                  next_token: torch.Tensor) -> CatchUp:
    """After a verify of ``[y, x_0..x_{K-1}]`` (``taps`` [nb, K + 1, 3H]) that kept ``acc`` drafts:
    the ``acc + 1`` slots (feature(y), x_0), .., (feature(x_{acc-1}), next_token), right-aligned in
    ``K + 1`` slots."""
    nb, K1 = taps.shape[:2]
    j = torch.arange(K1, device=x.device)[None, :]
    nxt = torch.cat([x, next_token[:, None]], 1)  # [nb, K + 1]
    nxt = torch.where(j == acc[:, None], next_token[:, None], nxt)
    src = j - (K1 - 1 - acc[:, None])  # slot s holds source j = s - (K - acc)
    real = src >= 0
    src = src.clamp(min=0)
    ids = nxt.gather(1, src)
    feat = head.fuse(taps.gather(1, src[..., None].expand(-1, -1, taps.shape[-1])))
    mask = real.long()
    return CatchUp(ids, torch.where(real[..., None], feat, torch.zeros_like(feat)), mask, mask)


def draft_with_head(dc, catch: CatchUp, k: int, sample, hidden: bool, go_on=None):
    """Up to ``k`` drafts from the head: ``sample(logits [nb, V]) -> (q, x)``; ``go_on(i, q_i)``
    (AV+length) says after each draft whether to draft on. Returns the q's, x's and (when
    ``hidden``) the normed hidden state each draft was read from."""
    nb = catch.ids.shape[0]
    o = dc.forward(catch.ids, catch.fed, features=catch.feat, last_only=True)
    ones1 = torch.ones((nb, 1), dtype=torch.long, device=catch.ids.device)
    qs, toks, hid = [], [], []
    for i in range(k):
        q, x = sample(o.logits[:, -1])
        qs.append(q)
        toks.append(x)
        if hidden:
            hid.append(o.last_hidden[:, -1])
        if i < k - 1 and (go_on is None or go_on(i, q)):
            o = dc.forward(x[:, None], ones1, features=o.hidden[:, -1:])
        else:
            break
    # what stays: the catch-up's real slots; the draft slots fed after it become holes
    fed = len(toks) - 1
    dc.restrict_last(torch.cat([catch.kept, torch.zeros((nb, fed), dtype=torch.long, device=catch.ids.device)], 1))
    return torch.stack(qs, 1), torch.stack(toks, 1), hid


def head_teacher_forced_accepted(head: HiddenStateHead, target, sequences, k: int, batch_size: int = 8):
    """For each (prompt, output) of a greedy run: the head's accepted length from every decode
    position, ``[len(output)]`` (cf. ``svt.collect.cache.teacher_forced_accepted``).

    If the head's first j drafts from position t equal the target's next j tokens, its step j read
    exactly the tokens of the output, so it is step j of the training-time-test unroll of the chain
    that starts at the token before the pending one (``HiddenStateHead.ttt``): one target forward and one
    ``k``-step unroll per request give every position. Decode position t drafts output[t], ...,
    output[t + k - 1] from the chain at absolute position ``len(prompt) + t - 2``; a prompt of one
    token has no feature there (0 accepted at t = 0).
    """
    import numpy as np

    device = next(target.parameters()).device
    out = []
    for i in range(0, len(sequences), batch_size):
        chunk = sequences[i : i + batch_size]
        full = [list(p) + list(o) for p, o in chunk]
        width = max(len(s) for s in full)
        ids = torch.zeros((len(full), width), dtype=torch.long)
        for b, s in enumerate(full):  # right padding: positions 0..len-1; padding only feeds later chains
            ids[b, : len(s)] = torch.tensor(s)
        ids = ids.to(device)
        with torch.inference_mode():
            # the target's base model: its hidden states, not its LM head over every position
            base = getattr(target, "model", target)
            taps = taps_of(base(input_ids=ids, output_hidden_states=True), head.cfg.aux_layer_ids)
            # the chains from the shortest prompt's first decode position on: later steps and the
            # LM head run only where some request decodes (n - 2 .. n + m - 3), not over the prompts
            start = max(min(len(p) for p, _ in chunk) - 2, 0)
            steps = head.ttt(ids, head.fuse(taps), k, logits=False, start=start)
            guess = np.zeros((len(chunk), width - 1, k), dtype=np.int64)
            for b, (p, o) in enumerate(chunk):
                lo, hi = max(len(p) - 2, 0), max(len(p) + len(o) - 2, 0)
                if hi > lo:
                    guess[b, lo:hi] = torch.stack([head.logits_of(s.last_hidden[b, lo - start : hi - start]).argmax(-1)
                                                   for s in steps], -1).cpu().numpy()
        for b, (p, o) in enumerate(chunk):
            o = np.asarray(o, dtype=np.int64)
            n, m = len(p), o.size
            acc = np.zeros(m, dtype=np.int64)
            for t in range(m):
                chain = n + t - 2
                if chain < 0:
                    continue
                a = 0
                while a < k and t + a < m and guess[b, chain, a] == o[t + a]:
                    a += 1
                acc[t] = a
            out.append(acc)
    return out
