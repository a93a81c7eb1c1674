"""Verification of variable length: when live AV keeps fewer drafts in some rows, the target forward
computes only each row's pending token and kept drafts (rows padded to the longest kept row, the
padding masked), greedy output stays the target's greedy decoding, every verified draft's logged
target probability is a fresh forward's, and the trimmed drafts' target columns are null."""

import numpy as np
import pytest
import torch

from svt.collect import engine as eng
from svt.collect.engine import LiveAV, SamplingParams, run_batch
from svt.simulate.costs import CostTable
from tests.collect.test_engine import PROMPTS, _fresh_probs, _ids, _plain_greedy
from tests.collect.test_engine_lossless import pair as pair  # noqa: F401  (the module fixture)

# verification is expensive per token, drafting cheap: the budget keeps 0..K drafts by confidence
COSTS = CostTable("measured", "autoregressive", "test", {b: {k: 0.01 * k for k in range(1, 5)} for b in (1, 64)},
                  {1: 1.0, 400: 60.0})


def _av():
    return LiveAV(confidence=lambda f, pos: np.clip(f["q_max"] * 0.95, 0.01, 0.99), costs=COSTS)


@pytest.fixture
def forwards(monkeypatch):
    """(rows, width, real positions) of every forward of the target outside prefills: its verify
    forwards, one per step."""
    seen, state = [], {"prefill": False}
    real, real_prefill = eng._Cache.forward, eng.prefill_rows

    def counting(self, ids, new_mask, hidden=False, **extra):
        if getattr(self.model, "_svt_is_target", False) and not state["prefill"]:
            seen.append((ids.shape[0], ids.shape[1], int(new_mask.sum())))
        return real(self, ids, new_mask, hidden=hidden, **extra)

    def prefill(*a, **kw):
        state["prefill"] = True
        try:
            return real_prefill(*a, **kw)
        finally:
            state["prefill"] = False

    monkeypatch.setattr(eng._Cache, "forward", counting)
    monkeypatch.setattr(eng, "prefill_rows", prefill)
    return seen


@pytest.mark.parametrize("slots", [None, 2])
def test_the_target_computes_only_the_kept_positions_and_greedy_is_unchanged(tiny_pair, forwards, slots):
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS)
    K = 4
    tiny_pair.target._svt_is_target = True
    try:
        log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, K, 30), eos_id=None,
                        pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), av=_av(), slots=slots)
    finally:
        del tiny_pair.target._svt_is_target
    for ids, got in zip(prompts, log.outputs, strict=True):
        assert got == _plain_greedy(tiny_pair.target, ids, 30)
    steps = {k: np.concatenate(v) for k, v in log.steps.items()}
    sched = {k: np.concatenate(v) for k, v in log.schedule.items()}
    verify_fw = forwards
    assert len(verify_fw) == sched["tick"].size
    # one verify forward per step: width = longest kept + 1, real positions = sum of (kept + 1)
    by_tick = {}
    for t, kept in zip(steps["step"], steps["kept"], strict=True):
        by_tick.setdefault(int(t), []).append(int(kept))
    kept_per_tick = [by_tick[int(t)] for t in sched["tick"]]
    shares = np.bincount(steps["kept"], minlength=K + 1)
    assert (shares > 0).sum() >= 3, f"the test needs varied trimming: {shares}"
    widths = [(len(k), max(k) + 1, sum(x + 1 for x in k)) for k in kept_per_tick]
    assert [(n, w, real) for n, w, real in verify_fw] == widths
    assert (sched["verify_tokens"] == [n * w for n, w, _ in widths]).all()
    assert sum(real for *_, real in widths) < sum(n * (K + 1) for n, *_ in widths)


def test_verified_drafts_log_the_targets_probability_and_trimmed_ones_null(tiny_pair):
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS[:2])
    K = 4
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(1.0, 1.0, K, 24), eos_id=None,
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(3), av=_av())
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    s = {k: np.concatenate(v) for k, v in log.steps.items()}
    kept_of = {(int(r), int(t)): int(k) for r, t, k in zip(s["request"], s["step"], s["kept"], strict=True)}
    trimmed = np.array([p >= kept_of[(int(r), int(t))] for r, t, p in zip(d["request"], d["step"], d["position"],
                                                                           strict=True)])
    assert trimmed.any() and (~trimmed).any()
    for col in eng.P_COLUMNS:
        assert np.isnan(d[col][trimmed]).all() and not np.isnan(d[col][~trimmed]).any()
    assert (d["label"][trimmed] == -1).all()
    # each verified draft's p_sampled is an unbatched forward's on its prefix
    checked = 0
    for r, ids in enumerate(prompts):
        out, base, pos = log.outputs[r], {}, 0
        for t, e in zip(s["step"][s["request"] == r], s["emitted"][s["request"] == r], strict=True):
            base[int(t)] = pos
            pos += int(e)
        p_all = _fresh_probs(tiny_pair.target, ids, out, 1.0, 1.0)
        for i in np.flatnonzero((d["request"] == r) & ~trimmed & (d["label"] >= 0)):  # prefix = the output
            j = base[int(d["step"][i])] + int(d["position"][i])
            if j < len(out):
                assert d["p_sampled"][i] == pytest.approx(p_all[j, int(d["token"][i])].item(), abs=2e-5)
                checked += 1
    assert checked > 10


def test_av_length_decides_as_the_replay_does_position_by_position():
    """Step.go_on, asked after each drafted position, gives the replay's draft_lengths for the same
    confidences, next-position means and sharing."""
    from svt.collect.draft_length import LengthPolicy
    from svt.simulate.av import draft_lengths

    rng = np.random.default_rng(0)
    n, K = 6, 5
    costs = CostTable("measured", "autoregressive", "t", {b: {k: 0.3 * k for k in range(1, 6)} for b in (1, 8)},
                      {1: 1.0, 8: 1.4, 64: 6.0})
    for trial in range(20):
        M = rng.uniform(0.05, 0.99, (n, K))
        av = LiveAV(confidence=lambda f, pos, M=M: M[np.arange(n)[:, None], pos], costs=costs, length=True)
        policy = LengthPolicy(av)
        next_conf = rng.uniform(0.2, 0.95, K)
        policy.sum, policy.count = next_conf * 10, np.full(K, 10.0)
        sharing = rng.integers(1, n + 1, K).astype(float) if trial % 2 else None
        if sharing is not None:
            policy.sharing[n] = sharing
        step = policy.start(n, K)
        q = torch.full((n, 7), 1 / 7)
        i = 0
        while i < K - 1 and step.go_on(i, q):
            i += 1
        np.testing.assert_array_equal(step.lengths, draft_lengths(M, costs, next_conf, sharing))


@pytest.mark.parametrize("slots", [None, 2])
def test_av_length_drafts_fewer_passes_and_greedy_is_unchanged(tiny_pair, slots):
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS)
    K = 4
    av = LiveAV(confidence=lambda f, pos: np.clip(f["q_max"] * 0.95, 0.01, 0.99), costs=COSTS, length=True)
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, K, 30), eos_id=None,
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), av=av, slots=slots)
    for ids, got in zip(prompts, log.outputs, strict=True):
        assert got == _plain_greedy(tiny_pair.target, ids, 30)
    steps = {k: np.concatenate(v) for k, v in log.steps.items()}
    d = {k: np.concatenate(v) for k, v in log.drafts.items()}
    assert (steps["drafted"] < K).any() and (steps["kept"] <= steps["drafted"]).all()
    sched = {k: np.concatenate(v) for k, v in log.schedule.items()}
    longest = {}
    for t, n in zip(steps["step"], steps["drafted"], strict=True):
        longest[int(t)] = max(longest.get(int(t), 0), int(n))
    assert sched["draft_passes"].tolist() == [longest[int(t)] for t in sched["tick"]]  # the pass stops with the last row
    # one drafts row per proposed draft: a row's positions are 0 .. drafted - 1
    per = {}
    for r, t, pos in zip(d["request"], d["step"], d["position"], strict=True):
        per.setdefault((int(r), int(t)), []).append(int(pos))
    for r, t, n in zip(steps["request"], steps["step"], steps["drafted"], strict=True):
        assert sorted(per.get((int(r), int(t)), [])) == list(range(int(n)))
    # the budget chose among the drafted positions alone: the replay's AV+length rule on the logged q
    from svt.simulate.av import av_keep

    if slots is None:  # one static batch: a step's rows are the engine step's
        for t in np.unique(steps["step"]):
            rows = np.flatnonzero(steps["step"] == t)
            full = np.zeros((rows.size, K))
            for j, i in enumerate(rows):
                m = (d["request"] == steps["request"][i]) & (d["step"] == t)
                full[j, d["position"][m]] = np.clip(d["q_max"][m].astype(np.float32) * 0.95, 0.01, 0.99)
            want = np.minimum(av_keep(full, COSTS, "convex"), steps["drafted"][rows])
            np.testing.assert_array_equal(steps["kept"][rows], want)


def test_av_length_stays_lossless(pair):  # noqa: F811
    """The first two tokens of 40,000 rows under AV+length (rows stopping at 1..3 drafts by their
    own q): chi-square against the exact joint."""
    from tests.collect.test_engine_lossless import PROMPT, N, V, _chi2, _exact_joint

    costs = CostTable("measured", "autoregressive", "test", {b: {k: 0.01 * k for k in range(1, 5)} for b in (1, 20_000)},
                      {1: 20_000.2, 100_001: 40_000.2})
    outs, drafted = [], []
    for i in range(N // 20_000):
        av = LiveAV(confidence=lambda f, pos: np.clip(f["q_max"] * 0.9, 0.01, 0.99), costs=costs, length=True)
        log = run_batch(pair[0], pair[1], [PROMPT] * 20_000, SamplingParams(1.0, 1.0, 3, 2), eos_id=None, pad_id=0,
                        generator=torch.Generator().manual_seed(400 + i), av=av)
        outs.append(np.array(log.outputs))
        drafted.append(np.concatenate(log.steps["drafted"]))
    share = np.bincount(np.concatenate(drafted), minlength=4) / np.concatenate(drafted).size
    assert (share > 0.05).sum() >= 2, f"the test needs varied lengths: {share}"
    out = np.concatenate(outs)
    counts = np.zeros((V, V))
    np.add.at(counts, (out[:, 0], out[:, 1]), 1)
    assert _chi2(counts, _exact_joint(pair[0], 1.0, 1.0)) > 1e-4


def test_a_run_whose_rows_all_stop_short_of_k_is_read_only_under_av_length(tmp_path):
    """AV+length may stop every row before K in every step (the drafts' last position < K - 1); in
    any other run of svt's engine that is a damaged or mismatched drafts table."""
    from svt.errors import SchemaError
    from svt.traces.io import check_top_position

    meta = {"k": 3, "config": {}, "engine": "svt", "av": {"fit": "f.json", "length": False}}
    with pytest.raises(SchemaError, match="the drafts stop at position 1"):
        check_top_position(tmp_path, meta, 1)
    check_top_position(tmp_path, {**meta, "av": {"fit": "f.json", "length": True}}, 1)
    with pytest.raises(SchemaError, match="drafts reach position 3"):
        check_top_position(tmp_path, {**meta, "av": {"fit": "f.json", "length": True}}, 3)


def test_an_online_estimator_learns_under_av_length_when_rows_stop_short(tiny_pair):
    """The online estimator scores each step's drafted positions (L < K when every row stopped
    early) and gets the step's labels widened to K: it learns from the drafted ones (this raised
    an IndexError before: 12 scores against 16 labels)."""
    from svt.fit.irls_online import OnlineOptions
    from svt.fit.live import OnlineLive

    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS)
    K = 4
    online = OnlineLive(OnlineOptions(feature="q_max", cycle_steps=2, damping=50), K)
    av = LiveAV(online.confidence, COSTS, 0.0, online.observe, online.warming_up, length=True)
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, K, 30), eos_id=None,
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), av=av)
    for ids, got in zip(prompts, log.outputs, strict=True):
        assert got == _plain_greedy(tiny_pair.target, ids, 30)
    sched = {k: np.concatenate(v) for k, v in log.schedule.items()}
    assert (sched["draft_passes"] < K).any()  # steps where every row stopped short of K
    assert online.refits >= 3 and online.est.path_[-1]["rows"] > 0
    steps = {k: np.concatenate(v) for k, v in log.steps.items()}
    labelled = int(np.minimum(steps["accepted"] + 1, steps["kept"]).sum())  # verified drafts carry a label
    fed = sum(r["rows"] for r in online.est.path_)
    assert 0 < fed <= labelled
