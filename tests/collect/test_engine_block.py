"""svt's engine drafting with block-parallel drafters (DFlash, DSpark): lossless (chi-square on the
joint of the first two emitted tokens: the test that catches a Markov head fed the wrong previous
token), greedy equal to the target's greedy decoding, every logged draft distribution equal to an
unbatched, uncached block forward on the same tokens (which checks the catch-up slots, the block's
holes, compaction, row removal and continuous batching), and the teacher-forced accepted lengths
equal to a greedy run's own."""

import numpy as np
import pytest
import torch

from svt.collect.engine import SamplingParams, run_batch
from svt.collect.sampling import process_probs
from svt.models.train_block import anchor_batch, block_forward, block_loss, make_block
from svt.models.train_eagle3 import target_view
from tests.collect.test_engine_head import PROMPT, V, _joint, _target
from tests.collect.test_engine_lossless import _chi2, _shifted

N = 40_000


def _trained_block(target, kind, steps=60, seed=6, mask=1):
    """A block drafter fitted for a few steps on the target's own samples (so its drafts are
    accepted part of the time)."""
    torch.manual_seed(seed)
    model = make_block(target, kind, mask_token_id=mask)
    with torch.no_grad():
        seqs = target.generate(torch.randint(2, target.config.vocab_size, (16, 4)), max_new_tokens=28, do_sample=True,
                               pad_token_id=0, eos_token_id=None, attention_mask=torch.ones(16, 4, dtype=torch.long))
    opt = torch.optim.AdamW(model.own_parameters(), lr=1e-2)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        with torch.no_grad():
            taps, logits = target_view(target, seqs, model.cfg.aux_layer_ids)
        anchor = anchor_batch(seqs.shape[0], seqs.shape[1], 8, model.cfg.block_size, rng)
        loss = block_loss(model, seqs, taps, logits, anchor)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module")
def blocks6():
    target = _target(V)
    # untrained: on this near-deterministic target they are accepted 70-80 % of the time, both outcomes
    return target, {kind: _trained_block(target, kind, steps=0) for kind in ("dflash", "dspark")}


def _collect(target, model, temperature, top_p, k, seed):
    outs, labels = [], []
    for i in range(N // 20_000):
        g = torch.Generator().manual_seed(seed + i)
        log = run_batch(target, model, [PROMPT] * 20_000, SamplingParams(temperature, top_p, k, 2), eos_id=None,
                        pad_id=0, generator=g)
        outs.append(np.array(log.outputs))
        labels.append(np.concatenate(log.drafts["label"]))
    out = np.concatenate(outs)
    counts = np.zeros((V, V))
    np.add.at(counts, (out[:, 0], out[:, 1]), 1)
    lab = np.concatenate(labels)
    return counts, float((lab[lab >= 0] == 1).mean())


@pytest.mark.parametrize(("kind", "temperature", "top_p"), [("dspark", 1.0, 1.0), ("dspark", 0.7, 0.9),
                                                            ("dflash", 1.0, 1.0)])
def test_block_drafts_keep_the_emitted_pairs_exactly_the_targets(blocks6, kind, temperature, top_p):
    target, models = blocks6
    joint = _joint(target, temperature, top_p)
    counts, acceptance = _collect(target, models[kind], temperature, top_p, k=2, seed=300)
    assert 0.2 < acceptance < 0.95, f"acceptance {acceptance:.3f}: the test needs both outcomes"
    assert _chi2(counts, joint) > 1e-4
    rng = np.random.default_rng(0)
    assert _chi2(rng.multinomial(N, _shifted(joint, 0.015).ravel()), joint) < 1e-4


@torch.inference_mode()
def _block_q(target, model, seq, n, drafts, temperature):
    """q of the drafts from position ``n`` (``seq[n - 1]`` the anchor), from one uncached, unbatched
    block forward; DSpark's slots read the drafts before them as their previous tokens."""
    ids = torch.tensor([seq[:n]])
    taps, _ = target_view(target, ids, model.cfg.aux_layer_ids)
    block = block_forward(model, ids, taps, torch.tensor([[n - 1]]))[0, 0]
    # the published layouts, written out here: DSpark's every slot is a draft (anchored first),
    # DFlash's drafts are the mask slots after the anchor
    h = block if model.cfg.sample_from_anchor else block[1:]
    prev = [seq[n - 1], *drafts[:-1]]
    q = torch.stack([process_probs(model.slot_logits(h[i][None], torch.tensor([prev[i]]))[0], temperature, 1.0)
                     for i in range(len(drafts))])
    if model.confidence_head is None:
        return q, None
    # the confidence head reads the slot's state and the token before it (never the slot's own draft)
    return q, torch.cat([model.confidence(h[i][None], torch.tensor([prev[i]])) for i in range(len(drafts))])


@pytest.mark.parametrize(("kind", "slots"), [("dspark", None), ("dflash", None), ("dspark", 2)])
def test_every_logged_block_draft_equals_an_unbatched_block_forward(kind, slots):
    """Prompts of different lengths (left padding), T = 1 so rows accept different counts, long
    enough that the caches compact and rows leave at different steps; with ``slots=2`` the later
    prompts join the running batch."""
    target = _target(12, seed=4, peak=3.0)
    model = _trained_block(target, kind, steps=30)
    with torch.no_grad():
        _check_logged_drafts(target, model, slots)


def _check_logged_drafts(target, model, slots):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 12, size=n).tolist() for n in (2, 3, 9, 17)]
    K, T = 3, 1.0
    log = run_batch(target, model, prompts, SamplingParams(T, 1.0, K, 60), eos_id=None, pad_id=0,
                    generator=torch.Generator().manual_seed(1), slots=slots)
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    assert (d["label"] == 1).mean() > 0.15 and (d["label"] == 0).any(), "the test needs accepted and rejected drafts"
    # DSpark's confidence head is logged with every draft; DFlash has none, and no column
    assert ("confidence" in d) == (model.confidence_head is not None)
    if "confidence" in d:
        assert d["confidence"].shape == d["q_max"].shape and 0.005 < d["confidence"].std()
    checked = 0
    for r, prompt in enumerate(prompts):
        seq = prompt + log.outputs[r]
        emitted = 0
        for step in np.sort(s["step"][s["request"] == r]):
            n = len(prompt) + emitted  # seq[n - 1] is the pending token: the block's anchor
            rows = (d["request"] == r) & (d["step"] == step)
            x = d["token"][rows]
            emitted += int(s["emitted"][(s["request"] == r) & (s["step"] == step)][0])
            q, conf = _block_q(target, model, seq, n, x.tolist(), T)
            np.testing.assert_allclose(d["q_max"][rows], q.max(-1).values.numpy(), atol=3e-5)
            if conf is not None:
                np.testing.assert_allclose(d["confidence"][rows], conf.numpy(), atol=3e-5)
            np.testing.assert_allclose(d["q_sampled"][rows], q.gather(-1, torch.from_numpy(x)[:, None])[:, 0].numpy(),
                                       atol=3e-5)
            checked += K
    assert checked > 100


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
@torch.inference_mode()
def test_greedy_with_a_block_drafter_equals_the_targets_greedy(tiny_pair, kind):
    target = tiny_pair.target
    torch.manual_seed(0)
    model = make_block(target, kind, mask_token_id=5).eval()
    tok = tiny_pair.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in
               ("def f(x):\n    return", "import os\nimport sys\n\n\ndef main(argv):\n", "class A:\n")]
    log = run_batch(target, model, prompts, SamplingParams(0.0, 1.0, 4, 30), eos_id=None, pad_id=tok.pad_token_id,
                    generator=torch.Generator().manual_seed(0))
    for ids, got in zip(prompts, log.outputs, strict=True):
        seq = list(ids)
        for _ in range(30):
            seq.append(int(target(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        assert got == seq[len(ids):]


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_teacher_forced_block_yields_equal_the_greedy_runs_own_acceptance(kind):
    from svt.collect.cache import teacher_forced_accepted

    target = _target(12, seed=4, peak=3.0)
    model = _trained_block(target, kind, steps=60)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(2, 12, size=n).tolist() for n in (4, 11)]
    K = 4
    log = run_batch(target, model, prompts, SamplingParams(0.0, 1.0, K, 40), eos_id=None, pad_id=0,
                    generator=torch.Generator().manual_seed(0))
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    acc = teacher_forced_accepted(model, list(zip(prompts, log.outputs, strict=True)), K, target=target)
    seen = 0
    for r in range(len(prompts)):
        pos = 0
        for step in np.sort(s["step"][s["request"] == r]):
            here = (s["request"] == r) & (s["step"] == step)
            m = len(log.outputs[r]) - pos
            assert min(int(s["accepted"][here][0]), m - 1) == min(int(acc[r][pos]), m - 1)
            pos += int(s["emitted"][here][0])
            seen += 1
    assert seen > 10 and (s["accepted"] > 0).any() and (s["accepted"] < K).any()
