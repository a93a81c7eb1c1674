"""Drafting with a block-parallel drafter (DFlash, DSpark) inside svt's batched engine.

The drafter keeps a KV cache of its context (``engine._Cache``: holes, a 2D mask and live counts as
for a head). Its context slot ``j`` is the fused target feature of token ``t_j``. A step is **one**
forward: the catch-up slots (the features of the tokens the target verified last step: the same
:class:`svt.collect.head_draft.CatchUp` a head reads, its token ids unused) are appended and kept;
the block ``[y, mask × (B - 1)]`` (``y`` the pending token) is appended after them, read
non-causally, and turned into holes once drafted. Then the drafts are sampled from the block's
slots: DFlash's slots independently (each depends on the context and the block only); DSpark's in
order through its Markov head, each slot's distribution conditional on the draft sampled before it
(the anchor ``y`` before the first), so per-position rejection sampling stays lossless.
"""

from __future__ import annotations

import torch

from svt.collect.head_draft import CatchUp


def is_block(draft) -> bool:
    from svt.models.block import BlockDrafter

    return isinstance(draft, BlockDrafter)


def block_ids(model, anchor: torch.Tensor) -> torch.Tensor:
    """The block's token ids [nb, block_size]: the anchor then the mask token."""
    ids = anchor[:, None].repeat(1, model.cfg.block_size)
    ids[:, 1:] = model.cfg.mask_token_id
    return ids


def draft_with_block(dc, catch: CatchUp, anchor: torch.Tensor, k: int, sample, hidden: bool, go_on=None):
    """Up to ``k`` drafts (``k`` at most the block's draft slots) from one forward of the drafter:
    ``sample(logits [nb, V]) -> (q, x)``; ``go_on(i, q_i)`` (AV+length) says after each draft whether
    to take the next slot. Returns the q's, the x's, (when ``hidden``) each slot's normed hidden
    state, and (DSpark) the confidence head's probability of each draft [nb, L] (else None)."""
    model = dc.model
    nb, bs = anchor.shape[0], model.cfg.block_size
    ones = torch.ones((nb, bs), dtype=catch.fed.dtype, device=anchor.device)
    o = dc.forward(torch.cat([catch.ids, block_ids(model, anchor)], 1), torch.cat([catch.fed, ones], 1),
                   features=catch.feat, block=bs)
    h = model.draft_slots(o.hidden)
    qs, toks, hid, conf = [], [], [], []
    prev = anchor
    for i in range(min(k, h.shape[1])):
        q, x = sample(model.slot_logits(h[:, i], prev))
        qs.append(q)
        toks.append(x)
        c = model.confidence(h[:, i], prev)
        if c is not None:
            conf.append(c)
        if hidden:
            hid.append(h[:, i])
        prev = x
        if go_on is not None and i < k - 1 and not go_on(i, q):
            break
    # what stays: the catch-up's real slots; the block's become holes
    dc.restrict_last(torch.cat([catch.kept, torch.zeros_like(ones)], 1))
    return torch.stack(qs, 1), torch.stack(toks, 1), hid, (torch.stack(conf, 1) if conf else None)


@torch.inference_mode()
def block_teacher_forced_accepted(model, target, sequences, k: int, batch_size: int = 8):
    """For each (prompt, output) of a greedy run: the block drafter's accepted length from every
    decode position, ``[len(output)]`` (cf. :func:`svt.collect.cache.teacher_forced_accepted`).

    Decode position ``t`` drafts from the anchor ``y = (prompt + output)[n + t - 1]`` over the
    target's features of the tokens before it. If its first ``j`` drafts equal the output, the
    Markov head read exactly the output's tokens as their previous tokens, so slot ``j``'s greedy
    draft is the argmax of its logits with the previous token taken from the output: one target
    forward and one block forward per request (every anchor at once) give every position."""
    import numpy as np

    from svt.collect.head_draft import taps_of
    from svt.models.train_block import block_forward

    device = next(target.parameters()).device
    out = []
    for p, o in sequences:
        seq = list(p) + list(o)
        n, m = len(p), len(o)
        ids = torch.tensor([seq], dtype=torch.long, device=device)
        taps = taps_of(target(input_ids=ids, output_hidden_states=True), model.cfg.aux_layer_ids)
        acc = np.zeros(m, dtype=np.int64)
        anchors = [n + t - 1 for t in range(m) if n + t - 1 >= 1]
        if not anchors:
            out.append(acc)
            continue
        first_t = m - len(anchors)
        h = model.draft_slots(block_forward(model, ids, taps, torch.tensor([anchors], device=device)))[0]
        seq_t = torch.tensor(seq + [0] * (k + 1), dtype=torch.long, device=device)
        L = min(k, h.shape[1])
        for j, a in enumerate(anchors):
            t = first_t + j
            prev = seq_t[a : a + L]  # the tokens before each slot's, as accepted
            guess = torch.stack([model.slot_logits(h[j, i][None], prev[i][None])[0].argmax() for i in range(L)])
            got = 0
            while got < L and t + got < m and int(guess[got]) == o[t + got]:
                got += 1
            acc[t] = got
        out.append(acc)
    return out
