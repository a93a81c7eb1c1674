"""The engine is lossless where the test has power: a tiny synthetic pair (vocabulary of 6) whose
acceptance is moderate (~0.6), the exact joint distribution of the first two emitted tokens by
enumeration, and a demonstration that the same check rejects a distribution 1.5 % TV away."""

import copy

import numpy as np
import pytest
import torch
from scipy import stats

from svt.collect.engine import LiveAV, SamplingParams, run_batch
from svt.collect.sampling import process_probs

V = 6
PROMPT = [2, 3, 4, 5, 2]
N = 40_000  # rows, in batches of 20,000


@pytest.fixture(scope="module")
def pair():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)  # peaked enough to be a real language-model-like p
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.lm_head.weight.add_(torch.randn_like(draft.lm_head.weight) * 0.25)
    return target, draft


@torch.inference_mode()
def _next(model, seq, temperature, top_p):
    return process_probs(model(input_ids=torch.tensor([seq])).logits[0, -1], temperature, top_p).double().numpy()


def _exact_joint(model, temperature, top_p):
    """P(t1, t2) = p(t1 | prompt) p(t2 | prompt, t1), enumerated over the vocabulary."""
    p1 = _next(model, PROMPT, temperature, top_p)
    return np.stack([p1[a] * _next(model, PROMPT + [a], temperature, top_p) for a in range(V)])


def _chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    counts, probs = counts.ravel().astype(float), probs.ravel() / probs.sum()
    if counts[probs == 0].sum():
        return 0.0
    expected = probs * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return stats.chisquare(obs, exp).pvalue


def _collect(pair, temperature, top_p, k, seed, av=None):
    target, draft = pair
    outs, labels, kept = [], [], []
    for i in range(N // 20_000):
        g = torch.Generator().manual_seed(seed + i)
        log = run_batch(target, draft, [PROMPT] * 20_000, SamplingParams(temperature, top_p, k, 2), eos_id=None,
                        pad_id=0, generator=g, av=av)
        outs.append(np.array(log.outputs))
        labels.append(np.concatenate(log.drafts["label"]))
        kept.append(np.concatenate(log.steps["kept"])[np.concatenate(log.steps["step"]) == 0])
    out = np.concatenate(outs)
    counts = np.zeros((V, V))
    np.add.at(counts, (out[:, 0], out[:, 1]), 1)
    lab = np.concatenate(labels)
    return counts, float((lab[lab >= 0] == 1).mean()), np.concatenate(kept)


def _shifted(joint: np.ndarray, tv: float) -> np.ndarray:
    """The joint with ``tv`` of mass moved from its most likely cell to its second: TV = tv."""
    flat = joint.ravel().copy()
    a, b = np.argsort(-flat)[:2]
    flat[a] -= tv
    flat[b] += tv
    return flat.reshape(joint.shape)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_emitted_pairs_follow_the_target_exactly(pair, temperature, top_p):
    joint = _exact_joint(pair[0], temperature, top_p)
    counts, acceptance, _ = _collect(pair, temperature, top_p, k=2, seed=100)
    assert 0.3 < acceptance < 0.85, f"acceptance {acceptance:.3f}: the test needs both outcomes"
    assert _chi2(counts, joint) > 1e-4
    # power at this sample size: 1.5 % TV away is rejected, and so is the draft's own joint
    rng = np.random.default_rng(0)
    fake = rng.multinomial(N, _shifted(joint, 0.015).ravel())
    assert _chi2(fake, joint) < 1e-4
    assert _chi2(counts, _exact_joint(pair[1], temperature, top_p)) < 1e-12


def test_live_av_trimming_stays_lossless(pair):
    """Trimming on a q-only confidence under an affine (convex) cost table that makes the budget
    rule keep 0, 1, 2 or 3 drafts depending on the confidences: the emitted pairs still follow the
    target exactly."""
    from svt.simulate.costs import CostTable

    costs = CostTable("measured", "autoregressive", "test", {b: {k: 0.01 * k for k in range(1, 5)} for b in (1, 20_000)},
                      {1: 20_000.2, 100_001: 40_000.2})  # 20 s + 0.2 ms per token
    av = LiveAV(confidence=lambda f, pos: np.clip(f["q_max"] * 0.9, 0.01, 0.99), costs=costs)
    counts, acceptance, kept = _collect(pair, 1.0, 1.0, k=3, seed=200, av=av)
    share = np.bincount(kept, minlength=4) / kept.size
    assert (share > 0.05).sum() >= 2 and share[3] < 0.95, f"the test needs varied trimming: {share}"
    assert 0.3 < acceptance < 0.9
    assert _chi2(counts, _exact_joint(pair[0], 1.0, 1.0)) > 1e-4
