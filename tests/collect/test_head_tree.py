"""Draft trees from a hidden-state head: every node's draft probability equals the head's
training-time-test unroll along the node's path after the tokens emitted so far (which checks the
catch-up after each verify, the node slots' features, positions and masks, and the crop), greedy
tree decoding emits the target's greedy tokens, and sampled tree decoding stays lossless."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from svt.collect.head_draft import taps_of
from svt.collect.sampling import process_probs
from svt.collect.tree_decode import TreeShape, decode_tree
from tests.collect.test_engine_head import _head, _target, _trained_head
from tests.collect.test_tree_decode import _chi_square

SHAPES = [TreeShape(widths=(3, 2, 2)), TreeShape(top_m=3, depth=4, nodes=10)]


@pytest.fixture(scope="module")
def pair40():
    target = _target(40, peak=3.0)
    return target, _trained_head(target)


@torch.inference_mode()
def _unrolled(head, target, seq: list[int], steps: int) -> np.ndarray:
    """The head's chain distributions drafting after ``seq[:len - steps]`` (the chain starts at the
    token before its last one, the pending token): row d is step d's q, which reads ``seq``'s
    following tokens as the drafts before it."""
    ids = torch.tensor([seq])
    taps = taps_of(target(input_ids=ids, output_hidden_states=True), head.cfg.aux_layer_ids)
    outs = head.ttt(ids, head.fuse(taps), steps)
    chain = len(seq) - steps - 2
    return np.stack([process_probs(o.logits[0, chain], 1.0, 1.0).double().numpy() for o in outs])


def _steps(log):
    """Per step: (emitted before it, the step's nodes as (parent, token, q_token) lists)."""
    nodes = log.nodes
    before, out = 0, []
    for s, emitted in zip(log.steps["step"], log.steps["emitted"], strict=True):
        idx = [i for i, x in enumerate(nodes["step"]) if x == s]
        out.append((before, [(nodes["parent"][i], nodes["token"][i], nodes["q_token"][i]) for i in idx]))
        before += emitted
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("prompt", [[3, 7, 9, 12, 5], [4]])
def test_every_node_reads_what_the_chain_unroll_reads(pair40, shape, prompt):
    target, head = pair40
    log = decode_tree(target, head, prompt, shape, temperature=1.0, top_p=1.0, max_new_tokens=24, eos_id=None,
                      seed=3, request=0)
    assert len(log.steps["step"]) > 2
    checked = 0
    for before, nodes in _steps(log):
        ctx = list(prompt) + log.output[:before]
        for i, (parent, token, q_token) in enumerate(nodes):
            path = [token]
            a = parent
            while a >= 0:
                path.insert(0, nodes[a][1])
                a = nodes[a][0]
            if len(ctx) == 1:  # a one-token prompt's first tree reads a zero feature: no unroll to compare
                continue
            q = _unrolled(head, target, ctx + path, len(path))[len(path) - 1]
            np.testing.assert_allclose(q_token, q[token], atol=2e-5, err_msg=f"node {i} {path} after {ctx}")
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_head_trees_emit_the_targets_greedy_tokens(pair40, shape):
    target, head = pair40
    prompt = [3, 7, 9, 12, 5]
    log = decode_tree(target, head, prompt, shape, temperature=0.0, top_p=1.0, max_new_tokens=30, eos_id=None,
                      seed=0, request=0)
    want = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           max_new_tokens=30, min_new_tokens=30, do_sample=False, pad_token_id=0,
                           eos_token_id=None)[0, len(prompt):].tolist()
    assert log.output == want
    assert sum(log.steps["accepted"]) > 0  # the trained head's trees are accepted some of the time


def test_sampled_head_trees_emit_the_targets_distribution():
    """Over 1,500 one-token decodes, the first token follows the target (chi-square), while the
    head's own first proposal, what a verifier against the wrong distribution would lean on, fails
    the same test (the head here is random: it differs from the target)."""
    target = _target(6)
    head = _head(target)
    prompt = [2, 3, 4, 5, 2]
    first, child0 = [], []
    for seed in range(1500):
        log = decode_tree(target, head, prompt, TreeShape(widths=(2, 2), proposals="sampled"), temperature=1.0,
                          top_p=1.0, max_new_tokens=1, eos_id=None, seed=seed, request=0)
        first.append(log.output[0])
        child0.append(next(t for t, par, r in zip(log.nodes["token"], log.nodes["parent"], log.nodes["rank"],
                                                  strict=True) if par == -1 and r == 0))
    with torch.inference_mode():
        p = process_probs(target(input_ids=torch.tensor([prompt])).logits[0, -1], 1.0, 1.0).double().numpy()
    assert _chi_square(np.bincount(first, minlength=6), p) > 1e-3
    assert _chi_square(np.bincount(child0, minlength=6), p) < 1e-6
