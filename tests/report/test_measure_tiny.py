"""The built-in pair's task figures: a toolcalls output counts as well formed only when its first
line completes the started call with the prompt's own module, an identifier and a line number."""

import json

from svt.collect.reference_run import collect_reference
from svt.config import load_collect_config
from svt.report.measure_tiny import task_goals, toolcall_first_lines

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
    from svt.report.measure_tiny import hvd_against_cache_only, main

    with pytest.raises(SystemExit, match="expected a run directory"):
        main(["--goals", str(tmp_path)])
    (tmp_path / "report.json").write_text('{"features": {}}')
    with pytest.raises(DataError, match="no HVD replay"):
        hvd_against_cache_only(tmp_path)
    (tmp_path / "report.json").write_text("[1, 2")
    with pytest.raises(DataError, match="not a readable svt report"):
        hvd_against_cache_only(tmp_path)
