"""Messages that misled (issue 53): each surface now says what it found and what to do instead.
`svt cache` refuses a tree run up front; `svt compare` names a tree report; `svt fit` on a tree
run names its kind and the model that fits it; the induction gate's module runs as a command;
run.json says when the config chose path-by-path tree attention; the repeated-rows note mentions
the suffix cache's global tree only when the run has a cache; a cost table's bad entry is named."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError
from svt.simulate.cost_files import load_costs

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tree_run(models_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("msgtree")
    cfg = d / "t.yaml"
    cfg.write_text(yaml.safe_dump({
        "target": str(models_dir / "target"), "draft": str(models_dir / "draft-small"),
        "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "requests": 2, "batch_size": 1,
        "max_new_tokens": 6, "device": "cpu", "max_prompt_tokens": 64, "temperature": 0.0,
        "tree": {"widths": [2, 1], "attention": "paths"}}))
    r = _cli("collect", cfg, "--out", d / "run", "--quiet")
    assert r.exit_code == 0, r.output
    return d / "run"


def test_cache_refuses_a_tree_run_before_loading_anything(tree_run):
    before = sorted(p.name for p in tree_run.iterdir())
    r = _cli("cache", tree_run)
    assert r.exit_code == 2 and "a tree run" in r.output and "trees: null" in r.output, r.output
    assert sorted(p.name for p in tree_run.iterdir()) == before


def test_compare_names_a_tree_report(tree_run, tmp_path):
    assert _cli("evaluate", tree_run, "--out", tmp_path / "rep").exit_code == 0
    r = _cli("compare", tmp_path / "rep", tmp_path / "rep")
    assert r.exit_code == 2 and "report of a tree run" in r.output, r.output
    assert "not an svt evaluation report" not in r.output


def test_a_chain_fit_on_a_tree_run_names_the_run_and_the_model_that_fits_it(tree_run, tmp_path):
    r = _cli("fit", tree_run, "--model", "logistic", "--out", tmp_path / "f.json")
    assert r.exit_code != 0 and f"{tree_run} is a tree run" in r.output and "tree-logistic" in r.output, r.output
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("command", [("evaluate",), ("fit", "--model", "logistic")])
def test_the_cluster_names_a_tree_run_and_what_reads_it(tree_run, tmp_path, command):
    """--cluster called a tree run "a reference or cache-only run" (evaluate) and said only "No labelled
    drafts" (fit): it names the run's kind, and the fit the model that fits it."""
    r = _cli(*command, tree_run, "--out", tmp_path / ("f.json" if command[0] == "fit" else "o"), "--cluster", "local:1")
    assert r.exit_code != 0 and f"{tree_run} is a tree run" in r.output, r.output
    assert "reference or cache-only" not in r.output and "Traceback" not in r.output
    if command[0] == "fit":
        assert "tree-logistic" in r.output


def test_run_json_says_the_config_chose_path_attention(tree_run):
    att = json.loads((tree_run / "run.json").read_text())["tree"]["attention"]
    assert "chosen by the config" in att["target"] and "takes no tree mask" not in att["target"], att


def test_the_induction_module_is_a_command():
    none = subprocess.run([sys.executable, "-m", "svt.models.induction"], capture_output=True, text=True)
    assert none.returncode == 2 and "required: model" in none.stderr, none.stderr
    bad = subprocess.run([sys.executable, "-m", "svt.models.induction", str(ROOT / "data")], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "not a model folder" in bad.stderr, bad.stderr


def test_the_induction_command_measures_the_gate(models_dir):
    r = subprocess.run([sys.executable, "-m", "svt.models.induction", str(models_dir / "draft-small"),
                        "--samples", "4", "--length", "8"], capture_output=True, text=True)
    out = json.loads(r.stdout)
    assert r.returncode == (0 if out["passes"] else 1), r.stderr
    assert 0 <= out["top1"] <= 1 and out["cross_entropy"] > 0 and out["strings"] == 4


@pytest.mark.parametrize("cache", [False, True])
def test_the_repeated_rows_note_names_the_global_tree_only_with_a_cache(models_dir, tmp_path, cache):
    rows = tmp_path / "w.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"def f{i}(x):\n    return"}) + "\n" for i in range(2)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "target": str(models_dir / "target"), "draft": str(models_dir / "draft-small"), "workloads": [str(rows)],
        "requests": 3, "repeat": True, "batch_size": 3, "max_new_tokens": 4, "k": 2, "device": "cpu",
        "temperature": 0.0, **({"cache": {}} if cache else {})}))
    r = _cli("collect", cfg, "--out", tmp_path / "run", "--quiet")
    assert r.exit_code == 0 and "1 requests repeat a row" in r.output, r.output
    assert ("global tree" in r.output) == cache, r.output
    assert _cli("evaluate", tmp_path / "run", "--out", tmp_path / "rep", "--feature", "q_max").exit_code == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "repeat a row" in md and ("global tree" in md) == cache


@pytest.mark.parametrize("edit,named", [
    (lambda t: t["draft_ms"][1].__setitem__(3, "abc"), "`draft_ms[1][3]`"),
    (lambda t: t["draft_ms"][1].__setitem__(3, [1, 2]), "`draft_ms[1][3]`"),
    (lambda t: t["verify_ms"].__setitem__(4, True), "`verify_ms[4]`"),
    (lambda t: t["draft_ms"].__setitem__("two", {1: 1.0}), "the key 'two'"),
    (lambda t: t.__setitem__("verify_ms", {}), "`verify_ms` must not be empty"),
    (lambda t: t.__setitem__("draft_ms", "x"), "`draft_ms[batch][k]`"),
])
def test_a_cost_tables_bad_entry_is_named(tmp_path, edit, named):
    table = {"kind": "measured", "drafter": "autoregressive",
             "draft_ms": {1: {1: 0.5, 2: 1.0, 3: 1.5}, 2: {1: 0.6, 2: 1.2, 3: 1.8}},
             "verify_ms": {1: 2.0, 2: 2.1, 4: 2.3}}
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(table))
    load_costs(good)
    edit(table)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(table))
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load_costs(bad)


def test_a_resume_refuses_a_model_whose_config_changed(tmp_path, models_dir):
    """A head's taps, rope and norms live in its config.json: equal weights with another config
    draft differently, so one run must not mix them (the weights hash alone let it)."""
    import shutil
    from types import SimpleNamespace

    from svt.collect.plan import check_resume_inputs
    from svt.models.loading import config_hash

    head = tmp_path / "eagle3"
    shutil.copytree(models_dir / "eagle3", head)
    before = config_hash(head)
    cfg = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**cfg, "transformers_version": "9.9.9"}, indent=4))
    assert config_hash(head) == before  # the writer's version and the layout are not the model
    (head / "config.json").write_text(json.dumps({**cfg, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}))
    assert config_hash(head) != before
    old = {"models": {"draft": {"weights_sha256_16": "w", "config_sha256_16": before}}}
    now = SimpleNamespace(identity=lambda: {"target": {"weights_sha256_16": "t"},
                                            "draft": {"weights_sha256_16": "w", "config_sha256_16": config_hash(head)}})
    with pytest.raises(ConfigError, match="the draft model's config.json changed since the run started"):
        check_resume_inputs(tmp_path / "run", old, now, {})
    check_resume_inputs(tmp_path / "run", {"models": {"draft": {"weights_sha256_16": "w"}}}, now, {})  # older runs


def test_a_run_interrupted_before_its_first_batch_says_so(small_run, tmp_path):
    from svt.errors import SchemaError
    from svt.traces.io import open_run, read_meta, write_meta

    meta = {**read_meta(small_run), "status": "running", "shards": {}}
    (tmp_path / "run").mkdir()
    write_meta(tmp_path / "run", meta)
    with pytest.raises(SchemaError, match="interrupted before its first batch was written .* --resume"):
        open_run(tmp_path / "run")


def test_cache_opportunity_counts_by_hand():
    """Every column of the cache-opportunity table on six positions (the model drafter's yield at
    the same positions as the cache's, as the report says: it was averaged over all positions)."""
    import polars as pl

    from svt.report.hvd import cache_opportunity

    rows = pl.DataFrame({"workload": ["w"] * 6, "draft_len": [0, 3, 0, 5, 2, 4],
                         "oracle_accepted": [0, 3, 0, 0, 1, 4], "model_accepted": [4, 2, 4, 1, 0, 3],
                         "from_global": [False, True, False, False, True, False]})
    c = cache_opportunity(rows, high_yield=3)["all"]
    assert (c["positions"], c["with_draft"]) == (6, 4) and c["draft_share"] == pytest.approx(4 / 6)
    assert c["mean_draft_len"] == pytest.approx(14 / 4) and c["mean_yield"] == pytest.approx(8 / 4)
    assert c["zero_yield_share"] == pytest.approx(1 / 4)
    assert c["mean_model_yield"] == pytest.approx((2 + 1 + 0 + 3) / 4)  # where the cache drafted
    assert c["mean_model_yield_all_positions"] == pytest.approx(14 / 6)
    assert c["high_yield_share"] == pytest.approx(2 / 4) and c["high_yield_token_share"] == pytest.approx(7 / 8)
    assert c["top10_token_share"] == pytest.approx(4 / 8)  # the top 10 % of 4 drafts: one draft, yield 4
    assert c["from_global_share"] == pytest.approx(2 / 4) and c["yield_histogram"] == [1, 1, 0, 1, 1]
