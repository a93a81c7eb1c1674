"""Never lose a run: validation before writing, overwrite written beside and swapped in, resume
refusing changed inputs, profile-costs refusing to clobber."""

import dataclasses
import json
import shutil

import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.collect import collect
from svt.errors import ConfigError, DataError, ModelLoadError
from svt.traces import open_run

from .test_runner import cfg  # noqa: F401  (the fixture)


@pytest.fixture()
def done(cfg, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    collect(cfg, out, progress=False)
    return out


def _snapshot(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_overwrite_with_a_bad_workload_or_model_keeps_the_old_run(cfg, done, tmp_path):  # noqa: F811
    before = _snapshot(done)
    bad = dataclasses.replace(cfg, workloads=["prsoe"])
    with pytest.raises(ConfigError, match="prsoe"):
        collect(bad, done, overwrite=True, progress=False)
    with pytest.raises(ModelLoadError):
        collect(dataclasses.replace(cfg, draft=str(tmp_path / "nope")), done, overwrite=True, progress=False)
    assert _snapshot(done) == before
    r = CliRunner().invoke(app, ["collect", str(tmp_path / "c.yaml"), "--out", str(done), "--overwrite"])
    assert r.exit_code == 2 and _snapshot(done) == before


def test_overwrite_interrupted_midway_keeps_the_old_run(cfg, done, monkeypatch):  # noqa: F811
    from svt.collect import runner as runner_mod

    before = _snapshot(done)
    real = runner_mod.run_batch
    calls = {"n": 0}

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner_mod, "run_batch", dies)
    with pytest.raises(KeyboardInterrupt):
        collect(dataclasses.replace(cfg, seed=7), done, overwrite=True, progress=False)
    assert _snapshot(done) == before
    assert not list(done.parent.glob(".run.svt-*"))  # the partial new run is not left behind
    monkeypatch.setattr(runner_mod, "run_batch", real)
    s = collect(dataclasses.replace(cfg, seed=7), done, overwrite=True, progress=False)
    assert s.run_dir == done and open_run(done).meta["config"]["seed"] == 7
    assert not list(done.parent.glob(".run.svt-*"))  # nothing left beside it


def test_seed_must_be_non_negative(cfg, tmp_path):  # noqa: F811
    from svt.config import load_collect_config

    with pytest.raises(ConfigError, match="seed"):
        load_collect_config(None, base={**dataclasses.asdict(cfg), "seed": -1})
    assert load_collect_config(None, base={**dataclasses.asdict(cfg), "top_p": "5e-1"}).top_p == 0.5


def test_resume_refuses_changed_models_and_prompts(cfg, tmp_path, models_dir):  # noqa: F811
    draft = tmp_path / "draft"
    shutil.copytree(models_dir / "draft-small", draft)
    cfg = dataclasses.replace(cfg, draft=str(draft))
    done = tmp_path / "run2"
    collect(cfg, done, progress=False)
    meta = json.loads((done / "run.json").read_text())
    meta["status"] = "running"
    (done / "run.json").write_text(json.dumps(meta))
    shutil.rmtree(draft)
    shutil.copytree(models_dir / "draft-large", draft)  # other weights under the same path
    with pytest.raises(ConfigError, match="draft model's weights changed"):
        collect(cfg, done, resume=True, progress=False)
    shutil.rmtree(draft)
    shutil.copytree(models_dir / "draft-small", draft)
    w = tmp_path / "w1.jsonl"
    w.write_text(w.read_text().replace("add", "sub"))
    with pytest.raises(ConfigError, match="prompt file of workload 'w1' changed"):
        collect(cfg, done, resume=True, progress=False)


def test_incomplete_runs_are_reported_and_refused(done):
    from svt.fit import fit_runs
    from svt.report import EvaluateOptions, evaluate

    meta = json.loads((done / "run.json").read_text())
    meta["status"] = "running"
    (done / "run.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="incomplete"):
        evaluate([done], EvaluateOptions(features=["q_max"]))
    with pytest.raises(DataError, match="incomplete"):
        fit_runs([done], "logistic")
    r = CliRunner().invoke(app, ["inspect", str(done)])
    assert r.exit_code == 0 and "INCOMPLETE" in r.output


def test_stray_copy_refused_on_read_and_resume(cfg, done):  # noqa: F811
    from svt.errors import SchemaError

    shutil.copy(done / "requests" / "part-00001.parquet", done / "requests" / "part-00001 (copy).parquet")
    with pytest.raises(SchemaError, match="not a shard"):
        open_run(done)
    with pytest.raises(ConfigError, match="not a shard"):
        collect(cfg, done, resume=True, progress=False)


def test_profile_costs_refuses_to_clobber(cfg, done, tmp_path):  # noqa: F811
    c = tmp_path / "c.yaml"
    c.write_text(json.dumps(dataclasses.asdict(cfg)))
    before = (done / "run.json").read_bytes()
    for out, msg in ((done / "run.json", ".yaml"), (done, "directory"), (c, "exists")):
        r = CliRunner().invoke(app, ["collect", str(c), "--profile-costs", "--out", str(out)])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, r.output
    assert (done / "run.json").read_bytes() == before


def test_sigterm_during_an_overwrite_keeps_the_old_run_and_leaves_nothing(cfg, done, tmp_path):  # noqa: F811
    """Issue 23: SIGTERM during `collect --overwrite` left `.RUN.svt-new` beside the run."""
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from svt.config import to_dict

    before = _snapshot(done)
    conf = tmp_path / "c.yaml"
    conf.write_text(yaml.safe_dump({**to_dict(cfg), "requests": 400, "repeat": True, "max_new_tokens": 64}))
    proc = subprocess.Popen([sys.executable, "-m", "svt.cli", "collect", str(conf), "--out", str(done), "--overwrite",
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    staged = done.parent / f".{done.name}.svt-new"
    deadline = time.time() + 120
    while not (staged / "run.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert (staged / "run.json").exists(), "the overwrite never started"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not staged.exists() and not (done.parent / f".{done.name}.svt-old").exists()
    assert _snapshot(done) == before
