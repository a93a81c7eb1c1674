"""The CLI as a user sees it: exit codes and messages, never a traceback."""

import json

from typer.testing import CliRunner

from svt.cli import app

runner = CliRunner()


def test_help_lists_working_commands_with_examples():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0 and "collect" in r.output and "inspect" in r.output
    for cmd in ("collect", "inspect"):
        r = runner.invoke(app, [cmd, "--help"])
        assert r.exit_code == 0 and "Example" in r.output


def test_missing_config_is_one_clear_message(tmp_path):
    r = runner.invoke(app, ["collect", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "Config file" in r.output and "not found" in r.output and "Traceback" not in r.output


def test_bad_model_path(tmp_path):
    (tmp_path / "w.jsonl").write_text(json.dumps({"prompt": "x = 1"}) + "\n")
    c = tmp_path / "c.yaml"
    c.write_text(f"target: {tmp_path}/no-model\ndraft: {tmp_path}/no-model\nworkloads: [{tmp_path}/w.jsonl]\n")
    r = runner.invoke(app, ["collect", str(c), "--out", str(tmp_path / "o")])
    assert r.exit_code == 4 and "is not one" in r.output and "Traceback" not in r.output


def test_bad_workload_line(tmp_path, models_dir):
    (tmp_path / "w.jsonl").write_text('{"prompt": "ok"}\n{"text": 3}\n')
    c = tmp_path / "c.yaml"
    c.write_text(f"target: {models_dir}/target\ndraft: {models_dir}/draft-small\nworkloads: [{tmp_path}/w.jsonl]\n")
    r = runner.invoke(app, ["collect", str(c), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "w.jsonl:2" in r.output


def test_collect_then_inspect_with_overrides(tmp_path, models_dir):
    (tmp_path / "w.jsonl").write_text(json.dumps({"prompt": "for i in range(10):\n    "}) + "\n"
                                      + json.dumps({"prompt": "while True:\n    "}) + "\n")
    c = tmp_path / "c.yaml"
    c.write_text(f"target: {models_dir}/target\ndraft: {models_dir}/draft-small\nworkloads: [code]\n")
    out = tmp_path / "run"
    r = runner.invoke(app, ["collect", str(c), "--out", str(out), "--workload", str(tmp_path / "w.jsonl"),
                            "--limit-requests", "2", "--max-new-tokens", "6", "--set", "k=2", "--quiet",
                            "--device", "cpu"])
    assert r.exit_code == 0, r.output
    meta = json.loads((out / "run.json").read_text())
    assert meta["config"]["requests"] == 2 and meta["config"]["k"] == 2
    r = runner.invoke(app, ["inspect", str(out)])
    assert r.exit_code == 0 and "conditional" in r.output and "marginal" in r.output
    r = runner.invoke(app, ["collect", str(c), "--out", str(out)])
    assert r.exit_code == 2 and "--resume" in r.output


def test_inspect_a_damaged_run(tmp_path):
    (tmp_path / "run.json").write_text("{not json")
    r = runner.invoke(app, ["inspect", str(tmp_path)])
    assert r.exit_code == 3 and "run.json: not valid JSON" in r.output


def test_cache_command_on_bad_input(tmp_path, small_run, greedy_run):
    r = runner.invoke(app, ["cache", str(small_run)])  # temperature 1: no oracle yields
    assert r.exit_code == 2 and "greedy" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["cache", str(greedy_run), "--set", "max_draft_len=0"])
    assert r.exit_code == 2 and "cache.max_draft_len" in r.output
    r = runner.invoke(app, ["cache", str(tmp_path / "nope")])
    assert r.exit_code == 3 and "run.json" in r.output


def test_cache_command_redoes_the_table(tmp_path, greedy_run):
    import shutil

    import polars as pl

    run = tmp_path / "g"
    shutil.copytree(greedy_run, run)
    before = pl.read_parquet(run / "cache_drafts").sort("request", "decode_pos")
    r = runner.invoke(app, ["cache", str(run), "--set", "max_draft_len=3", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    after = pl.read_parquet(run / "cache_drafts").sort("request", "decode_pos")
    assert after.height == before.height and after["draft_len"].max() <= 3 < before["draft_len"].max()
    assert (after["model_accepted"] == before["model_accepted"]).all()
    assert json.loads((run / "run.json").read_text())["cache"]["options"]["max_draft_len"] == 3
    assert not list(run.glob(".cache_drafts*"))  # nothing left beside the swapped table


def test_cache_command_checks_moved_models_by_hash(tmp_path, greedy_run, models_dir):
    r = runner.invoke(app, ["cache", str(greedy_run), "--draft", str(models_dir / "draft-small")])
    assert r.exit_code == 4 and "weights differ" in r.output and "Traceback" not in r.output
