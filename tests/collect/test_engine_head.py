"""svt's engine drafting with an EAGLE-3 head: lossless (exact enumeration and chi-square, full and
reduced draft vocabulary), greedy equal to the target's greedy decoding, and every logged draft
distribution equal to the head's unbatched training-time-test unroll on the same tokens (which
checks the catch-up slots, the holes, compaction and row removal)."""

import numpy as np
import pytest
import torch

from svt.collect.engine import SamplingParams, run_batch
from svt.collect.sampling import process_probs
from svt.models.train_eagle3 import make_head, make_mtp_head, target_view
from tests.collect.test_engine_lossless import _chi2, _shifted
from tests.models.test_eagle3 import reduced_head

V = 6
PROMPT = [2, 3, 4, 5, 2]
N = 40_000


def _target(vocab, seed=0, peak=8.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(peak)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def _head(target, seed=1, scale=0.25, keep=None, kind="eagle3"):
    head = make_head(target) if kind == "eagle3" else make_mtp_head(target)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)
    return head.eval() if keep is None else reduced_head(target, keep, full=head)


def _trained_head(target, steps=80, seed=6):
    """A head fitted for a few steps by training-time test on the target's own samples (so its
    greedy drafts agree with the target part of the time)."""
    from svt.models.train_eagle3 import ttt_loss

    torch.manual_seed(seed)
    head = make_head(target)
    with torch.no_grad():
        seqs = target.generate(torch.randint(2, target.config.vocab_size, (16, 4)), max_new_tokens=28, do_sample=True,
                               pad_token_id=0, eos_token_id=None, attention_mask=torch.ones(16, 4, dtype=torch.long))
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        with torch.no_grad():
            taps, logits = target_view(target, seqs, head.cfg.aux_layer_ids)
        loss = ttt_loss(head, seqs, taps, logits, 4, 0.8)[0]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module")
def pair6():
    target = _target(V)
    return target, _head(target)


@torch.inference_mode()
def _joint(target, temperature, top_p):
    def nxt(seq):
        return process_probs(target(input_ids=torch.tensor([seq])).logits[0, -1], temperature, top_p).double().numpy()

    p1 = nxt(PROMPT)
    return np.stack([p1[a] * nxt(PROMPT + [a]) for a in range(V)])


def _collect(target, head, temperature, top_p, k, seed):
    outs, labels = [], []
    for i in range(N // 20_000):
        g = torch.Generator().manual_seed(seed + i)
        log = run_batch(target, head, [PROMPT] * 20_000, SamplingParams(temperature, top_p, k, 2), eos_id=None,
                        pad_id=0, generator=g)
        outs.append(np.array(log.outputs))
        labels.append(np.concatenate(log.drafts["label"]))
    out = np.concatenate(outs)
    counts = np.zeros((V, V))
    np.add.at(counts, (out[:, 0], out[:, 1]), 1)
    lab = np.concatenate(labels)
    return counts, float((lab[lab >= 0] == 1).mean())


def _ttt_q(target, head, seq, chain, k, temperature, top_p):
    """q of steps 0..k-1 of the chain starting at ``chain``, from one uncached unbatched unroll."""
    ids = torch.tensor([seq])
    taps, _ = target_view(target, ids, head.cfg.aux_layer_ids)
    outs = head.ttt(ids, head.fuse(taps), k)
    return torch.stack([process_probs(o.logits[0, chain], temperature, top_p) for o in outs])


@pytest.mark.parametrize(("kind", "slots"), [("eagle3", None), ("mtp", None), ("eagle3", 2)])
@torch.inference_mode()
def test_every_logged_draft_equals_the_heads_unbatched_unroll(kind, slots):
    """Prompts of different lengths (left padding), T = 1 so rows accept different counts, long
    enough that both caches compact and rows leave at different steps; with ``slots=2`` (continuous
    batching) the later prompts join the running batch: their caches and catch-up slots are joined."""
    target = _target(12, seed=4, peak=3.0)
    head = _head(target, seed=5, scale=0.15, kind=kind)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 12, size=n).tolist() for n in (1, 3, 9, 17)]
    K, T = 3, 1.0
    log = run_batch(target, head, prompts, SamplingParams(T, 1.0, K, 60), eos_id=None, pad_id=0,
                    generator=torch.Generator().manual_seed(1), slots=slots)
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    labels = d["label"]
    assert (labels == 1).mean() > 0.2 and (labels == 0).any(), "the test needs accepted and rejected drafts"
    assert len({int((s["request"] == r).sum()) for r in range(len(prompts))}) > 1, "rows leave at different steps"
    checked = 0
    for r, prompt in enumerate(prompts):
        seq = prompt + log.outputs[r]
        emitted = 0
        for step in np.sort(s["step"][s["request"] == r]):
            n = len(prompt) + emitted  # tokens before the pending one's successor: seq[n - 1] is pending
            rows = (d["request"] == r) & (d["step"] == step)
            x = d["token"][rows]
            emitted += int(s["emitted"][(s["request"] == r) & (s["step"] == step)][0])
            if n < 2:
                continue  # a one-token prompt's first draft reads a zero feature
            q = _ttt_q(target, head, seq[:n] + x[: K - 1].tolist(), n - 2, K, T, 1.0)
            np.testing.assert_allclose(d["q_max"][rows], q.max(-1).values.numpy(), atol=2e-5)
            np.testing.assert_allclose(d["q_sampled"][rows], q.gather(-1, torch.from_numpy(x)[:, None])[:, 0].numpy(),
                                       atol=2e-5)
            checked += K
    assert checked > 100


@torch.inference_mode()
def test_greedy_with_a_head_equals_the_targets_greedy(tiny_pair):
    target = tiny_pair.target
    head = _head(target, scale=0.02)
    tok = tiny_pair.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in
               ("def f(x):\n    return", "import os\nimport sys\n\n\ndef main(argv):\n", "class A:\n")]
    log = run_batch(target, head, prompts, SamplingParams(0.0, 1.0, 4, 30), eos_id=None, pad_id=tok.pad_token_id,
                    generator=torch.Generator().manual_seed(0))
    for ids, got in zip(prompts, log.outputs, strict=True):
        seq = list(ids)
        for _ in range(30):
            seq.append(int(target(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
        assert got == seq[len(ids):]


def test_teacher_forced_head_yields_equal_the_greedy_runs_own_acceptance():
    """On a greedy run, the head's accepted count at each step is what the teacher-forced unroll
    says for that step's decode position (the HVD replay's model yields)."""
    from svt.collect.cache import teacher_forced_accepted

    target = _target(12, seed=4, peak=3.0)
    head = _trained_head(target)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(2, 12, size=n).tolist() for n in (4, 11)]
    K = 4
    log = run_batch(target, head, prompts, SamplingParams(0.0, 1.0, K, 40), eos_id=None, pad_id=0,
                    generator=torch.Generator().manual_seed(0))
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    acc = teacher_forced_accepted(head, list(zip(prompts, log.outputs, strict=True)), K, target=target)
    seen = 0
    for r in range(len(prompts)):
        pos = 0
        for step in np.sort(s["step"][s["request"] == r]):
            here = (s["request"] == r) & (s["step"] == step)
            m = len(log.outputs[r]) - pos  # tokens left: the run is cut by max_new_tokens
            assert min(int(s["accepted"][here][0]), m - 1) == min(int(acc[r][pos]), m - 1)
            pos += int(s["emitted"][here][0])
            seen += 1
    assert seen > 10 and (s["accepted"] > 0).any() and (s["accepted"] < K).any()


@pytest.mark.parametrize(("temperature", "top_p", "keep", "kind"), [
    (1.0, 1.0, None, "eagle3"), (0.7, 0.9, [0, 2, 3, 5], "eagle3"), (1.0, 1.0, None, "mtp")])
def test_head_drafts_keep_the_emitted_pairs_exactly_the_targets(pair6, temperature, top_p, keep, kind):
    target = pair6[0]
    head = pair6[1] if keep is None and kind == "eagle3" else _head(target, keep=keep, kind=kind)
    joint = _joint(target, temperature, top_p)
    counts, acceptance = _collect(target, head, temperature, top_p, k=2, seed=300)
    assert 0.25 < acceptance < 0.9, f"acceptance {acceptance:.3f}: the test needs both outcomes"
    assert _chi2(counts, joint) > 1e-4
    rng = np.random.default_rng(0)
    assert _chi2(rng.multinomial(N, _shifted(joint, 0.015).ravel()), joint) < 1e-4


def test_a_reduced_vocabulary_head_never_drafts_outside_it(pair6):
    target = pair6[0]
    head = _head(target, keep=[0, 2, 3, 5])
    log = run_batch(target, head, [PROMPT] * 200, SamplingParams(1.0, 1.0, 3, 6), eos_id=None, pad_id=0,
                    generator=torch.Generator().manual_seed(0))
    assert set(np.concatenate(log.drafts["token"]).tolist()) <= {0, 2, 3, 5}
