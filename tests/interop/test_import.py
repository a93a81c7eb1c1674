"""svt import: each format read from a small fixture written by hand from the format's public
description, checked against counts worked out by hand; a file not in its format is one message
naming the first offending record, and nothing is written."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError, DataError, SchemaError
from svt.interop import ImportFormatError, import_trace
from svt.traces.io import open_run

FIX = Path(__file__).parent / "fixtures"


def _drafts(run) -> pl.DataFrame:
    return open_run(run).scan("drafts").sort("request", "step", "position").collect()


def test_vllm_steps_counts_become_exact_chain_labels(tmp_path):
    out = tmp_path / "run"
    s = import_trace("vllm-steps", FIX / "vllm_steps.jsonl", out)
    assert (s.requests, s.steps, s.drafts, s.labelled, s.accepted) == (2, 5, 14, 11, 8)
    d = _drafts(out)
    # request 0, step 1: 3 drafted, 1 accepted -> accepted, rejected, never verified
    labels = d.filter((pl.col("request") == 0) & (pl.col("step") == 1))["label"].to_list()
    assert labels == [1, 0, None]
    assert d.filter(pl.col("request") == 1)["workload"].unique().to_list() == ["code"]
    steps = open_run(out).scan("steps").sort("request", "step").collect()
    assert steps["drafted"].to_list() == [3, 3, 3, 3, 2] and steps["accepted"].to_list() == [3, 1, 0, 2, 2]
    meta = json.loads((out / "run.json").read_text())
    assert meta["engine"] == "import" and meta["import"]["format"] == "vllm-steps" and meta["k"] == 3
    assert {"q_max", "token", "accept_prob"} <= set(meta["import"]["lacks"]["drafts"])
    assert "prompt_ids" not in meta["import"]["lacks"].get("requests", [])  # both records carry them
    assert any("no draft probabilities" in c for c in meta["import"]["cannot_study"])


def test_an_imported_run_is_evaluated_for_what_it_carries(tmp_path):
    from svt.report import EvaluateOptions, evaluate
    from svt.report.render import to_markdown

    import_trace("vllm-steps", FIX / "vllm_steps.jsonl", tmp_path / "run")
    rep = evaluate([tmp_path / "run"], EvaluateOptions())
    assert rep["features"] == {} and "q_max" in rep["features_not_computed"]
    acc = rep["acceptance"]
    assert acc["mean_acceptance_length"] == pytest.approx(1 + (3 + 1 + 0 + 2 + 2) / 5)
    by = {r["position"]: r for r in acc["by_position"]}
    assert (by[2]["proposed"], by[2]["verified"], by[2]["accepted"]) == (4, 2, 1)
    md = to_markdown(rep)
    assert "is imported (vllm-steps" in md and "Not computed: q_max" in md


def test_a_fit_on_a_column_the_import_lacks_is_refused_by_name(tmp_path):
    from svt.fit import fit_runs

    import_trace("vllm-steps", FIX / "vllm_steps.jsonl", tmp_path / "run")
    with pytest.raises(DataError, match="'logit_qmax' reads q_max, which the imported run lacks"):
        fit_runs([tmp_path / "run"], "logistic")


def test_specdec_tokens_keep_p_acc_as_the_soft_label(tmp_path):
    out = tmp_path / "run"
    s = import_trace("specdec-tokens", FIX / "specdec_tokens.jsonl", out)
    assert (s.drafts, s.labelled, s.accepted) == (14, 10, 7)
    d = _drafts(out)
    first = d.filter((pl.col("request") == 0) & (pl.col("step") == 0))
    assert first["label"].to_list() == [1, 1, 0, None] and first["token"].to_list() == [11, 12, 13, 14]
    np.testing.assert_allclose(first["accept_prob"].to_numpy(), [1.0, 0.9, 0.35, 0.2], rtol=1e-6)
    meta = json.loads((out / "run.json").read_text())["import"]
    assert "accept_prob" not in meta["lacks"]["drafts"] and "accept_prob_expected" in meta["lacks"]["drafts"]
    assert meta["prompt_ids"].startswith("given for 1 of 2 requests")  # half given: not imported
    assert d["workload"].unique().sort().to_list() == ["math", "writing"]


def test_arctic_simulator_tasks_become_workloads(tmp_path):
    out = tmp_path / "run"
    s = import_trace("arctic-sim", FIX / "arctic_sim.csv", out)
    assert (s.requests, s.steps, s.drafts, s.labelled, s.accepted) == (3, 7, 17, 14, 11)
    steps = open_run(out).scan("steps").sort("request", "step").collect()
    np.testing.assert_allclose(steps["draft_ms"].to_numpy()[:3], [0.012, 0.020, 0.018], rtol=1e-6)
    assert steps["verify_ms"].null_count() == steps.height  # a simulator has no target
    reqs = open_run(out).scan("requests").sort("request").collect()
    assert reqs["workload"].to_list() == ["task 0", "task 0", "task 1"]
    meta = json.loads((out / "run.json").read_text())["import"]
    assert meta["tasks"]["1"]["max_spec_factor"] == 2.0


def test_arctic_mixed_tree_and_chain_rows_are_refused_naming_the_row(tmp_path):
    bad = tmp_path / "mixed.csv"
    lines = (FIX / "arctic_sim.csv").read_text().splitlines()
    lines[3] = lines[3].replace("False", "True", 1)
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ImportFormatError, match=r"row 3 \(line 4\): use_tree_spec is True here but False"):
        import_trace("arctic-sim", bad, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_arctic_tree_speculation_imports_as_a_tree_run(tmp_path):
    """The simulator's own output with use_tree_spec (scripts/make_arctic_tree_fixture.py): steps keep
    the tree sizes and accepted lengths, run.json says it is a tree run without per-node rows, and
    its report's totals are the file's."""
    import polars as pl

    from svt.report import EvaluateOptions, evaluate

    src = pl.read_csv(FIX / "arctic_sim_tree.csv")
    assert src["use_tree_spec"].all() and (src["num_spec_toks"] > 1).any()
    out = tmp_path / "tree"
    s = import_trace("arctic-sim", FIX / "arctic_sim_tree.csv", out)
    assert (s.steps, s.drafts) == (src.height, 0)
    run = open_run(out)
    steps = run.scan("steps").collect()
    assert steps["drafted"].cast(pl.Int64).sum() == src["num_spec_toks"].sum()
    assert steps["accepted"].cast(pl.Int64).sum() == src["num_accept_toks"].sum()
    tree = run.meta["tree"]
    assert tree["per_node"] is False and tree["tree_nodes"] == src["num_spec_toks"].sum()
    report = evaluate([out], EvaluateOptions())
    top = report["trees"]["by_workload"][0]
    assert top["workload"] == "all"
    assert top["accepted_per_node"] == pytest.approx(src["num_accept_toks"].sum() / src["num_spec_toks"].sum())
    assert report["trees"]["replay"] is None and report["trees"]["by_depth"] == []


def test_table_import_round_trips_a_collected_run(small_run, tmp_path):
    """A collected run's drafts written as a flat CSV and read back through a mapping give the
    same acceptance by position and the same q_max AUC."""
    from svt.metrics.tables import acceptance_by_position
    from svt.report import EvaluateOptions, evaluate

    src = open_run(small_run).scan("drafts").collect()
    flat = tmp_path / "drafts.csv"
    src.select(pl.col("request").alias("req"), pl.col("step").alias("it"), pl.col("position").alias("pos"),
               pl.col("label").alias("ok"), pl.col("q_max").alias("conf"), "workload").write_csv(flat)
    (tmp_path / "map.yaml").write_text("rows: drafts\ncolumns: {request: req, step: it, position: pos, label: ok, "
                                       "q_max: conf}\nworkload: workload\n")
    import_trace("table", flat, tmp_path / "run", mapping=tmp_path / "map.yaml")
    a = acceptance_by_position(src)
    b = acceptance_by_position(open_run(tmp_path / "run").scan("drafts"))
    assert a.equals(b)
    both = [evaluate([r], EvaluateOptions(features=["q_max"]))["features"]["q_max"] for r in (small_run, tmp_path / "run")]
    assert both[0]["auc"] == pytest.approx(both[1]["auc"], abs=1e-12)
    assert both[0]["log_loss"] == pytest.approx(both[1]["log_loss"], rel=1e-6)  # float32 through CSV text


def test_table_steps_rows_give_chain_drafts(tmp_path):
    f = tmp_path / "steps.parquet"
    pl.DataFrame({"r": [7, 7, 9], "s": [0, 1, 0], "d": [4, 4, 2], "a": [4, 1, 0]}).write_parquet(f)
    (tmp_path / "m.yaml").write_text("rows: steps\ncolumns: {request: r, step: s, drafted: d, accepted: a}\n")
    s = import_trace("table", f, tmp_path / "run", mapping=tmp_path / "m.yaml")
    assert (s.requests, s.drafts, s.labelled, s.accepted) == (2, 10, 7, 5)  # 4 + (1, 0) + (0)


@pytest.mark.parametrize(("rows", "mapping", "match"), [
    ("req,it,pos,ok\n0,0,0,1\n0,0,1,2\n", "label: ok", r"row 2 \(line 3\): `ok` \(svt's `label`\) is 2"),
    ("req,it,pos,ok\n0,0,0,0\n0,0,1,1\n", "label: ok", r"request 0 step 0 has labels that are not a chain's"),
    ("req,it,pos,ok\n0,0,0,1\n0,0,2,1\n", "label: ok", r"positions that are not 0, 1"),
    ("req,it,pos,ok\n0,0,0,1\n0,x,1,1\n", "label: ok", r"row 2 \(line 3\): `it` \(svt's `step`\) is 'x'"),
])
def test_a_table_not_as_mapped_names_the_first_bad_row(tmp_path, rows, mapping, match):
    (tmp_path / "t.csv").write_text(rows)
    (tmp_path / "m.yaml").write_text(f"rows: drafts\ncolumns: {{request: req, step: it, position: pos, {mapping}}}\n")
    with pytest.raises(ImportFormatError, match=match):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")
    assert not (tmp_path / "run").exists() and not list(tmp_path.glob(".*run*"))


@pytest.mark.parametrize(("mapping", "match"), [
    ("rows: drafts\ncolumns: {request: req, step: it, position: pos}\n", "need label"),
    ("rows: drafts\ncolumns: {request: req, step: it, position: pos, label: ok, colour: c}\n",
     "colour is not a column of svt's drafts table"),
    ("rows: tokens\ncolumns: {}\n", "`rows` must be drafts or steps"),
    ("rows: drafts\ncolumns: {request: req, step: it, position: pos, label: nope}\n", "no column nope"),
])
def test_a_bad_mapping_is_one_message(tmp_path, mapping, match):
    (tmp_path / "t.csv").write_text("req,it,pos,ok\n0,0,0,1\n")
    (tmp_path / "m.yaml").write_text(mapping)
    with pytest.raises((ConfigError, ImportFormatError), match=match):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


@pytest.mark.parametrize(("fmt", "text", "match"), [
    ("vllm-steps", '{"per_step_drafted": [2], "per_step_accepted": [1]}\nnot json\n', r"\.jsonl:2: not valid JSON"),
    ("vllm-steps", '{"per_step_drafted": [2, 2], "per_step_accepted": [1]}\n', r":1: `per_step_drafted` has 2 steps"),
    ("vllm-steps", '{"per_step_drafted": [2], "per_step_accepted": [3]}\n', r":1: step 0: 3 accepted of 2 drafted"),
    ("vllm-steps", '{"drafted": [2]}\n', r":1: expected `per_step_drafted`"),
    ("specdec-tokens", '{"steps": [{"draft_tokens": [1, 2], "p_acc": [0.5, 1.5], "accepted": 1}]}\n',
     r":1 step 0: `p_acc` must hold one number in \[0, 1\]"),
    ("specdec-tokens", '{"steps": [{"draft_tokens": [1, 2], "p_acc": [0.5, 0.5], "accepted": 3}]}\n',
     r":1 step 0: `accepted` must be an integer from 0 to 2"),
])
def test_a_record_not_in_the_format_is_named(tmp_path, fmt, text, match):
    (tmp_path / "f.jsonl").write_text(text)
    with pytest.raises(ImportFormatError, match=match):
        import_trace(fmt, tmp_path / "f.jsonl", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_import_errors_and_overwrite_keep_the_old_run(tmp_path):
    r = CliRunner()
    out = tmp_path / "run"
    ok = r.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(out)])
    assert ok.exit_code == 0 and "2 requests, 5 steps, 14 drafts" in ok.output, ok.output
    before = (out / "run.json").read_text()
    again = r.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output
    (tmp_path / "bad.jsonl").write_text('{"per_step_drafted": [1], "per_step_accepted": [2]}\n')
    bad = r.invoke(app, ["import", "vllm-steps", str(tmp_path / "bad.jsonl"), "--out", str(out), "--overwrite"])
    assert bad.exit_code != 0 and "Traceback" not in bad.output and "1 drafted" in bad.output
    assert (out / "run.json").read_text() == before  # the old run is untouched
    for args, msg in ((["import", "csv-ish", "x", "--out", str(tmp_path / "o")], "Unknown import format"),
                      (["import", "vllm-steps", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")], "not found"),
                      (["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--mapping", "m.yaml", "--out",
                        str(tmp_path / "o")], "takes no --mapping")):
        res = r.invoke(app, args)
        assert res.exit_code == 2 and msg in res.output and not (tmp_path / "o").exists(), res.output


def test_the_reader_holds_an_import_to_what_it_says_it_lacks(tmp_path):
    out = tmp_path / "run"
    import_trace("vllm-steps", FIX / "vllm_steps.jsonl", out)
    meta = json.loads((out / "run.json").read_text())
    meta["import"]["lacks"]["drafts"].remove("q_max")  # q_max is all null but no longer declared lacking
    (out / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="`q_max` has 14 bad value"):
        open_run(out)
    meta["import"]["lacks"]["drafts"] = ["q_max", "colour"]
    (out / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="import.lacks.drafts"):
        open_run(out)


# Found by a hostile-input probe: each was a traceback, a silent wrong value, a lost file or an
# out-of-memory kill.

ARCTIC_HEAD = "task_id,request_id,step,num_spec_toks,num_accept_toks,num_out_toks,spec_ms,use_tree_spec\n"


@pytest.mark.parametrize(("fmt", "name", "data", "match"), [
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3000000000,1,2,0.01,False\n", r"row 1 \(line 2\): `num_spec_toks`"),
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3,2.5,3,0.01,False\n", r"`num_accept_toks` is 2.5, not an integer"),
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3,1,2,abc,False\n", r"`spec_ms` is 'abc', not a time"),
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3,1,2,-5,False\n", r"`spec_ms` is -5"),
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3,1,99,0.01,False\n", r"num_out_toks 99 with 1 accepted"),
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3,1,2,0.01,yes\n", r"use_tree_spec is 'yes', not true or false"),
    ("arctic-sim", "a.csv", ARCTIC_HEAD + "0,0,0,3,1,2,0.01,False\n0,0,1,3,1,2,0.01\n", r"row 2 \(line 3\): "
     r"use_tree_spec is empty \(a truncated row\?\)"),
    ("vllm-steps", "v.jsonl", '{"per_step_drafted": [40000], "per_step_accepted": [1]}\n', r"holds 40000, outside"),
    ("vllm-steps", "v.jsonl", '{"per_step_drafted": [1000000000000000000000000000000], "per_step_accepted": [1]}\n',
     r"outside \[0, 1024\]"),
    ("vllm-steps", "v.jsonl", '{"per_step_drafted": [5000, 5000], "per_step_accepted": [1, 1]}\n',
     r"holds 5000, outside \[0, 1024\]"),  # a few bytes that would make 10,000 draft rows a step
    ("vllm-steps", "v.jsonl", '{"per_step_drafted": [2], "per_step_accepted": [1], "prompt_token_ids": [3000000000]}\n',
     r"`prompt_token_ids` holds 3000000000"),
    ("vllm-steps", "v.jsonl", '{"request_id": "x", "per_step_drafted": [2], "per_step_accepted": [1]}\n'
                              '{"request_id": "x", "per_step_drafted": [2], "per_step_accepted": [1]}\n',
     r':2: request_id "x" again'),
    ("vllm-steps", "v.jsonl", '{"per_step_drafted": [0, 0], "per_step_accepted": [0, 0]}\n', r"no drafts"),
    ("vllm-steps", "v.jsonl", '{"per_step_drafted": [2], "per_step_accepted": [1], "workload": {"a": 1}}\n',
     r"`workload` must be a string"),
    ("vllm-steps", "v.jsonl", '{\n  "per_step_drafted": [2],\n  "per_step_accepted": [1]\n}\n',
     r"expected JSON Lines \(one object per line\) or a JSON list"),
    ("specdec-tokens", "s.jsonl", '{"steps": [{"draft_tokens": [3000000000], "p_acc": [0.5], "accepted": 1}]}\n',
     r"`draft_tokens` holds 3000000000"),
])
def test_hostile_records_are_one_message_and_write_nothing(tmp_path, fmt, name, data, match):
    (tmp_path / name).write_text(data)
    with pytest.raises(ImportFormatError, match=match):
        import_trace(fmt, tmp_path / name, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_non_utf8_files_are_one_message(tmp_path):
    (tmp_path / "v.jsonl").write_bytes(b'{"per_step_drafted":[3],"per_step_accepted":[1],"workload":"caf\xe9"}\n')
    with pytest.raises(ImportFormatError, match="not UTF-8 text"):
        import_trace("vllm-steps", tmp_path / "v.jsonl", tmp_path / "run")
    (tmp_path / "m.yaml").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "t.csv").write_text("r,s,p,l\n0,0,0,1\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


@pytest.mark.parametrize(("rows", "cols", "match"), [
    ("r,s,p,l\n0,0,0,0.5\n", "{request: r, step: s, position: p, label: l}", r"`l` \(svt's `label`\) is 0.5"),
    ("r,s,p,l\n0.7,0,0,1\n", "{request: r, step: s, position: p, label: l}", r"`r` \(svt's `request`\) is 0.7"),
    ("r,s,p,l,c\n0,0,0,1,0.5\n", "{request: r, step: s, position: p, label: l, token: c}", r"`c` \(svt's `token`\)"),
    ("r,s,p,l\n7,0,0,1\n7,0,2,1\n", "{request: r, step: s, position: p, label: l}", r"request 7 step 0 has positions"),
    ("r,s,p,l\n0,0,0,\n", "{request: r, step: s, position: p, label: l}", r"no draft was verified"),
    ("r,s,p,l\n0,0,0,1\n", "{request: r, step: s, position: s, label: l}", r"'s' is mapped to step and position"),
])
def test_table_values_are_never_truncated_or_merged(tmp_path, rows, cols, match):
    (tmp_path / "t.csv").write_text(rows)
    (tmp_path / "m.yaml").write_text(f"rows: drafts\ncolumns: {cols}\n")
    with pytest.raises((ImportFormatError, ConfigError), match=match):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


def test_duplicate_step_rows_are_named(tmp_path):
    (tmp_path / "t.csv").write_text("r,s,d,a\n5,0,2,1\n5,0,2,1\n")
    (tmp_path / "m.yaml").write_text("rows: steps\ncolumns: {request: r, step: s, drafted: d, accepted: a}\n")
    with pytest.raises(ImportFormatError, match="request 5 has step 0 more than once"):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


def test_an_input_inside_out_is_never_deleted(tmp_path):
    out = tmp_path / "run"
    import_trace("vllm-steps", FIX / "vllm_steps.jsonl", out)
    inside = out / "trace.jsonl"
    inside.write_text((FIX / "vllm_steps.jsonl").read_text())
    with pytest.raises(ConfigError, match="overlaps the trace"):
        import_trace("vllm-steps", inside, out, overwrite=True)
    assert inside.is_file()
    with pytest.raises(ConfigError, match="is a directory"):
        import_trace("vllm-steps", FIX, tmp_path / "other")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a run directory"):  # --overwrite replaces runs only
        import_trace("vllm-steps", FIX / "vllm_steps.jsonl", tmp_path / "notes", overwrite=True)
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_zero_draft_steps_survive_import_and_export(tmp_path):
    """The simulator's first step of a request drafts nothing; it stays a step both ways."""
    from svt.interop.export import export

    import_trace("arctic-sim", FIX / "arctic_sim.csv", tmp_path / "a")
    path = export("vllm-steps", tmp_path / "a", tmp_path / "a.jsonl")
    s = import_trace("vllm-steps", path, tmp_path / "b")
    assert s.steps == 7 and s.drafts == 17
    (tmp_path / "s.jsonl").write_text('{"steps": [{"draft_tokens": [], "p_acc": [], "accepted": 0}, '
                                      '{"draft_tokens": [5], "p_acc": [0.3], "accepted": 1}]}\n')
    assert import_trace("specdec-tokens", tmp_path / "s.jsonl", tmp_path / "c").steps == 2


def test_imported_runs_group_and_pair_without_features(tmp_path):
    from svt.report import EvaluateOptions, evaluate
    from svt.report.render import to_markdown

    import_trace("arctic-sim", FIX / "arctic_sim.csv", tmp_path / "a")
    import_trace("vllm-steps", FIX / "vllm_steps.jsonl", tmp_path / "v")
    rep = evaluate([tmp_path / "a"], EvaluateOptions(by="workload"))
    assert rep["groups_acceptance"]["workload"]["task 1"] == {"n": 4, "accept_rate": 0.75}
    assert "| task 1 | 4 | 0.7500 |" in to_markdown(rep)
    both = evaluate([tmp_path / "a", tmp_path / "v"], EvaluateOptions())
    assert both["groups_acceptance"]["run"]["v"]["n"] == 11


def test_inspect_says_a_run_is_imported(tmp_path):
    import_trace("vllm-steps", FIX / "vllm_steps.jsonl", tmp_path / "run")
    res = CliRunner().invoke(app, ["inspect", str(tmp_path / "run")])
    assert res.exit_code == 0 and "imported (vllm-steps)" in res.output and "q_max" in res.output, res.output


def test_vllm_response_bodies_with_detailed_metrics(tmp_path):
    """vLLM's own layout: a response whose metrics.speculative_decoding holds per_step_drafted and
    per_step_accepted (--per-request-spec-decode-metrics detailed), checked against its totals."""
    s = import_trace("vllm-steps", FIX / "vllm_responses.jsonl", tmp_path / "run")
    assert (s.requests, s.steps, s.drafts, s.labelled, s.accepted) == (1, 2, 6, 4, 2)
    assert _drafts(tmp_path / "run")["label"].to_list() == [1, 1, 0, 0, None, None]
    body = json.loads((FIX / "vllm_responses.jsonl").read_text())
    for change, match in ((lambda sd: sd.update(num_accepted_draft_tokens=3), "`num_accepted_draft_tokens` is 3"),
                          (lambda sd: (sd.pop("per_step_accepted"), sd.pop("per_step_drafted")),
                           "--per-request-spec-decode-metrics detailed"),
                          (lambda sd: sd.update(num_spec_tokens=2), "more than `num_spec_tokens` 2")):
        bad = json.loads(json.dumps(body))
        change(bad["metrics"]["speculative_decoding"])
        (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
        with pytest.raises(ImportFormatError, match=match):
            import_trace("vllm-steps", tmp_path / "bad.jsonl", tmp_path / "bad")
    body["metrics"]["speculative_decoding"] = None
    (tmp_path / "null.jsonl").write_text(json.dumps(body) + "\n")
    with pytest.raises(ImportFormatError, match="only for n == 1"):
        import_trace("vllm-steps", tmp_path / "null.jsonl", tmp_path / "bad")


def test_a_lacked_column_must_be_empty(tmp_path):
    """run.json's `lacks` is held to the data: a column it calls lacking that holds values is damage."""
    (tmp_path / "t.csv").write_text("r,s,p,l,q\n0,0,0,1,0.9\n0,0,1,0,0.4\n")
    (tmp_path / "m.yaml").write_text("rows: drafts\ncolumns: {request: r, step: s, position: p, label: l, q_max: q}\n")
    import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    meta["import"]["lacks"]["drafts"].append("q_max")
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="`q_max` has 2 bad value.*lacks this column"):
        open_run(tmp_path / "run")


@pytest.mark.parametrize("importer_checks", [True, False])
def test_what_only_the_reader_checks_is_caught_before_the_swap(tmp_path, monkeypatch, importer_checks):
    """A negative entropy is said by the import naming the source's row; without that check (any
    value the importer does not check itself) reading the staged run back in full still catches
    it: nothing is written either way."""
    import svt.interop.base as base

    if not importer_checks:
        monkeypatch.setattr(base, "_check_within_rows", lambda *a: None)
    (tmp_path / "t.csv").write_text("r,s,p,l,e\n0,0,0,1,-0.5\n")
    (tmp_path / "m.yaml").write_text("rows: drafts\ncolumns: {request: r, step: s, position: p, label: l, "
                                     "q_entropy: e}\n")
    err, match = ((ImportFormatError, r"request 0 step 0 position 0 has `q_entropy` -0.5: NaN or negative")
                  if importer_checks else (SchemaError, "`q_entropy` has 1 bad value"))
    with pytest.raises(err, match=match):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")
    assert not (tmp_path / "run").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_the_shipped_table_fixture_and_mapping(tmp_path):
    """drafts_table.csv through drafts_mapping.yaml (the guide's example layout), counted by hand."""
    s = import_trace("table", FIX / "drafts_table.csv", tmp_path / "run", mapping=FIX / "drafts_mapping.yaml")
    assert (s.requests, s.steps, s.drafts, s.labelled, s.accepted) == (2, 3, 8, 7, 5)
    reqs = open_run(tmp_path / "run").scan("requests").sort("request").collect()
    assert reqs["workload"].to_list() == ["qa", "code"]
    meta = json.loads((tmp_path / "run" / "run.json").read_text())["import"]
    assert "q_max" not in meta["lacks"]["drafts"] and "q_entropy" in meta["lacks"]["drafts"]
    assert any("the features that read q_sampled, q_entropy, q_margin" in c for c in meta["cannot_study"])


def test_an_imported_run_without_draft_probabilities_can_be_regression_tested(tmp_path):
    """Issue 34: `svt compare` of such imports said "an empty or damaged report"; it compares the
    sections they have (acceptance by position and their replays) and catches a change."""
    r = CliRunner()
    for name in ("a", "b"):
        import_trace("vllm-steps", FIX / "vllm_steps.jsonl", tmp_path / f"run-{name}")
        res = r.invoke(app, ["evaluate", str(tmp_path / f"run-{name}"), "--out", str(tmp_path / f"rep-{name}")])
        assert res.exit_code == 0, res.output
    rep = json.loads((tmp_path / "rep-a" / "report.json").read_text())
    assert not rep["features"] and rep["acceptance"]
    same = r.invoke(app, ["compare", str(tmp_path / "rep-a"), str(tmp_path / "rep-b")])
    assert same.exit_code == 0 and "damaged" not in same.output, same.output
    result = json.loads((tmp_path / "rep-b" / "regression.json").read_text())
    assert result["compared"] > 0 and result["verdict"] == "ok"


@pytest.mark.parametrize("ms", ["-5", "inf", "1e308"])
def test_a_table_step_time_that_is_no_time_is_refused(tmp_path, ms):
    (tmp_path / "t.csv").write_text(f"r,s,d,a,t\n7,0,4,4,2.5\n7,1,4,1,{ms}\n")
    (tmp_path / "m.yaml").write_text("rows: steps\ncolumns: {request: r, step: s, drafted: d, accepted: a, draft_ms: t}\n")
    with pytest.raises(ImportFormatError, match=r"request 7 step 1 has draft_ms .*expected a time in milliseconds"):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")
    assert not (tmp_path / "run").exists()


def test_a_table_request_in_two_workloads_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("req,it,pos,ok,w\n0,0,0,1,qa\n0,1,0,0,code\n1,0,0,1,qa\n")
    (tmp_path / "m.yaml").write_text("rows: drafts\ncolumns: {request: req, step: it, position: pos, label: ok}\n"
                                     "workload: w\n")
    with pytest.raises(ImportFormatError, match=r"request 0 is in 2 workloads \((code, qa|qa, code)\)"):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


def test_an_accepted_draft_with_acceptance_probability_0_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("req,it,pos,ok,p\n0,0,0,1,0.5\n0,0,1,1,0.0\n")
    (tmp_path / "m.yaml").write_text("rows: drafts\ncolumns: {request: req, step: it, position: pos, label: ok, "
                                     "accept_prob: p}\n")
    with pytest.raises(ImportFormatError, match="position 1 was accepted with an acceptance probability of 0"):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


@pytest.mark.parametrize(("cols", "rows", "match"), [
    # a normalised entropy (in [0, 1]) mapped to svt's q_entropy, in nats: below -ln q_max
    ("q_max: c, q_entropy: h", "0,0,0,1,0.9,0.4\n0,0,1,0,0.2,0.4\n",
     r"request 0 step 0 position 1 has `q_entropy` 0.4: below -ln `q_max`"),
    ("q_max: c, q_margin: h", "0,0,0,1,0.9,0.05\n0,0,1,0,0.3,0.5\n",
     r"request 0 step 0 position 1 has `q_margin` 0.5: negative or above `q_max`"),
    ("q_max: c, q_entropy: h", "0,0,0,1,0.9,nan\n", r"position 0 has `q_entropy` nan: NaN or negative"),
])
def test_a_table_value_the_reader_refuses_is_refused_at_the_import(tmp_path, cols, rows, match):
    """Values each within its own column's range but impossible beside another of the row's (the
    reader's within-row checks) are said at the import, naming the source's request, step and
    position, not at every later read of the written run."""
    (tmp_path / "t.csv").write_text("req,it,pos,ok,c,h\n" + rows)
    (tmp_path / "m.yaml").write_text(f"rows: drafts\ncolumns: {{request: req, step: it, position: pos, label: ok, {cols}}}\n")
    with pytest.raises(ImportFormatError, match=match):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")
    assert not (tmp_path / "run").exists()


def test_a_table_step_emitting_more_than_it_accepted_is_refused_at_the_import(tmp_path):
    (tmp_path / "t.csv").write_text("r,s,d,a,e\n7,0,4,4,5\n7,1,4,1,4\n")
    (tmp_path / "m.yaml").write_text("rows: steps\ncolumns: {request: r, step: s, drafted: d, accepted: a, emitted: e}\n")
    with pytest.raises(ImportFormatError, match=r"request 7 step 1 has `emitted` 4: above `accepted` \+ 1"):
        import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")


def test_an_import_the_checks_pass_reads_back(tmp_path):
    """The same table with values that agree imports and is read whole (every check of the reader)."""
    (tmp_path / "t.csv").write_text("req,it,pos,ok,c,h\n0,0,0,1,0.9,0.4\n0,0,1,0,0.2,1.7\n")
    (tmp_path / "m.yaml").write_text("rows: drafts\ncolumns: {request: req, step: it, position: pos, label: ok, "
                                     "q_max: c, q_entropy: h}\n")
    import_trace("table", tmp_path / "t.csv", tmp_path / "run", mapping=tmp_path / "m.yaml")
    assert open_run(tmp_path / "run", deep=True).scan("drafts").collect().height == 2


def test_the_second_probes_import_inputs_are_one_message_each(tmp_path):
    """Found by a hostile probe: a mapping whose `rows` is a list, a JSON Lines id that is a list,
    two ids of the file that are one number, an empty workload cell (the error named the staging
    folder) and a step of batch size 0; each now one message naming the file's row or column."""
    def imp(name, text, mapping, ext="csv"):
        f = tmp_path / f"{name}.{ext}"
        f.write_text(text)
        (tmp_path / f"{name}.yaml").write_text(mapping)
        return import_trace("table", f, tmp_path / f"run-{name}", mapping=tmp_path / f"{name}.yaml")

    chain = "columns: {request: r, step: s, position: p, label: l}\n"
    with pytest.raises(ConfigError, match=r"`rows` must be drafts or steps, but got \['drafts'\]"):
        imp("listrows", "r,s,p,l\n0,0,0,1\n", "rows: [drafts]\n" + chain)
    with pytest.raises(ImportFormatError, match=r"listid.jsonl row \d+: `r` \(svt's `request`\) holds List\(Int64\) values \(\[0\]\)"):
        imp("listid", '{"r":[0],"s":0,"p":0,"l":1}\n{"r":[0],"s":1,"p":0,"l":1}\n', "rows: drafts\n" + chain, "jsonl")
    with pytest.raises(ImportFormatError, match=r"holds '007' and '7', two requests"):
        imp("ids", '{"r":"007","s":0,"p":0,"l":1}\n{"r":"7","s":0,"p":0,"l":0}\n', "rows: drafts\n" + chain, "jsonl")
    with pytest.raises(ImportFormatError, match=r"wl.csv row 2 \(line 3\): `w` \(the workload column\) is empty"):
        imp("wl", "r,s,p,l,w\n0,0,0,1,qa\n1,0,0,1,\n", "rows: drafts\n" + chain + "workload: w\n")
    with pytest.raises(ImportFormatError, match=r"request 7 step 1 has batch_size 0"):
        imp("bs", "r,s,d,a,b\n7,0,4,4,1\n7,1,4,1,0\n",
            "rows: steps\ncolumns: {request: r, step: s, drafted: d, accepted: a, batch_size: b}\n")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("run-")]
