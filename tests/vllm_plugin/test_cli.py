"""`svt collect --engine vllm` and `svt vllm-finish` as a user sees them (no vLLM needed)."""

import importlib.util

import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.traces.io import open_run
from svt.vllm_plugin.recorder import Recorder
from tests.vllm_plugin.test_recorder import _engine

runner = CliRunner()
CONFIG = "configs/collect/vllm.yaml"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_engine_vllm_without_vllm_says_how_to_get_it(tmp_path):
    r = runner.invoke(app, ["collect", CONFIG, "--engine", "vllm", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "make setup-vllm" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (["--engine", "sglang"], "Unknown --engine"),
    (["--engine", "vllm", "--shard", "0/2"], "collects whole runs"),
    (["--engine", "vllm", "--set", "log.hidden=true"], "log.hidden"),
    (["--engine", "vllm", "--set", "vllm.draft_sample_method=random"], "vllm.draft_sample_method"),
    (["--engine", "vllm", "--set", "vllm.engine_args.seed=3"], "vllm.engine_args.seed"),
    (["--engine", "vllm", "--set", "vllm.kv_cache_gib=0"], "vllm.kv_cache_gib"),
    (["--engine", "vllm", "--set", "vllm.max_model_len=400"], "vllm.max_model_len"),
])
def test_bad_vllm_options_are_one_message(tmp_path, args, message):
    r = runner.invoke(app, ["collect", CONFIG, "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_collect_into_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "afile").write_text("x")
    r = runner.invoke(app, ["collect", CONFIG, "--engine", "vllm", "--out", str(tmp_path / "afile"), "--overwrite"])
    assert r.exit_code == 2 and "is a file" in r.output and (tmp_path / "afile").read_text() == "x"


def test_collect_vllm_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text("x")
    r = runner.invoke(app, ["collect", CONFIG, "--engine", "vllm", "--out", str(project), "--overwrite"])
    assert r.exit_code == 2 and "not a run directory" in r.output, r.output
    assert (project / "main.py").read_text() == "x"


def test_vllm_finish_overwrite_refuses_a_folder_that_is_not_a_run(tmp_path):
    _engine(Recorder(tmp_path / "trace"))
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "main.py").write_text("x")
    r = runner.invoke(app, ["vllm-finish", str(tmp_path / "trace"), "--out", str(tmp_path / "project"), "--overwrite"])
    assert r.exit_code == 2 and "not a run directory" in r.output, r.output
    assert (tmp_path / "project" / "main.py").read_text() == "x"


def test_vllm_finish(tmp_path):
    _engine(Recorder(tmp_path / "trace"))
    r = runner.invoke(app, ["vllm-finish", str(tmp_path / "trace"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert open_run(tmp_path / "run").meta["counts"]["requests"] == 4
    r = runner.invoke(app, ["vllm-finish", str(tmp_path / "trace"), "--out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "--overwrite" in r.output
    r = runner.invoke(app, ["vllm-finish", str(tmp_path / "nothing"), "--out", str(tmp_path / "r2")])
    assert r.exit_code == 5 and "no `spool` folder" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["evaluate", str(tmp_path / "run"), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
