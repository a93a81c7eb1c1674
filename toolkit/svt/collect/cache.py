"""Cache drafts (SuffixDecoding through arctic-inference) and their features, for Hybrid Verified
Decoding on greedy runs.

At every decode position t of a request (t output tokens already generated) the cache proposes a
draft from two kinds of suffix trees, as SuffixDecoding does: the request's own tree (its prompt and
the tokens it has generated so far) and a global tree of earlier responses. A response enters the
global tree when its request finishes, in the order a server would see the finishes. The draft
whose match scores higher is proposed (ties go to the request's own tree, as in arctic-inference).

Every feature of the row at t is computable by a live system at that moment: the draft, its match
statistics, the context it matched, and history features that compare earlier drafts only with
tokens generated before t. Two labels are not features: ``oracle_accepted`` (the common prefix of
the draft with the target's real continuation) and ``model_accepted`` (what the model drafter with K
drafts would have had at t; see ``teacher_forced_accepted``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from svt.config import CacheOptions
from svt.features.char_classes import CHAR_CLASSES, char_class_shares
from svt.metrics.repetition import common_prefix


class CacheDrafter:
    """SuffixDecoding state for a stream of requests (arctic-inference's ``SuffixDecodingCache``).

    Two caches keep the two kinds of tree apart so that the global tree holds only finished
    responses: ``own`` (global tree disabled) holds each active request's prompt and generated
    tokens; ``done`` holds finished responses, queried through a probe request with an empty tree.
    """

    PROBE = "__svt_probe__"

    def __init__(self, options: CacheOptions):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.o = options
        self.own = SuffixDecodingCache(options.max_tree_depth, max_cached_requests=0)
        self.done = SuffixDecodingCache(options.max_tree_depth, max_cached_requests=options.max_cached_requests)
        self.done.start_request(self.PROBE, [])
        self.finished: list = []

    def start(self, req, prompt_ids) -> None:
        self.own.start_request(req, np.ascontiguousarray(prompt_ids, dtype=np.int32))

    def extend(self, req, token_ids) -> None:
        """The request generated ``token_ids``: they join its own tree."""
        self.own.add_active_response(req, np.ascontiguousarray(token_ids, dtype=np.int32))

    def finish(self, req, response_ids) -> None:
        """The request finished: its response enters the global tree."""
        self.own.stop_request(req)
        self.done.start_request(req, [])
        self.done.add_active_response(req, np.ascontiguousarray(response_ids, dtype=np.int32))
        self.done.stop_request(req)
        self.finished.append(req)

    def _speculate(self, req, context: np.ndarray, tree: bool):
        o = self.o
        ctx = np.ascontiguousarray(context[-o.max_tree_depth:], dtype=np.int32)
        t0 = time.perf_counter()
        kw = dict(max_spec_tokens=o.max_draft_len, max_spec_factor=o.max_spec_factor,
                  max_spec_offset=o.max_spec_offset, min_token_prob=o.min_token_prob, use_tree_spec=tree)
        a = self.own.speculate(req, ctx, **kw)
        b = self.done.speculate(self.PROBE, ctx, **kw)
        ms = (time.perf_counter() - t0) * 1e3
        d, glob = (a, False) if a.score >= b.score else (b, True)
        return d, glob and bool(d.token_ids), ms

    def propose(self, req, context: np.ndarray):
        """(draft ids, per-token probabilities, score, match_len, from_global, lookup ms)."""
        d, glob, ms = self._speculate(req, context, tree=False)
        return (np.asarray(d.token_ids, dtype=np.int64), np.asarray(d.probs, dtype=np.float64), float(d.score),
                int(d.match_len) if d.token_ids else 0, glob, ms)

    def propose_tree(self, req, context: np.ndarray) -> CacheTree:
        """SuffixDecoding's tree draft (arctic-inference's ``use_tree_spec``) from the same state."""
        d, glob, ms = self._speculate(req, context, tree=True)
        return CacheTree(np.asarray(d.token_ids, dtype=np.int64), np.asarray(d.parents, dtype=np.int64),
                         np.asarray(d.probs, dtype=np.float64), float(d.score),
                         int(d.match_len) if d.token_ids else 0, glob, ms)


@dataclass
class CacheTree:
    """A suffix-tree draft: nodes in arctic-inference's order (``parent[i]`` indexes an earlier node,
    -1 the context) with the tree's estimated probability of reaching each node."""

    token: np.ndarray
    parent: np.ndarray
    prob: np.ndarray
    score: float  # arctic-inference: the sum of ``prob``
    match_len: int
    from_global: bool
    lookup_ms: float

    def depths(self) -> np.ndarray:
        depth = np.zeros(self.token.size, dtype=np.int64)
        for i, p in enumerate(self.parent):
            if not -1 <= p < i:
                raise ValueError(f"suffix tree node {i}: parent {int(p)} is not an earlier node")
            depth[i] = 0 if p < 0 else depth[p] + 1
        return depth




ROW_COLUMNS = ("draft_len", "match_len", "score", "prob_mean", "prob_min", "from_global", "context_len",
               "prev_draft_len", "prev_match_len", "hist_draft_share", "hist_yield_mean", "hist_yield_max",
               *(f"draft_{c}" for c in CHAR_CLASSES), *(f"ctx_{c}" for c in CHAR_CLASSES))


class RequestFeatures:
    """The feature row of each decode position of one request; history features use only tokens
    generated before the position."""

    def __init__(self, options: CacheOptions, classes: np.ndarray, prompt_len: int):
        self.o, self.classes, self.prompt_len = options, classes, prompt_len
        self.drafts: list[np.ndarray] = []  # draft at each earlier position
        self.prev = (0, 0)

    def row(self, t: int, output_so_far: np.ndarray, context: np.ndarray, draft: np.ndarray,
            probs: np.ndarray, score: float, match_len: int, from_global: bool) -> dict:
        assert output_so_far.size == t
        lo = max(0, t - self.o.history)
        yields = [common_prefix(self.drafts[u], output_so_far[u:t]) for u in range(lo, t)]
        has = [self.drafts[u].size > 0 for u in range(lo, t)]
        ctx_ids = context[context.size - match_len:] if match_len else context[:0]
        r = {"draft_len": int(draft.size), "match_len": int(match_len), "score": float(score),
             "prob_mean": float(probs.mean()) if probs.size else 0.0,
             "prob_min": float(probs.min()) if probs.size else 0.0,
             "from_global": bool(from_global), "context_len": int(context.size),
             "prev_draft_len": self.prev[0], "prev_match_len": self.prev[1],
             "hist_draft_share": float(np.mean(has)) if has else 0.0,
             "hist_yield_mean": float(np.mean(yields)) if yields else 0.0,
             "hist_yield_max": float(max(yields)) if yields else 0.0}
        for name, v in zip(CHAR_CLASSES, char_class_shares(self.classes, draft), strict=True):
            r[f"draft_{name}"] = float(v)
        for name, v in zip(CHAR_CLASSES, char_class_shares(self.classes, ctx_ids), strict=True):
            r[f"ctx_{name}"] = float(v)
        self.drafts.append(draft)
        self.prev = (int(draft.size), int(match_len))
        return r


def teacher_forced_accepted(draft_model, sequences: list[tuple[list[int], list[int]]], k: int,
                            batch_size: int = 8, *, target=None) -> list[np.ndarray]:
    """For each (prompt, output) of a greedy run: the model drafter's accepted length from every
    decode position, ``[len(output)]``.

    If the draft's first j tokens equal the target's next j tokens, the draft's token j is the draft
    model's argmax on the target's own prefix; so the accepted length from t is the run of positions
    t, t+1, ... where the draft's teacher-forced argmax equals the output token, capped at K (and at
    the tokens left). One forward per request gives every position. A hidden-state head (EAGLE-3)
    is unrolled over its ``target``'s features instead
    (:func:`svt.collect.head_draft.head_teacher_forced_accepted`).
    """
    import torch

    from svt.collect.block_draft import block_teacher_forced_accepted, is_block
    from svt.collect.head_draft import head_teacher_forced_accepted, is_head

    if is_block(draft_model):  # a block drafter: every anchor's block in one forward
        if target is None:
            raise ValueError("a block drafter's teacher-forced drafts need its target (target=...)")
        return block_teacher_forced_accepted(draft_model, target, sequences, k)
    if is_head(draft_model):  # a hidden-state head drafts from the target's features
        if target is None:
            raise ValueError("a hidden-state head's teacher-forced drafts need its target (target=...)")
        return head_teacher_forced_accepted(draft_model, target, sequences, k, batch_size)
    device = next(draft_model.parameters()).device
    out: list[np.ndarray] = []
    for i in range(0, len(sequences), batch_size):
        chunk = sequences[i : i + batch_size]
        full = [list(p) + list(o) for p, o in chunk]
        width = max(len(s) for s in full)
        ids = torch.zeros((len(full), width), dtype=torch.long)
        mask = torch.zeros((len(full), width), dtype=torch.long)
        for b, s in enumerate(full):  # right padding: positions are 0..len-1 for every row
            ids[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = 1
        with torch.inference_mode():
            logits = draft_model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        pred = logits.argmax(-1).cpu().numpy()
        for b, (p, o) in enumerate(chunk):
            o = np.asarray(o, dtype=np.int64)
            guess = pred[b, len(p) - 1 : len(p) - 1 + o.size]  # the draft's argmax for output[j]
            out.append(accepted_runs(guess == o, k))
    return out


def accepted_runs(match: np.ndarray, k: int) -> np.ndarray:
    """From a boolean ``match[j]`` (the drafter's guess for token j is right): the run of matches
    starting at each position, capped at ``k``.

    >>> accepted_runs(np.array([True, True, False, True, True, True]), 2).tolist()
    [2, 1, 0, 2, 2, 1]
    """
    run = np.zeros(match.size + 1, dtype=np.int64)
    for j in range(match.size - 1, -1, -1):
        run[j] = run[j + 1] + 1 if match[j] else 0
    return np.minimum(run[:-1], k)
