"""`python -m svt.traces.synthetic`: bad input gets one message and an exit code; an interrupted
write leaves nothing behind."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest


def _run(*args):
    return subprocess.run([sys.executable, "-m", "svt.traces.synthetic", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, code, words", [
    (["--labelled", "0"], 2, "whole number"),
    (["--labelled", "nan"], 2, "whole number"),
    (["--labelled", "1e30"], 2, "whole number"),
    (["--labelled", "100", "--shard-labelled", "-1"], 2, "whole number"),
    (["--labelled", "100", "--seed", "-1"], 2, "seed"),
])
def test_bad_numbers_are_refused(small_run, tmp_path, args, code, words):
    r = _run(small_run, tmp_path / "out", *args)
    assert r.returncode == code and words in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_missing_existing_and_incomplete_inputs(small_run, tmp_path):
    r = _run(tmp_path / "nope", tmp_path / "out", "--labelled", "100")
    assert r.returncode == 3 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
    r = _run(small_run, small_run, "--labelled", "100")
    assert r.returncode == 2 and "exists" in r.stderr
    import shutil

    src = tmp_path / "running"
    shutil.copytree(small_run, src)
    meta = json.loads((src / "run.json").read_text())
    meta["status"] = "running"
    (src / "run.json").write_text(json.dumps(meta))
    r = _run(src, tmp_path / "out", "--labelled", "100")
    assert r.returncode == 5 and "incomplete" in r.stderr and not (tmp_path / "out").exists()


def test_a_terminated_write_leaves_nothing(small_run, tmp_path):
    out = tmp_path / "big"
    proc = subprocess.Popen([sys.executable, "-m", "svt.traces.synthetic", str(small_run), str(out),
                             "--labelled", "3e7", "--shard-labelled", "2e5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob(".big.tmp-*")) and time.time() < deadline:
        time.sleep(0.1)
    assert list(tmp_path.glob(".big.tmp-*")), "the write never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "nothing was written" in err
    assert not out.exists() and not list(tmp_path.glob(".big.tmp-*"))
    assert os.listdir(tmp_path) == []


def test_an_output_inside_the_source_run_and_a_run_without_labels_are_refused(small_run, greedy_run, tmp_path):
    """Issue 23: `svt.traces.synthetic RUN RUN/drafts/x` wrote inside its source run."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(small_run, src)
    before = sorted(p.name for p in (src / "drafts").iterdir())
    r = _run(src, src / "drafts" / "x", "--labelled", "100")
    assert r.returncode == 2 and "inside the source run" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in (src / "drafts").iterdir()) == before
    # a run whose steps verified no draft (its tables agreeing on it): nothing to resample, said in one line
    empty = tmp_path / "empty"
    shutil.copytree(small_run, empty)
    import polars as pl

    from svt.traces.io import record_shards, write_meta

    meta = json.loads((empty / "run.json").read_text())
    for table, change in (("drafts", [pl.lit(None, pl.Int8).alias("label")]),
                          ("steps", [pl.lit(0, pl.Int16).alias(c) for c in ("accepted", "kept")]
                           + [pl.lit(1, pl.Int16).alias("emitted"), pl.lit(False).alias("explored")])):
        parts = sorted((empty / table).glob("part-*.parquet"))
        for p in parts:
            pl.read_parquet(p).with_columns(change).write_parquet(p)
        record_shards(meta, table, parts)
    from tests.conftest import outputs_agreeing, schedule_agreeing

    outputs_agreeing(empty)
    schedule_agreeing(empty)
    record_shards(meta, "requests", sorted((empty / "requests").glob("part-*.parquet")))
    record_shards(meta, "schedule", sorted((empty / "schedule").glob("part-*.parquet")))
    write_meta(empty, meta)
    r = _run(empty, tmp_path / "out", "--labelled", "100")
    assert r.returncode == 2 and "no labelled drafts" in r.stderr and "Traceback" not in r.stderr


def test_ctrl_c_while_a_shard_is_being_written_leaves_nothing(small_run, tmp_path):
    """Found by a probe: a Ctrl-C during the first shard's write left the shard's temporary file."""
    out = tmp_path / "big"
    proc = subprocess.Popen([sys.executable, "-m", "svt.traces.synthetic", str(small_run), str(out),
                             "--labelled", "3e6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not list(tmp_path.glob(".big.tmp-*/drafts/.part-*.tmp")) and time.time() < deadline:
        time.sleep(0.02)
    assert list(tmp_path.glob(".big.tmp-*/drafts/.part-*.tmp")), "no shard write was seen"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "nothing was written" in err
    assert os.listdir(tmp_path) == [], sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
