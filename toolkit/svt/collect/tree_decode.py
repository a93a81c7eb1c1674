"""Decoding one request with draft trees on a local pair: the drafter grows a tree level by level,
the target scores every node in one forward pass with a tree attention mask, and
:mod:`svt.trees.verify` labels the nodes and picks the tokens the step emits.

Caches (batch 1): each model keeps a ``DynamicCache`` of the committed context except its *pending*
tail (the tokens emitted last step, fed at the start of the next). A tree level is appended to the
draft's cache as extra slots, each attending to the context and its own ancestors through a 4D
additive mask, at position ``len(context) - 1 + len(path)``; the target gets the pending tokens and
the whole tree in one forward the same way. After the step both caches are cropped back to the
context: the accepted path is fed again next step with the new pending token (a few tokens of
recompute per step, exact by construction; the tests compare every distribution with a fresh
forward on the path).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from svt.collect.kv_cache import cache_kwarg
from svt.collect.sampling import process_probs
from svt.trees import DraftTree, grow_dynamic, grow_static, verify_greedy, verify_sampling
from svt.trees.draws import Draws
from svt.trees.level_mask import level_mask


@dataclass(frozen=True)
class TreeShape:
    """A static tree (``widths`` per depth) or EAGLE-2 growth (``top_m``, ``depth``, ``nodes``)."""

    widths: tuple[int, ...] | None = None
    top_m: int = 0
    depth: int = 0
    nodes: int = 0
    proposals: str = "top"

    @property
    def max_depth(self) -> int:
        return len(self.widths) if self.widths is not None else self.depth

    def grow(self, q_fn, draws: Draws) -> DraftTree:
        if self.widths is not None:
            return grow_static(self.widths, q_fn, self.proposals, draws)
        return grow_dynamic(q_fn, self.top_m, self.depth, self.nodes)


@dataclass
class TreeLog:
    """One request's nodes and steps as column lists, and its output."""

    nodes: dict[str, list] = field(default_factory=dict)
    steps: dict[str, list] = field(default_factory=dict)
    output: list[int] = field(default_factory=list)
    finish: str = "length"

    def add(self, table: dict, **cols) -> None:
        for k, v in cols.items():
            table.setdefault(k, []).extend(np.atleast_1d(v).tolist())


class TreeModel:
    """A causal LM with a batch-1 cache that takes chains and trees of new slots."""

    def __init__(self, model):
        from svt.collect.kv_cache import growing_cache
        from svt.models.lean import lean_forward

        self.model = model
        self.run = lean_forward(model) or model  # the engine's forward: the same arithmetic, less machinery
        self.cache = growing_cache(model.config)
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    def forward(self, ids: list[int], pos: list[int], allow: np.ndarray, aux: tuple[int, ...] = ()):
        """Append ``ids`` at positions ``pos``; ``allow[i, j]``: new slot ``i`` attends to slot ``j``
        of the cache after the append. Returns the logits ``[len(ids), V]`` (float32), and with
        ``aux`` (a head's tap layers) also the tapped hidden states ``[len(ids), 3H]``."""
        n = self.length
        if allow.shape != (len(ids), n + len(ids)):
            raise AssertionError(f"mask {allow.shape} for {len(ids)} new slots after {n}")
        mask = torch.full(allow.shape, torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        mask[torch.as_tensor(allow, device=self.device)] = 0.0
        with torch.inference_mode():
            out = self.run(input_ids=torch.tensor([ids], device=self.device),
                             attention_mask=mask[None, None],
                             position_ids=torch.tensor([pos], device=self.device),
                             use_cache=True, output_hidden_states=bool(aux), **{cache_kwarg(self.model): self.cache})
        if aux:
            return out.logits[0].float(), torch.cat([out.hidden_states[k][0] for k in aux], -1)
        return out.logits[0].float()

    def feed_chain(self, ids: list[int], aux: tuple[int, ...] = ()):
        """Append a chain (ordinary causal attention); the logits of its slots (and taps, see
        :meth:`forward`)."""
        n, t = self.length, len(ids)
        allow = np.tril(np.ones((t, n + t), dtype=bool), k=n)
        return self.forward(ids, list(range(n, n + t)), allow, aux)

    def crop(self, length: int) -> None:
        extra = self.length - length
        if extra < 0:
            raise AssertionError(f"cannot crop a cache of {self.length} slots to {length}")
        if extra:
            self.cache.crop(-extra)


# attention implementations that take no custom 4D mask (transformers' names)
NO_TREE_MASK = ("flash_attention_2", "flash_attention_3", "flex_attention")


def tree_attention(model, wanted: str = "auto") -> str:
    """``mask`` or ``paths`` for ``model`` (see ``TreeConfig.attention``)."""
    if wanted != "auto":
        return wanted
    impl = str(getattr(model.config, "_attn_implementation", "") or "")
    return "paths" if any(impl.startswith(n) for n in NO_TREE_MASK) or "flash" in impl else "mask"


class DraftScorer:
    """``q_fn`` for tree growth: the draft's distribution below each token path, one forward per
    level (``paths``: one chain forward per new path); ``()`` is the root, scored by feeding the
    pending tokens."""

    def __init__(self, lm: TreeModel, temperature: float, top_p: float, attention: str = "mask"):
        self.lm, self.temperature, self.top_p, self.attention = lm, temperature, top_p, attention
        self.q: dict[tuple[int, ...], np.ndarray] = {}
        self.slot: dict[tuple[int, ...], int] = {}
        self.context = 0

    def start(self, pending: list[int]) -> None:
        logits = self.lm.feed_chain(pending)
        self.context = self.lm.length
        self.q = {(): self._probs(logits[-1:])[0]}
        self.slot = {}

    def _probs(self, logits: torch.Tensor) -> np.ndarray:
        return process_probs(logits, self.temperature, self.top_p).double().cpu().numpy()

    def __call__(self, paths: list[tuple[int, ...]]) -> np.ndarray:
        new = list(dict.fromkeys(p for p in paths if p not in self.q))
        if new and self.attention == "paths":
            for path in new:  # the path as an ordinary chain after the context, then cropped off
                logits = self.lm.feed_chain(list(path))
                self.q[path] = self._probs(logits[-1:])[0]
                self.lm.crop(self.context)
        elif new:
            n, c = self.lm.length, self.context
            allow = level_mask(new, self.slot, n, c)
            logits = self.lm.forward([p[-1] for p in new], [c - 1 + len(p) for p in new], allow)
            for i, (path, q) in enumerate(zip(new, self._probs(logits), strict=True)):
                self.q[path], self.slot[path] = q, n + i
        return np.stack([self.q[p] for p in paths])

    def finish(self) -> None:
        self.lm.crop(self.context)


def score_tree(lm: TreeModel, pending: list[int], tree: DraftTree, temperature: float, top_p: float,
               aux: tuple[int, ...] = ()):
    """The target's distributions below the root and every node, ``[1 + N, V]``, in one forward of
    the pending tokens and the tree; the cache is left holding the context (pending included). With
    ``aux``: also the taps of the last pending token and of every node, ``[1 + N, 3H]``."""
    n, t, size = lm.length, len(pending), tree.size
    c = n + t  # the context once the pending tokens are in
    allow = np.zeros((t + size, c + size), dtype=bool)
    allow[:t, :c] = np.tril(np.ones((t, c), dtype=bool), k=n)
    allow[t:, :c] = True
    for i in range(size):
        a = i
        while a >= 0:
            allow[t + i, c + a] = True
            a = int(tree.parent[a])
    pos = list(range(n, c)) + [c + int(d) for d in tree.depth]
    out = lm.forward(list(pending) + tree.token.tolist(), pos, allow, aux)
    logits, taps = out if aux else (out, None)
    lm.crop(c)
    rows = torch.cat([logits[t - 1:t], logits[t:]])
    probs = process_probs(rows, temperature, top_p).double().cpu().numpy()
    return (probs, taps[t - 1:]) if aux else probs


def score_tree_paths(lm: TreeModel, pending: list[int], tree: DraftTree, temperature: float,
                     top_p: float, aux: tuple[int, ...] = ()):
    """:func:`score_tree` for a model that takes no tree mask: the pending tokens as a chain, then
    each root-to-leaf path as a chain after them (cropped off again); a node's distribution (and
    taps) come from the first path through it. The cache is left holding the context (pending
    included)."""
    out = lm.feed_chain(list(pending), aux)
    root, root_taps = (out[0][-1:], out[1][-1:]) if aux else (out[-1:], None)
    c = lm.length
    rows: list[torch.Tensor | None] = [None] * tree.size
    taps: list[torch.Tensor | None] = [None] * tree.size
    has_child = np.zeros(tree.size, dtype=bool)
    has_child[tree.parent[tree.parent >= 0]] = True
    for leaf in np.flatnonzero(~has_child):
        chain = [int(leaf)]
        while tree.parent[chain[-1]] >= 0:
            chain.append(int(tree.parent[chain[-1]]))
        chain.reverse()
        out = lm.feed_chain([int(tree.token[i]) for i in chain], aux)
        logits, path_taps = out if aux else (out, None)
        lm.crop(c)
        for j, i in enumerate(chain):
            if rows[i] is None:
                rows[i] = logits[j:j + 1]
                if aux:
                    taps[i] = path_taps[j:j + 1]
    stacked = torch.cat([root, *rows]) if tree.size else root
    probs = process_probs(stacked, temperature, top_p).double().cpu().numpy()
    return (probs, torch.cat([root_taps, *taps])) if aux else probs


def decode_tree(target, draft, prompt: list[int], shape: TreeShape, *, temperature: float, top_p: float,
                max_new_tokens: int, eos_id: int | None, seed: int, request: int,
                attention: tuple[str, str] = ("mask", "mask")) -> TreeLog:
    """Speculative decoding of one request with a draft tree per step; ``attention``: how the
    target and the draft score trees (``mask`` or ``paths``)."""
    from svt.collect import head_tree
    from svt.collect.head_draft import is_head

    head = is_head(draft)
    aux = tuple(draft.cfg.aux_layer_ids) if head else ()
    tlm = TreeModel(target)
    scorer = head_tree.HeadTreeScorer(draft, temperature, top_p) if head else \
        DraftScorer(TreeModel(draft), temperature, top_p, attention[1])
    score = score_tree if attention[0] == "mask" else score_tree_paths
    draws = Draws(seed)
    log = TreeLog()
    greedy = temperature == 0
    # the prompt less its last token goes in as context; the last token is the first pending one
    if len(prompt) > 1:
        out = tlm.feed_chain(list(prompt[:-1]), aux)
        if not head:
            scorer.lm.feed_chain(list(prompt[:-1]))
    if head:
        taps = out[1] if len(prompt) > 1 else torch.zeros((0, 3))
        scorer.prepare(*head_tree.prefill_catch_up(draft, taps, list(prompt)))
    pending = [int(prompt[-1])]
    step = 0
    while len(log.output) < max_new_tokens:
        t0 = time.perf_counter()
        scorer.start(pending)
        tree = shape.grow(scorer, draws)
        scorer.finish()
        t1 = time.perf_counter()
        p = score(tlm, pending, tree, temperature, top_p, aux)
        if head:
            p, taps = p
        out = verify_greedy(tree, p) if greedy else verify_sampling(tree, p, draws)
        t2 = time.perf_counter()
        emitted = out.tokens(tree)
        room = max_new_tokens - len(log.output)
        if eos_id is not None and eos_id in emitted[:room]:
            emitted, log.finish = emitted[:emitted.index(eos_id) + 1], "stop"
        emitted = emitted[:room]
        _log_step(log, tree, out, p, request, step, emitted, (t1 - t0) * 1e3, (t2 - t1) * 1e3)
        log.output.extend(emitted)
        if log.finish == "stop":
            break
        if head and len(log.output) < max_new_tokens:
            scorer.prepare(*head_tree.step_catch_up(draft, taps[0], taps[1:], tree, list(out.path), emitted))
        pending, step = emitted, step + 1
    return log


def _log_step(log: TreeLog, tree: DraftTree, out, p: np.ndarray, request: int, step: int, emitted: list[int],
              draft_ms: float, verify_ms: float) -> None:
    n = tree.size
    stats = tree.node_stats()
    p_token = p[1 + tree.parent, tree.token]  # the target's probability of each node's token at its parent
    log.add(log.nodes, request=[request] * n, step=[step] * n, node=np.arange(n), parent=tree.parent,
            depth=tree.depth, token=tree.token, rank=tree.rank, q_max=stats["q_max"], q_token=stats["q_token"],
            q_entropy=stats["q_entropy"], path_prob=tree.path_prob, p_token=p_token,
            accept_prob=out.accept_prob, label=out.label,
            match=out.match.astype(np.int8) if out.match is not None else np.full(n, -1, dtype=np.int8))
    log.add(log.steps, request=request, step=step, drafted=n, accepted=len(out.path), emitted=len(emitted),
            draft_ms=draft_ms, verify_ms=verify_ms, depth=int(tree.depth.max(initial=-1)) + 1)
