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
    seq = torch.tensor([ids + out], device=model.device)
    logits = model(input_ids=seq).logits[0, len(ids) - 1 : len(ids) - 1 + len(out)]
    return process_probs(logits, temperature, top_p).cpu()


def assert_logged_features_match_fresh_forwards(target, draft, tok, temperature, top_p, generator, tol=2e-5,
                                                 slots=None):
    """Collect the padded batch of PROMPTS; p_sampled, q_sampled and q_max of every labelled draft
    must equal an unbatched forward on its prefix (on the models' device). Returns drafts checked."""
    prompts = _ids(tok, PROMPTS)
    K = 3
    log = run_batch(target, draft, prompts, SamplingParams(temperature, top_p, K, 30),
                    eos_id=None, pad_id=tok.pad_token_id, generator=generator, slots=slots)
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
        p_all = _fresh_probs(target, ids, out, temperature, top_p)
        q_all = _fresh_probs(draft, ids, out, temperature, top_p)
        rows = np.flatnonzero((d["request"] == r) & (d["label"] >= 0))
        for i in rows:
            j = base[int(d["step"][i])] + int(d["position"][i])
            if j >= len(out):
                continue  # beyond max_new_tokens: the prefix was cut
            x = int(d["token"][i])
            if d["label"][i] == 1:
                assert out[j] == x
            assert d["p_sampled"][i] == pytest.approx(p_all[j, x].item(), abs=tol)
            assert d["q_sampled"][i] == pytest.approx(q_all[j, x].item(), abs=tol)
            assert d["q_max"][i] == pytest.approx(q_all[j].max().item(), abs=tol)
            checked += 1
    return checked


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logged_features_match_fresh_forwards(tiny_pair, temperature, top_p):
    """p_sampled, q_sampled and q_max of every labelled draft equal an unbatched forward on its
    prefix: the caches (holes, positions, the draft's missed token) are exact."""
    g = torch.Generator().manual_seed(1)
    checked = assert_logged_features_match_fresh_forwards(tiny_pair.target, tiny_pair.draft, tiny_pair.tokenizer,
                                                          temperature, top_p, g)
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


def test_hidden_and_dists_are_aligned(tiny_pair):
    """Each logged hidden state is the drafter's last layer at the position that drafted the row
    (checked against a fresh forward), and each dists row belongs to its draft row (its top q
    probability is the row's q_max, its token the row's token)."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS[:2])
    g = torch.Generator().manual_seed(3)
    K = 4
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(1.0, 1.0, K, 20),
                    eos_id=None, pad_id=tok.pad_token_id, generator=g,
                    log=LogOptions(hidden=True, dists_fraction=0.5, dists_top_k=8))
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    n = d["token"].size
    hidden = np.concatenate(log.hidden)
    assert hidden.shape == (n, tiny_pair.draft.config.hidden_size)
    dd = {k: np.concatenate(v) for k, v in log.dists.items()}
    assert 0 < len(dd["token"]) < n
    assert (np.diff(dd["q_top_probs"], axis=1) <= 0).all()
    np.testing.assert_allclose(dd["q_top_probs"].sum(1) + dd["q_tail"], 1.0, atol=1e-5)
    row_of = {(int(r), int(s_), int(p)): i for i, (r, s_, p) in enumerate(zip(d["request"], d["step"], d["position"],
                                                                             strict=True))}
    for j in range(len(dd["token"])):
        i = row_of[(int(dd["request"][j]), int(dd["step"][j]), int(dd["position"][j]))]
        assert dd["token"][j] == d["token"][i]
        assert dd["q_top_probs"][j, 0] == pytest.approx(d["q_max"][i], abs=1e-6)
    # hidden states: the draft's last layer on the prefix that drafted the row (first steps of row 0)
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    out, ids = log.outputs[0], prompts[0]
    start, checked = 0, 0
    for step, emitted in zip(s["step"][s["request"] == 0], s["emitted"][s["request"] == 0], strict=True):
        rows = np.flatnonzero((d["request"] == 0) & (d["step"] == step))
        seq = ids + out[:start]
        for i in rows:  # draft i was proposed after seq + the drafts before it
            prefix = seq + [int(t) for t in d["token"][rows[: int(d["position"][i])]]]
            with torch.inference_mode():
                o = tiny_pair.draft(input_ids=torch.tensor([prefix]), output_hidden_states=True)
            np.testing.assert_allclose(hidden[i], o.hidden_states[-1][0, -1].numpy(), atol=2e-2, rtol=2e-2)
            checked += 1
        start += int(emitted)
        if step >= 2:
            break
    assert checked >= 3 * K


def test_eos_stops_a_row_and_keeps_the_eos_token(tiny_pair):
    tok = tiny_pair.tokenizer
    ids = _ids(tok, PROMPTS[:1])[0]
    full = _plain_greedy(tiny_pair.target, ids, 30)
    eos = full[6]
    first = full.index(eos)
    g = torch.Generator().manual_seed(0)
    log = run_batch(tiny_pair.target, tiny_pair.draft, [ids], SamplingParams(0.0, 1.0, 4, 30), eos_id=eos,
                    pad_id=tok.pad_token_id, generator=g)
    assert log.outputs[0] == full[: first + 1] and log.finish == ["stop"]
    log = run_batch(tiny_pair.target, tiny_pair.draft, [ids], SamplingParams(0.0, 1.0, 4, 30), eos_id=None,
                    pad_id=tok.pad_token_id, generator=g)
    assert log.outputs[0] == full and log.finish == ["length"]


def test_prompts_keep_their_last_tokens_and_chats_their_plain_rendering(tiny_pair):
    from svt.collect.chat import Message
    from svt.collect.encode import encode_prompt
    from svt.collect.workloads import Prompt

    tok = tiny_pair.tokenizer
    text = PROMPTS[2]
    full = tok.encode(text, add_special_tokens=False)
    assert encode_prompt(Prompt("w", text, None), tok, 5) == full[-5:]
    msgs = (Message("system", "Be brief."), Message("user", "x = 1"))
    plain = encode_prompt(Prompt("w", None, msgs), tok, 512)  # no template: svt's plain rendering
    assert plain == tok.encode("### system\nBe brief.\n### user\nx = 1\n### assistant\n", add_special_tokens=False)
    # the real templates (tests/collect/fixtures/templates) are tested in test_chat_templates.py


def test_each_step_times_the_forwards_it_ran(tiny_pair, monkeypatch):
    """``forward_ms`` is the time inside that step's own model forwards: with every forward made
    SLOW ms slower, each step's forward_ms grows by SLOW x its forwards (K draft passes and one verify;
    none from another step or from a prefill), and its work outside them (step - forward) does not."""
    import time

    import svt.collect.engine as E

    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS[:3])
    K, SLOW = 3, 20.0  # ms: well above what a busy host adds to a step (a few ms), so the extra stands out

    def run():
        log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(1.0, 1.0, K, 12), eos_id=None,
                        pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), slots=2)
        return {c: np.concatenate(v) for c, v in log.schedule.items()}

    fast = run()
    assert (fast["forward_ms"] > 0).all() and (fast["forward_ms"] <= fast["step_ms"]).all()
    real = E._Cache.forward

    def slow(self, *a, **kw):
        out = real(self, *a, **kw)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < SLOW / 1e3:
            pass
        self.forward_s += SLOW / 1e3
        return out

    monkeypatch.setattr(E._Cache, "forward", slow)
    slowed = run()
    assert np.array_equal(slowed["batch_size"], fast["batch_size"])  # the same steps
    extra = slowed["forward_ms"] - fast["forward_ms"]
    # a draft model's K passes + the target's verify: (K + 1) forwards a step, each SLOW ms dearer
    assert np.median(extra) == pytest.approx((K + 1) * SLOW, rel=0.2)
    # (the median, not every step: two runs' steps differ by the host's noise, and a busy host, e.g. a
    # parallel test worker, stalls a few steps of either run by hundreds of ms; a forward time accumulated
    # across steps or prefills grows the extra step after step, which moves the median far past the bound)
    outside = np.median(slowed["step_ms"] - slowed["forward_ms"]), np.median(fast["step_ms"] - fast["forward_ms"])
    assert abs(outside[0] - outside[1]) < SLOW


def test_each_step_logs_the_cache_width_its_verify_attended(tiny_pair):
    """``verify_slots`` is the target cache's width at the verify forward: a static batch that never
    compacts starts at the longest prompt (all but its last token, which is the first step's y) and
    every step appends K + 1 slots to every row, whoever finished; with compaction on, the width
    falls back whenever the holes are dropped, and never under a row's live tokens."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS[:3])
    K = 3

    def sched(compact):
        log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(1.0, 1.0, K, 40), eos_id=None,
                        pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), compact=compact)
        return {c: np.concatenate(v) for c, v in log.schedule.items()}

    s = sched(False)
    start = max(len(p) for p in prompts) - 1
    assert s["verify_slots"].tolist() == [start + (t + 1) * (K + 1) for t in range(len(s["tick"]))]
    c = sched(True)
    assert (np.diff(c["verify_slots"]) < 0).any()  # compacted at least once in 40 tokens
    assert (c["verify_slots"] <= start + np.arange(1, len(c["tick"]) + 1) * (K + 1)).all()
    assert (c["verify_slots"] * c["batch_size"] >= c["verify_tokens"]).all()
