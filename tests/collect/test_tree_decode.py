"""Tree decoding on the built-in pair: the tree attention mask gives every node the distribution a
fresh forward over its path gives, and greedy tree decoding emits the target's own greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from svt.collect.sampling import process_probs
from svt.collect.tree_decode import (
    DraftScorer,
    TreeModel,
    TreeShape,
    decode_tree,
    score_tree,
    score_tree_paths,
    tree_attention,
)
from svt.trees.draws import Draws

PROMPT = [5, 17, 301, 44, 9, 1200, 77, 18]
# "    def __init__(self, name, value):\n        self.name = name\n        self." in the built-in
# tokenizer: text the pair agrees on in places (on the random ids above draft-small never does)
TEXT = [259, 346, 527, 644, 560, 279, 12, 458, 12, 503, 306, 266, 291, 14, 370, 281, 458, 266, 291, 14]


def fresh(model, ids: list[int]) -> np.ndarray:
    """softmax of the last logits of one uncached forward over ``ids``."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1:]
    return process_probs(logits, 1.0, 1.0).double().numpy()[0]


@pytest.mark.parametrize("attention", ["mask", "paths"])
@pytest.mark.parametrize("shape", [TreeShape(widths=(3, 2, 2)), TreeShape(top_m=3, depth=4, nodes=10),
                                   TreeShape(widths=(3, 2), proposals="sampled")])
def test_tree_mask_matches_fresh_forwards(tiny_pair, shape, attention):
    """Either way of scoring a tree (one masked forward, or one chain per leaf path) gives every
    node the distribution of a fresh forward on its path."""
    target, draft = tiny_pair.target, tiny_pair.draft
    tlm, dlm = TreeModel(target), TreeModel(draft)
    ctx, pending = PROMPT[:-3], PROMPT[-3:]  # a cached context and three pending tokens
    tlm.feed_chain(ctx)
    dlm.feed_chain(ctx)
    scorer = DraftScorer(dlm, 1.0, 1.0, attention)
    scorer.start(pending)
    tree = shape.grow(scorer, Draws(3))
    scorer.finish()
    assert dlm.length == len(PROMPT)  # cropped back to the context
    assert tree.size > 3 and tree.depth.max() >= 1
    for node, q in tree.dists.items():
        np.testing.assert_allclose(q, fresh(draft, PROMPT + list(tree.path(node))), atol=2e-5)
    p = (score_tree if attention == "mask" else score_tree_paths)(tlm, pending, tree, 1.0, 1.0)
    assert tlm.length == len(PROMPT)
    np.testing.assert_allclose(p[0], fresh(target, PROMPT), atol=2e-5)
    for i in range(tree.size):
        np.testing.assert_allclose(p[1 + i], fresh(target, PROMPT + list(tree.path(i))), atol=2e-5)


@pytest.mark.parametrize("shape", [TreeShape(widths=(2, 2, 1)), TreeShape(top_m=2, depth=3, nodes=6)])
def test_greedy_tree_decoding_emits_the_targets_greedy_tokens(tiny_pair, shape):
    target, draft = tiny_pair.target, tiny_pair.draft
    log = decode_tree(target, draft, TEXT, shape, temperature=0.0, top_p=1.0, max_new_tokens=40,
                      eos_id=None, seed=0, request=0)
    ids = list(TEXT)
    with torch.inference_mode():
        for _ in range(40):
            ids.append(int(target(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert log.output == ids[len(TEXT):]
    steps = log.steps
    assert sum(steps["emitted"]) == 40
    assert all(a + 1 >= e for a, e in zip(steps["accepted"], steps["emitted"], strict=True))
    labels = np.array(log.nodes["label"])
    # every step's accepted nodes are its path: as many 1-labels as accepted tokens
    per_step = np.bincount(np.array(log.nodes["step"])[labels == 1], minlength=len(steps["step"]))
    assert per_step.tolist() == steps["accepted"]
    assert max(steps["accepted"]) >= 1  # the pair agrees somewhere: the tree is doing work


def test_per_path_scoring_decodes_as_the_tree_mask_does(tiny_pair):
    kw = dict(temperature=0.0, top_p=1.0, max_new_tokens=24, eos_id=None, seed=0, request=0)
    shape = TreeShape(top_m=2, depth=3, nodes=6)
    a = decode_tree(tiny_pair.target, tiny_pair.draft, PROMPT, shape, **kw)
    b = decode_tree(tiny_pair.target, tiny_pair.draft, PROMPT, shape, attention=("paths", "paths"), **kw)
    assert a.output == b.output and a.steps["accepted"] == b.steps["accepted"]
    for col in ("token", "parent", "label", "match"):
        assert a.nodes[col] == b.nodes[col], col
    np.testing.assert_allclose(a.nodes["path_prob"], b.nodes["path_prob"], atol=1e-5)
    assert tree_attention(tiny_pair.target) == "mask"  # the tiny pair (sdpa/eager) takes the mask
    assert tree_attention(tiny_pair.target, "paths") == "paths"


def test_decoding_stops_at_the_end_of_sequence_token(tiny_pair):
    """An eos token inside a step's accepted tokens ends the request there, nothing after it."""
    target, draft = tiny_pair.target, tiny_pair.draft
    shape = TreeShape(widths=(2, 2, 1))
    free = decode_tree(target, draft, TEXT, shape, temperature=0.0, top_p=1.0, max_new_tokens=30,
                       eos_id=None, seed=0, request=0)
    # an eos that lands inside an accepted run, not at a step's first token
    starts = np.cumsum([0] + free.steps["emitted"][:-1])
    at = next(i for i in range(1, 30) if i not in starts and free.output[i] not in free.output[:i])
    stopped = decode_tree(target, draft, TEXT, shape, temperature=0.0, top_p=1.0, max_new_tokens=30,
                          eos_id=free.output[at], seed=0, request=0)
    assert stopped.finish == "stop" and free.finish == "length"
    assert stopped.output == free.output[:at + 1]
    assert sum(stopped.steps["emitted"]) == at + 1


def _chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    """p-value of observed token counts against p: tokens expected >= 5 times alone, the rest pooled."""
    from scipy import stats

    n = counts.sum()
    big = p * n >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(p[big] * n, p[~big].sum() * n)
    keep = exp > 0
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


@pytest.mark.parametrize("shape", [TreeShape(widths=(2, 2), proposals="sampled"),
                                   # 20 s: the second shape runs with the end-to-end tests (make test-slow)
                                   pytest.param(TreeShape(top_m=3, depth=2, nodes=6), marks=pytest.mark.slow)])
def test_sampled_tree_decoding_emits_the_targets_distribution(tiny_pair, shape):
    """The engine's wiring of the lossless verifier: over 1,200 one-token decodes of one prompt, the
    first token follows the target's distribution (chi-square), while the drafter's first child,
    what a verifier against the wrong distribution would lean on, is rejected by the same test
    (the pair differs: TV ~0.8 here, so the check has power)."""
    target, draft = tiny_pair.target, tiny_pair.draft
    first, child0 = [], []
    for seed in range(1200):
        log = decode_tree(target, draft, PROMPT, shape, temperature=1.0, top_p=1.0, max_new_tokens=1,
                          eos_id=None, seed=seed, request=0)
        first.append(log.output[0])
        root0 = [t for t, par, r in zip(log.nodes["token"], log.nodes["parent"], log.nodes["rank"], strict=True)
                 if par == -1 and r == 0]
        child0.append(root0[0])
    p = fresh(target, PROMPT)
    vocab = p.size
    assert _chi_square(np.bincount(first, minlength=vocab), p) > 1e-3
    assert _chi_square(np.bincount(child0, minlength=vocab), p) < 1e-6
