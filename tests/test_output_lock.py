"""One writer per output (issue 34): a second svt command writing the same --out is refused at
once and the first one's result is whole; a killed writer's lock never blocks the next command and
its leftovers are cleaned by it; an --out inside a run directory is refused by every writer."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError
from svt.fileio import atomic_path, output_lock

FIX = Path(__file__).parent / "interop" / "fixtures"
runner = CliRunner()


def test_a_second_writer_is_refused_while_the_first_holds_the_output(tmp_path):
    out = tmp_path / "run"
    with output_lock(out):
        with pytest.raises(ConfigError, match=f"being written by another svt command \\(pid {os.getpid()}\\)"):
            with output_lock(out):
                pass
    assert not (tmp_path / ".run.svt-lock").exists()  # removed by its holder
    with output_lock(out):  # free again
        pass


def test_a_killed_writer_does_not_block_the_next(tmp_path):
    out = tmp_path / "run"
    code = ("import sys, time\nfrom svt.fileio import output_lock\n"
            f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {proc.pid}"):
            with output_lock(out):
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert (tmp_path / ".run.svt-lock").exists()  # kill -9: no cleanup ran, but the kernel let go
    with output_lock(out):
        pass


def test_two_imports_to_one_out_give_one_run_and_one_refusal(tmp_path):
    out = tmp_path / "run"
    ok = runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    before = (out / "run.json").read_text()
    with output_lock(out):  # another import is writing it
        r = runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(out),
                                "--overwrite"])
    assert r.exit_code == 2 and "being written by another svt command" in r.output, r.output
    assert (out / "run.json").read_text() == before and not (tmp_path / ".run.svt-new").exists()


def test_a_killed_writers_staging_folder_is_cleaned_by_the_next(tmp_path):
    out = tmp_path / "run"
    stale = tmp_path / ".run.svt-new"
    stale.mkdir()
    (stale / "half.parquet").write_text("x")
    r = runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(out)])
    assert r.exit_code == 0 and not stale.exists() and (out / "run.json").is_file(), r.output


@pytest.mark.parametrize("where", ["drafts", "drafts/deeper", "."])
def test_an_out_inside_a_run_is_refused_by_import_and_evaluate(tmp_path, where):
    host = tmp_path / "host"
    assert runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(host)]).exit_code == 0
    listing = sorted(str(p.relative_to(host)) for p in host.rglob("*"))
    inside = host / where / "new"
    r = runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(inside)])
    assert r.exit_code == 2 and f"inside the run {host}" in r.output, r.output
    r = runner.invoke(app, ["evaluate", str(host), "--out", str(inside), "--feature", "position"])
    assert r.exit_code == 2 and f"inside the run {host}" in r.output, r.output
    assert sorted(str(p.relative_to(host)) for p in host.rglob("*")) == listing
    assert runner.invoke(app, ["inspect", str(host)]).exit_code == 0


def test_atomic_writes_of_two_processes_never_share_a_temporary_file(tmp_path):
    target = tmp_path / "f.json"
    with atomic_path(target) as tmp:
        assert str(os.getpid()) in tmp.name and tmp.parent == tmp_path
        tmp.write_text(json.dumps({"a": 1}))
        time.sleep(0)
    assert json.loads(target.read_text()) == {"a": 1}


def test_a_collect_to_an_output_being_written_is_refused_before_it_plans(tmp_path):
    out = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "configs" / "collect" / "ci.yaml"
    with output_lock(out):
        r = runner.invoke(app, ["collect", str(config), "--out", str(out), "--quiet"])
    assert r.exit_code == 2 and "being written by another svt command" in r.output, r.output
    assert not out.exists()


def test_a_symlinked_out_is_refused_and_left_as_it_is(tmp_path):
    real = tmp_path / "real"
    assert runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(real)]).exit_code == 0
    link = tmp_path / "link"
    link.symlink_to(real)
    r = runner.invoke(app, ["import", "vllm-steps", str(FIX / "vllm_steps.jsonl"), "--out", str(link), "--overwrite"])
    assert r.exit_code == 2 and "is a symbolic link" in r.output, r.output
    assert link.is_symlink() and (real / "run.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "real"]
