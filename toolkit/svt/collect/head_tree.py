"""Draft trees from a hidden-state head (EAGLE-2/3 growth): the tree engine's drafter when the
draft is an EAGLE-3 or MTP head (:mod:`svt.collect.tree_decode`, batch 1).

The head's cache holds one slot per verified token pair, as in the chain engine
(:mod:`svt.collect.head_draft`): slot ``i`` pairs the target's fused feature of ``t_i`` with
``t_{i+1}`` at position ``i``. Per step:

- **catch-up**: the slots of the tokens the target verified last step (after the prefill, of the
  prompt) are fed as a chain; the last one, the *root slot*, pairs the feature of the token before
  the pending one with the pending one; its logits give the root's distribution;
- **growth**: a node with path ``(x_1, .., x_d)`` is one slot holding ``x_d`` with its parent
  slot's output feature (the root slot's for ``d = 1``) at position ``root + d``, attending to the
  cache and its own ancestors (a 3D mask): exactly the slots the chain engine's ``d``-th draft
  reads when it drafts that path;
- **after the verify**: the target's taps at the last pending token and at the accepted path's
  nodes (the tree forward with a tree mask gives each node the hidden state of its own path) make
  the next catch-up: ``(feature(y), a_1), .., (feature(a_k), z)`` for the accepted path
  ``a_1..a_k`` and the token ``z`` the step emits after it. The node slots are cropped off.

A one-token prompt has no feature before the pending token: its root slot reads a zero feature and
is dropped after the step's growth (any q keeps the verify lossless).
"""

from __future__ import annotations

import numpy as np
import torch

from svt.collect.sampling import process_probs
from svt.trees.level_mask import level_mask


class HeadTreeScorer:
    """``q_fn`` for tree growth from a head (see the module's text). ``prepare`` sets the next
    catch-up; ``start`` feeds it and scores the root; ``__call__`` scores new paths one level at a
    time; ``finish`` crops the node slots off."""

    def __init__(self, head, temperature: float, top_p: float):
        from svt.collect.kv_cache import growing_cache

        self.head, self.temperature, self.top_p = head, temperature, top_p
        self.cache = growing_cache(head.config)
        self.device = next(head.parameters()).device
        self.ids: list[int] = []
        self.feat: torch.Tensor | None = None
        self.drop_root = False
        self.q: dict[tuple[int, ...], np.ndarray] = {}
        self.h: dict[tuple[int, ...], torch.Tensor] = {}
        self.slot: dict[tuple[int, ...], int] = {}
        self.context = 0
        self.root_pos = 0

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    def prepare(self, ids: list[int], feat: torch.Tensor, drop_root: bool = False) -> None:
        """The next catch-up: tokens ``ids`` with the fused features ``feat`` [len(ids), H]."""
        if len(ids) != feat.shape[0] or not ids:
            raise AssertionError(f"catch-up of {len(ids)} tokens with {feat.shape[0]} features")
        self.ids, self.feat, self.drop_root = list(ids), feat, drop_root

    def _forward(self, ids: list[int], feat: torch.Tensor, pos: list[int], allow: np.ndarray):
        mask = torch.as_tensor(allow, device=self.device)[None]
        with torch.inference_mode():
            return self.head(torch.tensor([ids], device=self.device), feat[None].to(self.device), mask,
                             torch.tensor([pos], device=self.device), self.cache)

    def _probs(self, logits: torch.Tensor) -> np.ndarray:
        return process_probs(logits.float(), self.temperature, self.top_p).double().cpu().numpy()

    def start(self, pending: list[int]) -> None:
        if self.feat is None or self.ids[-1] != pending[-1]:
            raise AssertionError("the head's catch-up must end with the pending token")
        n, t = self.length, len(self.ids)
        allow = np.tril(np.ones((t, n + t), dtype=bool), k=n)
        o = self._forward(self.ids, self.feat, list(range(n, n + t)), allow)
        self.root_pos = n + t - 1
        self.context = n + t
        self.q = {(): self._probs(o.logits[0, -1:])[0]}
        self.h = {(): o.hidden[0, -1]}
        self.slot = {}
        self.feat = None

    def __call__(self, paths: list[tuple[int, ...]]) -> np.ndarray:
        new = list(dict.fromkeys(p for p in paths if p not in self.q))
        if new:
            n = self.length
            allow = level_mask(new, self.slot, n, self.context)
            feat = torch.stack([self.h[p[:-1]] for p in new])
            o = self._forward([p[-1] for p in new], feat, [self.root_pos + len(p) for p in new], allow)
            probs = self._probs(o.logits[0])
            for i, path in enumerate(new):
                self.q[path], self.h[path], self.slot[path] = probs[i], o.hidden[0, i], n + i
        return np.stack([self.q[p] for p in paths])

    def finish(self) -> None:
        keep = self.context - int(self.drop_root)
        extra = self.length - keep
        if extra:
            self.cache.crop(-extra)
        self.drop_root = False


def prefill_catch_up(head, taps: torch.Tensor, prompt: list[int]) -> tuple[list[int], torch.Tensor, bool]:
    """The first catch-up after the target's prefill of ``prompt[:-1]`` (``taps`` [n - 1, 3H]):
    slots (feature(p_i), p_{i+1}); a one-token prompt gets one zero-feature slot, dropped later."""
    if len(prompt) == 1:
        param = next(head.parameters())
        return [int(prompt[0])], torch.zeros((1, head.cfg.hidden_size), dtype=param.dtype, device=param.device), True
    with torch.inference_mode():
        return [int(t) for t in prompt[1:]], head.fuse(taps), False


def step_catch_up(head, pending_taps: torch.Tensor, node_taps: torch.Tensor, tree, path: list[int],
                  emitted: list[int]) -> tuple[list[int], torch.Tensor]:
    """The catch-up after a verify: ``(feature(y), a_1), .., (feature(a_k), z)`` where ``y`` is the
    last pending token (its taps ``pending_taps`` [3H]), ``a_1..a_k`` the accepted path's nodes
    (``node_taps`` [N, 3H]) and ``emitted`` = [a_1..a_k, z] (cut short at an end of sequence)."""
    rows = [pending_taps] + [node_taps[i] for i in path]
    k = len(emitted)
    with torch.inference_mode():
        return [int(t) for t in emitted], head.fuse(torch.stack(rows[:k]))
