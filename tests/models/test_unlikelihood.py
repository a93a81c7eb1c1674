"""The target's unlikelihood stage: the candidates (repeats of the output itself, not copies of the
prompt), the loss against a direct computation, one update lowering the candidates' probability,
resuming, and the refusal that keeps the weights from before the stage."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.models import unlikelihood as ul
from svt.models.train_tiny import VOCAB, TinySpec, make_model

TINY = TinySpec("t", 16, 1, 2, 32, 0, 1e-3, distil=False)


def _brute_mask(prompt, output, n, free):
    out = []
    for t in range(len(output)):
        if t < n - 1:
            out.append(False)
            continue
        g = tuple(output[t - n + 1 : t + 1])
        before = sum(tuple(output[s - n + 1 : s + 1]) == g for s in range(n - 1, t))
        in_prompt = sum(tuple(prompt[s : s + n]) == g for s in range(len(prompt) - n + 1))
        out.append(before >= max(free, in_prompt))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=30), st.integers(1, 4),
       st.integers(1, 3))
def test_candidates_match_counting_by_hand(prompt, output, n, free):
    assert ul.repeat_mask(prompt, output, n, free).tolist() == _brute_mask(prompt, output, n, free)


def test_copying_the_prompt_is_not_a_candidate_and_a_loop_is():
    prompt = list(range(10, 30))
    copy = ul.repeat_mask(prompt, prompt, 4, free=1)
    assert not copy.any()  # a faithful copy of the prompt: nothing penalised
    loop = ul.repeat_mask(prompt, [1, 2, 3, 4, 5] * 6, 4, free=2)
    assert not loop[:10].any() and loop[13:].all()  # the third time round is penalised, from its 4th token


def test_the_loss_is_minus_log_one_minus_p_over_the_candidates():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7) * 3
    tokens = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[0, 1, 1, 0, 1], [0, 0, 0, 1, 0]], dtype=torch.float32)
    p = logits.softmax(-1).gather(-1, tokens[..., None])[..., 0]
    want = -(torch.log1p(-p) * mask).sum() / mask.numel()
    assert ul.unlikelihood_loss(logits, tokens, mask).item() == pytest.approx(want.item(), rel=1e-5)
    # stable where p is 1 in float32 (a loop's tokens): finite, large
    sure = torch.full((1, 1, 7), -1e4)
    sure[0, 0, 3] = 1e4
    big = ul.unlikelihood_loss(sure, torch.tensor([[3]]), torch.ones(1, 1))
    assert torch.isfinite(big) and big.item() > 10


def _tiny(seed=0):
    torch.manual_seed(seed)
    return make_model(TINY, 0)


@pytest.fixture
def stream():
    return np.random.default_rng(0).integers(1, VOCAB, size=5_000)


CFG = ul.UnlikelihoodConfig(steps=4, batch=2, prompt_len=8, new_tokens=12, ngram=2, free_repeats=1, mle_batch=2,
                            mle_context=16, lr=1e-2, warmup=1, eval_every=2, eval_prompts=2, checkpoint_minutes=0.0,
                            max_held_out_loss=100.0, max_gate_top1_drop=1.0)


def test_an_update_lowers_the_candidates_probability(stream):
    """The unlikelihood gradient alone (no likelihood part) on a looping continuation makes its
    penalised tokens less likely."""
    model = _tiny()
    prompt = torch.tensor([[5, 6, 7, 8]])
    cont = torch.tensor([[1, 2, 1, 2, 1, 2, 1, 2]])
    mask = torch.from_numpy(ul.repeat_mask(prompt[0].numpy(), cont[0].numpy(), 2)[None]).float()
    seq = torch.cat([prompt, cont], 1)

    def penalised_logp():
        with torch.no_grad():
            lp = model(input_ids=seq[:, :-1]).logits[:, 3:].log_softmax(-1).gather(-1, cont[..., None])[..., 0]
        return (lp * mask).sum().item()

    before = penalised_logp()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(3):
        opt.zero_grad()
        ul.unlikelihood_loss(model(input_ids=seq[:, :-1]).logits[:, 3:], cont, mask).backward()
        opt.step()
    assert penalised_logp() < before - 0.1


def _held():
    return torch.from_numpy(np.random.default_rng(1).integers(1, VOCAB, size=(2, 33)))


def test_a_stage_resumes_from_its_checkpoint_to_the_same_weights(stream, tmp_path):
    full = _tiny()
    r_full = ul.run_stage(full, stream, _held(), CFG, tmp_path / "a", vocab=VOCAB, eos=0, log=lambda *a, **k: None)
    half = _tiny()
    ul.run_stage(half, stream, _held(), replace(CFG, steps=2), tmp_path / "b", vocab=VOCAB, eos=0,
                 log=lambda *a, **k: None)
    # a run of 2 steps left its checkpoint; continue it as the 4-step stage
    state = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    state["config"] = ul.asdict(CFG)
    torch.save(state, tmp_path / "b" / "checkpoint.pt")
    resumed = _tiny(5)
    r_res = ul.run_stage(resumed, stream, _held(), CFG, tmp_path / "b", vocab=VOCAB, eos=0, log=lambda *a, **k: None)
    assert [c["step"] for c in r_res["curve"]] == [c["step"] for c in r_full["curve"]] == [0, 2, 4]
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(SystemExit, match="another stage config"):
        ul.run_stage(_tiny(), stream, _held(), replace(CFG, lr=1e-3), tmp_path / "a", vocab=VOCAB, eos=0,
                     log=lambda *a, **k: None)


def test_no_admissible_measurement_refuses_the_stage_and_keeps_the_weights(stream, tmp_path):
    model = _tiny()
    start = {k: v.clone() for k, v in model.state_dict().items()}
    strict = replace(CFG, max_held_out_loss=0.0)  # no weights can meet it
    result = ul.run_stage(model, stream, _held(), strict, tmp_path / "w", vocab=VOCAB, eos=0,
                          log=lambda *a, **k: None)
    assert not result["accepted"] and result["chosen_step"] == 0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, start[k])
    assert json.loads((tmp_path / "w" / "curve.json").read_text())["curve"][-1]["step"] == 4


def test_the_chosen_weights_are_the_least_repetitive_admissible_ones(stream, tmp_path, monkeypatch):
    reps = iter([0.5, 0.2, 0.3])  # before, step 2, step 4: step 2 is the best
    monkeypatch.setattr(ul, "self_repetition", lambda *a, **k: next(reps))
    model = _tiny()
    result = ul.run_stage(model, stream, _held(), CFG, tmp_path / "w", vocab=VOCAB, eos=0, log=lambda *a, **k: None)
    assert result["accepted"] and result["chosen_step"] == 2 and result["after"]["self_repetition"] == 0.2
    state = torch.load(tmp_path / "w" / "checkpoint.pt", weights_only=False)
    assert state["step"] == 4 and state["best"]["step"] == 2
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state["best"]["state"][k])


def test_the_gate_is_held_to_the_weights_from_before_the_stage(stream, tmp_path, monkeypatch):
    """The gate may fall by max_gate_top1_drop from the weights *before* the stage, not from the last
    measurement: a gate that slides 0.015 per measurement is admissible at step 2 (0.015 below) and
    not at step 4 (0.03 below), though step 4 is 0.015 below step 2 and repeats less."""
    gates = iter([0.90, 0.885, 0.87])  # before, step 2, step 4
    reps = iter([0.5, 0.3, 0.1])
    monkeypatch.setattr(ul, "induction_gate", lambda *a, **k: {"top1": next(gates), "cross_entropy": 1.0})
    monkeypatch.setattr(ul, "self_repetition", lambda *a, **k: next(reps))
    cfg = replace(CFG, max_gate_top1_drop=0.02)
    result = ul.run_stage(_tiny(), stream, _held(), cfg, tmp_path / "w", vocab=VOCAB, eos=0, log=lambda *a, **k: None)
    assert result["accepted"] and result["chosen_step"] == 2 and result["after"]["gate_top1"] == 0.885


def test_overrides_are_typed_and_unknown_fields_are_one_message():
    assert ul.overrides(["lr=1e-4", "ngram=8"]) == {"lr": 1e-4, "ngram": 8}
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        ul.overrides(["nope=1"])
    with pytest.raises(SystemExit, match="not a int"):
        ul.overrides(["ngram=x"])


def test_the_recipe_runs_the_stage_once_and_loads_it_when_done(stream, tmp_path):
    from svt.models.recipe import scaled_unlikelihood, unlikelihood_stage

    cfg = scaled_unlikelihood(ul.UnlikelihoodConfig(), 0.001)
    assert cfg.steps == 2 and cfg.eval_every == 2 and ul.UnlikelihoodConfig().steps == 300
    cfg = replace(cfg, batch=2, prompt_len=8, new_tokens=12, mle_batch=2, mle_context=16, max_span=4,
                  max_held_out_loss=100.0, max_gate_top1_drop=1.0)
    model = _tiny()
    first = unlikelihood_stage(model, stream, _held(), cfg, tmp_path / "s", vocab=VOCAB, eos=0,
                               log=lambda *a, **k: None)
    again = _tiny(7)
    second = unlikelihood_stage(again, stream, _held(), cfg, tmp_path / "s", vocab=VOCAB, eos=0,
                                log=lambda *a, **k: None)
    assert second["chosen_step"] == first["chosen_step"]
    for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    with pytest.raises(SystemExit, match="another stage config"):
        unlikelihood_stage(_tiny(), stream, _held(), replace(cfg, lr=1.0), tmp_path / "s", vocab=VOCAB, eos=0)


def test_token_level_candidates_are_the_previous_tokens_except_the_gold_one():
    batch = torch.tensor([[3, 1, 3, 2, 1, 0], [0, 0, 0, 4, 4, 1]])
    cand = ul.previous_token_candidates(batch, 5)
    for b in range(2):
        for t in range(5):
            want = set(batch[b, : t + 1].tolist()) - {int(batch[b, t + 1])}
            assert set(torch.nonzero(cand[b, t]).flatten().tolist()) == want


def test_ditto_penalises_each_repetition_against_half_the_previous_ones_probability():
    rows = torch.tensor([[1, 2, 3, 1, 2, 3, 1, 2, 3, 1]])
    spans = torch.tensor([3])
    torch.manual_seed(0)
    logits = torch.randn(1, 9, 5)
    p = logits.softmax(-1).gather(-1, rows[:, 1:, None])[0, :, 0]
    # position t predicts rows[t + 1]; repetition (t + 1) // 3; first = 2 -> t + 1 >= 6, t >= 5
    want = [-torch.log(1 - (p[t] - 0.5 * p[t - 3]).abs()) for t in range(5, 9)]
    got = ul.ditto_loss(logits, rows, spans, 0.5, 2)
    assert got.item() == pytest.approx(torch.stack(want).mean().item(), rel=1e-5)
    got1 = ul.ditto_loss(logits, rows, spans, 0.5, 1)  # every repetition after the first
    want1 = [-torch.log(1 - (p[t] - 0.5 * p[t - 3]).abs()) for t in range(3, 9)]
    assert got1.item() == pytest.approx(torch.stack(want1).mean().item(), rel=1e-5)
    r, m = ul.ditto_batch(np.arange(1, 500), 4, 40, np.random.default_rng(0))
    for row, span in zip(r, m, strict=True):
        n = min(int(span), 40 - int(span))
        assert torch.equal(row[span : span + n], row[:n]) and 8 <= span <= 32


def test_the_standalone_stage_refuses_a_missing_record_or_target_in_one_line(tmp_path, models_dir):
    with pytest.raises(SystemExit, match="not the pair's training record"):
        ul.main(["--out", str(tmp_path), "--target", str(models_dir / "target"), "--trial"])
    (tmp_path / "training.json").write_text((models_dir / "training.json").read_text())
    with pytest.raises(SystemExit, match="no model.safetensors"):
        ul.main(["--out", str(tmp_path), "--target", str(tmp_path / "nowhere"), "--trial"])


@pytest.mark.parametrize("bad, said", [(["--target", "nowhere"], "no model.safetensors"),
                                       (["--set", "nonsense=1"], "FIELD=VALUE with FIELD one of"),
                                       (["--set", "steps=5"], "FIELD=VALUE with FIELD one of")])  # --steps sets it
def test_each_argument_is_checked_before_any_work(tmp_path, models_dir, monkeypatch, bad, said):
    """A missing --target or an unknown --set key was reported as "not the pair's training record" (the
    record is read first) after the data was prepared: each is named, before anything is read."""
    import svt.models.train_tiny as tt

    monkeypatch.setattr(tt, "prepare_data", lambda *a, **k: pytest.fail("the data was prepared first"))
    args = ["--out", str(tmp_path), "--target", str(models_dir / "target"), "--trial", *bad]
    with pytest.raises(SystemExit, match=said):
        ul.main([a if a != "nowhere" else str(tmp_path / "nowhere") for a in args])
