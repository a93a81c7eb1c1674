"""The built-in pair's task figures: a toolcalls output counts as well formed only when its first
line completes the started call with the prompt's own module, an identifier and a line number."""

import json

from svt.collect.reference_run import collect_reference
from svt.config import load_collect_config
from svt.pair.measure_tiny import task_goals, toolcall_first_lines

HEAD = ('# Agent session: reading `{m}` one function at a time.\ncalls = []\n'
        'calls.append(tool("read_function", module="{m}", name="a", line=1))\n')
CALL = 'calls.append(tool("read_function", module='
CASES = [  # (module, output) -> well formed?
    ("pkg.mod", '"pkg.mod", name="load", line=12))\ncalls.append(', True),
    ("pkg.mod", '"pkg.other", name="load", line=12))\n', False),  # another module
    ("pkg.mod", '"pkg.mod", name=load, line=12))\n', False),  # name not quoted
    ("pkg.mod", '"pkg.mod", name="load", line=twelve))\n', False),
    ("json.decoder", '"json.decoder", name="_scan", line=7))', True),
]


def test_toolcall_first_lines_check_module_name_and_line(tmp_path, models_dir):
    wl = tmp_path / "toolcalls.jsonl"
    wl.write_text("".join(json.dumps({"prompt": HEAD.format(m=m), "reference": CALL + out}) + "\n"
                          for m, out, _ in CASES))
    cfg = load_collect_config(None, base={
        "engine": "reference", "target": str(models_dir / "target"), "draft": None,
        "stand_in": {"rate": 0.5}, "workloads": [str(wl)], "requests": len(CASES), "batch_size": 5,
        "max_new_tokens": 64, "k": 4, "temperature": 0, "seed": 0, "max_prompt_tokens": 256, "cache": False})
    run = tmp_path / "run"
    collect_reference(cfg, run, progress=False)
    assert toolcall_first_lines(run) == (sum(ok for *_, ok in CASES), len(CASES))
    goals = task_goals(run)
    assert goals["toolcalls_well_formed"] == [2, 5]
    assert goals["edit_mean_common_prefix"] is None


def test_goals_on_bad_input_say_so_in_one_line(tmp_path):
    import pytest

    from svt.errors import DataError
    from svt.pair.measure_tiny import hvd_against_cache_only, main

    with pytest.raises(SystemExit, match="expected a run directory"):
        main(["--goals", str(tmp_path)])
    (tmp_path / "report.json").write_text('{"features": {}}')
    with pytest.raises(DataError, match="no HVD replay"):
        hvd_against_cache_only(tmp_path)
    (tmp_path / "report.json").write_text("[1, 2")
    with pytest.raises(DataError, match="not a readable svt report"):
        hvd_against_cache_only(tmp_path)


def test_gate_goals_undo_the_sharpening_before_the_gate(tmp_path, models_dir):
    """The gate is the target as trained: its shipped (sharpened) logits divided by the factor."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    from svt.models.induction import induction_gate
    from svt.pair.measure_tiny import gate_goals

    goals = gate_goals(models_dir)
    training = json.loads((models_dir / "training.json").read_text())
    assert goals["held_out_loss_as_trained"] == training["models"]["target"]["held_out_loss"]
    model = AutoModelForCausalLM.from_pretrained(models_dir / "target", dtype=torch.float32)
    sharp = induction_gate(model, vocab=model.config.vocab_size, bos=model.config.eos_token_id, heads=False)
    assert goals["target_gate"]["top1"] == round(sharp["top1"], 4)  # greedy: unchanged by the factor
    if sharp["top1"] < 0.99:  # a factor > 1 moves the cross-entropy where the model is not sure
        assert goals["target_gate"]["cross_entropy"] != round(sharp["cross_entropy"], 3)
    for name in ("target", "draft-large"):
        assert set(goals[f"{name}_gate"]) == {"top1", "cross_entropy", "max_induction_score", "passes"}
    copy = tmp_path / "models"
    shutil.copytree(models_dir, copy)
    (copy / "training.json").write_text("{}")
    import pytest

    from svt.errors import DataError

    with pytest.raises(DataError, match="training record"):
        gate_goals(copy)


def test_report_readers_take_the_figures_they_name(tmp_path):
    import pytest

    from svt.errors import DataError
    from svt.pair.measure_tiny import demo_auc, reference_model_yield

    (tmp_path / "report.json").write_text(json.dumps({
        "features": {"q_max": {"auc": 0.81}, "q_sampled": {"auc": 0.7}},
        "cache": {"all": {"mean_model_yield": 1.23456}, "code": {"mean_model_yield": 0.5}}}))
    assert demo_auc(tmp_path) == 0.81 and demo_auc(tmp_path, "q_sampled") == 0.7
    assert reference_model_yield(tmp_path) == {"all": 1.235, "code": 0.5}
    (tmp_path / "report.json").write_text('{"features": {}}')
    with pytest.raises(DataError, match="no q_max AUC"):
        demo_auc(tmp_path)
    with pytest.raises(DataError, match="no cache section"):
        reference_model_yield(tmp_path)


def test_cache_only_is_set_against_the_reference_run_per_shared_workload(tmp_path):
    import pytest

    from svt.errors import DataError
    from svt.pair.measure_tiny import cache_only_against_reference

    def report(name, rows):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps({"hvd": {"rows": rows}}))
        return tmp_path / name

    own = report("own", [{"group": "all", "policy": "cache-only", "speedup_vs_greedy": 4.6},
                         {"group": "code", "policy": "cache-only", "speedup_vs_greedy": 6.0},
                         {"group": "code", "policy": "model-only", "speedup_vs_greedy": 2.0}])
    ref = report("ref", [{"group": "all", "policy": "cache-only", "speedup_vs_greedy": 1.15},
                         {"group": "prose", "policy": "cache-only", "speedup_vs_greedy": 1.1}])
    assert cache_only_against_reference(own, ref) == {"all": {"target_run": 4.6, "reference_run": 1.15, "ratio": 4.0}}
    empty = report("empty", [{"group": "all", "policy": "model-only", "speedup_vs_greedy": 2.0}])
    with pytest.raises(DataError, match="no cache-only row"):
        cache_only_against_reference(own, empty)
