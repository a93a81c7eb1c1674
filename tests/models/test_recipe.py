"""The staged recipe of the built-in pair: the learning-rate schedule, the stop after the induction
jump, distillation's loss, and resuming (a finished stage is loaded, never trained again; a stage
made with another config is refused)."""

import json
import math

import numpy as np
import pytest
import torch

from svt.models import induction_phase as phase
from svt.models.induction_phase import PhaseConfig, lr_at, run_phase, train_step
from svt.models.recipe import run_stages, scaled_stages
from svt.models.train_tiny import VOCAB, TinySpec, make_model, sharpen

TINY = TinySpec("t", 16, 1, 2, 32, 0, 1e-3, distil=False)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return make_model(TINY, 0)


@pytest.fixture
def stream():
    return np.random.default_rng(0).integers(1, VOCAB, size=5_000)


def test_lr_warms_up_then_stays_or_decays_to_its_share():
    const = PhaseConfig(lr=1e-3, warmup=10)
    assert lr_at(0, const, 100) == pytest.approx(1e-4) and lr_at(9, const, 100) == pytest.approx(1e-3)
    assert lr_at(50, const, 100) == pytest.approx(1e-3) and lr_at(99, const, 100) == pytest.approx(1e-3)
    cos = PhaseConfig(lr=1e-3, warmup=10, final_lr_share=0.1)
    assert lr_at(10, cos, 110) == pytest.approx(1e-3)
    assert lr_at(60, cos, 110) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half way: the mean
    assert lr_at(110, cos, 110) == pytest.approx(1e-4)
    lrs = [lr_at(s, cos, 110) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_distillation_loss_is_the_confidence_weighted_soft_cross_entropy():
    student, teacher = tiny_model(0), tiny_model(1)
    sharpen(teacher, 40.0)  # confident at some tokens, not at others: the weights differ
    batch = torch.randint(1, VOCAB, (2, 9))
    with torch.no_grad():
        p = teacher(input_ids=batch[:, :-1]).logits.softmax(-1)
        logq = student(input_ids=batch[:, :-1]).logits.log_softmax(-1)
    w = p.amax(-1) ** 2.0
    assert w.max() > 3 * w.min()
    expected = ((-(p * logq).sum(-1)) * w).sum() / w.sum()
    opt = torch.optim.SGD(student.parameters(), lr=0.0)
    loss = train_step(student, opt, batch, teacher=teacher, confidence_weight=2.0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    plain = train_step(student, opt, batch)
    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(logq.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    assert plain.item() == pytest.approx(ce.item(), rel=1e-5)


def test_the_phase_ends_the_asked_tokens_after_the_jump(tmp_path, stream, monkeypatch):
    scores = iter([0.05, 0.1, 0.35, 0.2, 0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9])

    def gate(model, **kw):
        return {"top1": 0.0, "cross_entropy": 9.0, "max_induction_score": next(scores)}

    monkeypatch.setattr(phase, "induction_gate", gate)
    cfg = PhaseConfig(batch=2, context=16, gate_every=2, max_tokens=10_000, stop_on_gate=False, jump_score=0.3,
                      after_jump_tokens=4 * 2 * 16, warmup=1)
    result = run_phase(tiny_model(), stream, cfg, tmp_path / "w", vocab=VOCAB, bos=0, log=lambda *a, **k: None)
    # gates at steps 2, 4, 6 (0.35: the jump), ... ; 4 steps of 32 tokens later: step 10
    assert result["jump_step"] == 6 and result["jump_tokens"] == 6 * 32
    assert result["steps"] == 10 and [c["step"] for c in result["curve"]] == [2, 4, 6, 8, 10]
    assert json.loads((tmp_path / "w" / "curve.json").read_text())["curve"][-1]["step"] == 10


def test_a_finished_stage_is_loaded_not_trained_again(tmp_path, stream, monkeypatch):
    stages = (("a", PhaseConfig(batch=2, context=16, max_tokens=64, gate_every=1, warmup=1, stop_on_gate=False)),
              ("b", PhaseConfig(batch=2, context=16, max_tokens=96, gate_every=1, warmup=1, stop_on_gate=False,
                                final_lr_share=0.1, seed=1)))
    quiet = {"log": lambda *a, **k: None}
    first = tiny_model()
    results = run_stages(first, stages, stream, tmp_path, vocab=VOCAB, bos=0, **quiet)
    assert [r["tokens"] for r in results] == [64, 96] and (tmp_path / "b" / "model.pt").is_file()

    def no_training(*a, **k):
        raise AssertionError("a finished stage was trained again")

    monkeypatch.setattr("svt.models.recipe.run_phase", no_training)
    again = tiny_model(seed=5)  # other weights: the stages' saved ones must replace them
    results2 = run_stages(again, stages, stream, tmp_path, vocab=VOCAB, bos=0, **quiet)
    assert [r["tokens"] for r in results2] == [64, 96]
    for p, q in zip(first.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q)
    other = (stages[0], ("b", PhaseConfig(batch=2, context=16, max_tokens=128, gate_every=1, warmup=1)))
    with pytest.raises(SystemExit, match="another stage config"):
        run_stages(tiny_model(), other, stream, tmp_path, vocab=VOCAB, bos=0, **quiet)


def test_an_interrupted_stage_resumes_from_its_checkpoint(tmp_path, stream):
    cfg = PhaseConfig(batch=2, context=16, max_tokens=6 * 32, gate_every=3, warmup=1, stop_on_gate=False)
    quiet = {"log": lambda *a, **k: None}
    whole = tiny_model()
    run_phase(whole, stream, cfg, tmp_path / "whole", vocab=VOCAB, bos=0, **quiet)
    half = PhaseConfig(**{**cfg.__dict__, "max_tokens": 3 * 32})
    part = tiny_model()
    run_phase(part, stream, half, tmp_path / "part", vocab=VOCAB, bos=0, **quiet)
    state = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)
    state["config"] = cfg.__dict__  # as if the 6-step run had been stopped after its checkpoint at step 3
    torch.save(state, tmp_path / "part" / "checkpoint.pt")
    resumed = tiny_model(seed=9)
    result = run_phase(resumed, stream, cfg, tmp_path / "part", vocab=VOCAB, bos=0, **quiet)
    assert result["steps"] == 6 and [c["step"] for c in result["curve"]] == [3, 6]
    for p, q in zip(whole.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_scaled_stages_keep_their_shapes_and_shrink_budgets():
    stages = (("a", PhaseConfig(batch=2, context=128, max_tokens=1_000_000, after_jump_tokens=100_000, warmup=200)),)
    (name, cfg), = scaled_stages(stages, 0.01)
    assert name == "a" and (cfg.batch, cfg.context) == (2, 128)
    assert cfg.max_tokens == 10_000 and cfg.after_jump_tokens == 1_000 and cfg.warmup == 2
    assert scaled_stages(stages, 1.0) is stages
    assert math.isclose(lr_at(0, cfg, 10), cfg.lr / 2)


@pytest.mark.parametrize("args", [["--scale", "0"], ["--scale", "2"], ["--threads", "0"], ["--device", "tpu"]])
def test_bad_recipe_options_are_one_usage_error(args, capsys):
    from svt.models.recipe import _parse

    with pytest.raises(SystemExit) as exc:
        _parse(args)
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_drafts_from_a_saved_target_read_its_record_and_refuse_another_sharpening(tmp_path, models_dir):
    from svt.models.recipe import saved_target, state_id

    target, entry = saved_target(models_dir / "target", models_dir, "cpu")
    assert entry["sharpen"] == 3.0 and not any(p.requires_grad for p in target.parameters())
    assert state_id(target) == state_id(target) and len(state_id(target)) == 16
    with torch.no_grad():
        target.model.norm.weight.mul_(2.0)
    assert state_id(target) != state_id(saved_target(models_dir / "target", models_dir, "cpu")[0])
    (tmp_path / "training.json").write_text(json.dumps({"models": {"target": {**entry, "sharpen": 2.0}}}))
    with pytest.raises(SystemExit, match="sharpened by 2.0"):
        saved_target(models_dir / "target", tmp_path, "cpu")
    (tmp_path / "training.json").write_text("{}")
    with pytest.raises(SystemExit, match="no target record"):
        saved_target(models_dir / "target", tmp_path, "cpu")


@pytest.mark.parametrize("where", ["no-target", "no-record"])
def test_drafts_from_is_checked_before_the_data_is_prepared(tmp_path, models_dir, monkeypatch, where):
    """The recipe tokenized 5.6 M tokens (36 s) before saying --drafts-from or its record was missing."""
    import svt.models.recipe as recipe

    monkeypatch.setattr(recipe, "prepare_data", lambda *a, **k: pytest.fail("the data was prepared first"))
    target = tmp_path / "nowhere" if where == "no-target" else models_dir / "target"
    with pytest.raises(SystemExit) as exc:
        recipe.main(["--out", str(tmp_path), "--drafts-from", str(target)])
    assert exc.value.code == 2 if where == "no-target" else "holds no target record" in str(exc.value)
