"""The batched engine against references: plain greedy decoding, fresh unbatched forwards, and the
target's own sampling distribution (statistical tests with fixed seeds)."""

import numpy as np
import pytest
import torch
from scipy import stats

from svt.collect.engine import LogOptions, SamplingParams, run_batch
from svt.collect.sampling import process_probs

PROMPTS = [
    "def read_config(path):\n    with open(path) as f:\n",
    "import os\n",
    "class Point:\n    \"\"\"A point in the plane.\"\"\"\n\n    def __init__(self, x, y):\n        self.x = x\n",
    "# Copyright 2001 by the Python Software Foundation.\n# All rights reserved.\n\n__all__ = [",
]


def _ids(tok, texts):
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@torch.inference_mode()
def _plain_greedy(model, ids, n):
    seq = list(ids)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        seq.append(int(logits.argmax()))
    return seq[len(ids):]


def test_greedy_equals_target_greedy_token_for_token(tiny_pair):
    """A batch of prompts of different lengths; rows leave the batch at different steps."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS)
    assert len({len(p) for p in prompts}) == len(prompts)
    g = torch.Generator().manual_seed(0)
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, 4, 40),
                    eos_id=None, pad_id=tok.pad_token_id, generator=g)
    for ids, got in zip(prompts, log.outputs, strict=True):
        assert got == _plain_greedy(tiny_pair.target, ids, 40)


@torch.inference_mode()
def _fresh_probs(model, ids, out, temperature, top_p):
    """Processed distributions for every output position from one uncached, unbatched forward."""
    seq = torch.tensor([ids + out])
    logits = model(input_ids=seq).logits[0, len(ids) - 1 : len(ids) - 1 + len(out)]
    return process_probs(logits, temperature, top_p)


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logged_features_match_fresh_forwards(tiny_pair, temperature, top_p):
    """p_sampled, q_sampled and q_max of every labelled draft equal an unbatched forward on its
    prefix: the caches (holes, positions, the draft's missed token) are exact."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS)
    g = torch.Generator().manual_seed(1)
    K = 3
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(temperature, top_p, K, 30),
                    eos_id=None, pad_id=tok.pad_token_id, generator=g)
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    checked = 0
    for r, ids in enumerate(prompts):
        out = log.outputs[r]
        assert len(out) == 30
        base = {}
        pos = 0
        mine = s["request"] == r
        for step, emitted in zip(s["step"][mine], s["emitted"][mine], strict=True):
            base[int(step)] = pos
            pos += int(emitted)
        p_all = _fresh_probs(tiny_pair.target, ids, out, temperature, top_p)
        q_all = _fresh_probs(tiny_pair.draft, ids, out, temperature, top_p)
        rows = np.flatnonzero((d["request"] == r) & (d["label"] >= 0))
        for i in rows:
            j = base[int(d["step"][i])] + int(d["position"][i])
            if j >= len(out):
                continue  # beyond max_new_tokens: the prefix was cut
            x = int(d["token"][i])
            if d["label"][i] == 1:
                assert out[j] == x
            assert d["p_sampled"][i] == pytest.approx(p_all[j, x].item(), abs=2e-5)
            assert d["q_sampled"][i] == pytest.approx(q_all[j, x].item(), abs=2e-5)
            assert d["q_max"][i] == pytest.approx(q_all[j].max().item(), abs=2e-5)
            checked += 1
    assert checked > 40


def _next_probs(model, seq, temperature=1.0, top_p=1.0):
    """The processed next-token distribution after ``seq`` (no cache, batch of one)."""
    # _fresh_probs(ids, out)[j] predicts out[j]: append a placeholder to read the one after seq
    return _fresh_probs(model, seq, [0], temperature, top_p)[0].numpy()


def _chi2(samples, probs):
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    counts = np.bincount(samples, minlength=len(probs)).astype(float)
    if counts[probs == 0].sum() > 0:
        return 0.0  # a token the hypothesis gives probability 0 was emitted
    expected = probs * len(samples)
    big = expected >= 5  # merge rare tokens into one bin
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    if len(exp) == 1:  # a point mass: every sample hit it (checked above), nothing left to test
        return 1.0
    return stats.chisquare(obs, exp).pvalue


N_ROWS = 3000


@pytest.fixture(scope="module")
def lossless_prompt(tiny_pair):
    """The candidate prompt where target and draft disagree most (so the test has power)."""
    tok = tiny_pair.tokenizer
    best = None
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False)
        p = _next_probs(tiny_pair.target, ids)
        q = _next_probs(tiny_pair.draft, ids)
        tv = 0.5 * np.abs(p - q).sum()
        if best is None or tv > best[0]:
            best = (tv, ids)
    assert best[0] > 0.1, "target and draft too close for a powerful test"
    return best[1]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_emitted_tokens_follow_the_target_distribution(tiny_pair, lossless_prompt, temperature, top_p):
    """3,000 rows of one prompt, K = 2, 3 new tokens: token 1 ~ p(.|prompt); token 2 ~ p(.|prompt, t1)
    for the most frequent t1; token 3 likewise after the most frequent (t1, t2). Chi-square, with the
    draft's own distribution as a negative control the same check must reject."""
    tok = tiny_pair.tokenizer
    ids = lossless_prompt
    g = torch.Generator().manual_seed(7)
    log = run_batch(tiny_pair.target, tiny_pair.draft, [ids] * N_ROWS,
                    SamplingParams(temperature, top_p, 2, 3), eos_id=None, pad_id=tok.pad_token_id,
                    generator=g)
    out = np.array(log.outputs)
    assert out.shape == (N_ROWS, 3)
    prefix: list[int] = []
    mask = np.ones(N_ROWS, dtype=bool)
    for t in range(3):
        p = _next_probs(tiny_pair.target, ids + prefix, temperature, top_p)
        sample = out[mask, t]
        assert len(sample) >= 300
        pval = _chi2(sample, p)
        assert pval > 1e-4, f"token {t + 1}: p-value {pval:.2e}"
        if t == 0:
            q = _next_probs(tiny_pair.draft, ids, temperature, top_p)
            assert _chi2(sample, q) < 1e-6, "negative control: the draft's distribution must be rejected"
        mode = np.bincount(sample).argmax()
        prefix.append(int(mode))
        mask &= out[:, t] == mode


def test_hidden_and_dists_are_aligned(tiny_pair):
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS[:2])
    g = torch.Generator().manual_seed(3)
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(1.0, 1.0, 4, 20),
                    eos_id=None, pad_id=tok.pad_token_id, generator=g,
                    log=LogOptions(hidden=True, dists_fraction=0.5, dists_top_k=8))
    n = sum(len(a) for a in log.drafts["token"])
    hidden = np.concatenate(log.hidden)
    assert hidden.shape == (n, tiny_pair.draft.config.hidden_size)
    assert np.isfinite(hidden).all()
    d = {k: np.concatenate(v) for k, v in log.dists.items()}
    assert 0 < len(d["token"]) < n
    assert d["q_top_ids"].shape[1] == 8
    assert (np.diff(d["q_top_probs"], axis=1) <= 0).all()
    np.testing.assert_allclose(d["q_top_probs"].sum(1) + d["q_tail"], 1.0, atol=1e-5)


def _steep_costs():
    """Verification costly per token, drafting cheap: the AV rule trims often."""
    from svt.simulate.costs import CostTable

    return CostTable("measured", "autoregressive", "test",
                     {b: {k: 0.01 * k for k in range(1, 9)} for b in (1, 64, 4096)},
                     {1: 1.0, 10_000: 10_000.0})


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_live_av_trimming_stays_lossless(tiny_pair, lossless_prompt, temperature, top_p):
    """Live AV trims on a q-only confidence: the emitted tokens still follow the target."""
    from svt.collect.engine import LiveAV

    tok = tiny_pair.tokenizer
    ids = lossless_prompt
    av = LiveAV(confidence=lambda f, pos: np.clip(f["q_max"] * 0.9, 0.01, 0.99), costs=_steep_costs())
    g = torch.Generator().manual_seed(11)
    log = run_batch(tiny_pair.target, tiny_pair.draft, [ids] * N_ROWS, SamplingParams(temperature, top_p, 3, 2),
                    eos_id=None, pad_id=tok.pad_token_id, generator=g, av=av)
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    first = s["step"] == 0
    assert (s["kept"][first] < 3).mean() > 0.3, "the test needs trimming to happen"
    out = np.array(log.outputs)
    p = _next_probs(tiny_pair.target, ids, temperature, top_p)
    assert _chi2(out[:, 0], p) > 1e-4
    mode = np.bincount(out[:, 0]).argmax()
    p2 = _next_probs(tiny_pair.target, ids + [int(mode)], temperature, top_p)
    assert _chi2(out[out[:, 0] == mode, 1], p2) > 1e-4
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    kept_per_row = np.repeat(s["kept"], 3)
    assert (d["label"][d["position"] >= kept_per_row] == -1).all()  # trimmed drafts carry no label
