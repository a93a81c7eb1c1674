"""Sharded collection: n processes with --shard i/n, merged, give exactly the rows (and files) of an
unsharded collection; parts that do not belong together are refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from svt.cli import app
from svt.collect import collect
from svt.collect.shards import merge_shards, parse_shard, shard_batches
from svt.config import load_collect_config
from svt.errors import ConfigError
from svt.traces import open_run
from svt.traces.schema import TABLES

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"drafts": ["request", "step", "position"], "steps": ["request", "step"], "requests": ["request"],
        "hidden": ["request", "step", "position"], "dists": ["request", "step", "position"], "references": ["request"],
        "schedule": ["tick", "batch_size", "admitted", "draft_passes", "verify_tokens", "emitted"]}
TIMES = {"steps": ("draft_ms", "verify_ms"),
         "schedule": ("prefill_ms", "draft_ms", "verify_ms", "step_ms", "forward_ms")}


@pytest.fixture(scope="module")
def config(models_dir, tmp_path_factory):
    path = tmp_path_factory.mktemp("shardcfg") / "c.yaml"
    path.write_text(yaml.safe_dump({
        "target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
        "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
        "requests": 10, "batch_size": 3, "max_new_tokens": 16, "k": 4, "device": "cpu", "seed": 7,
        "log": {"hidden": True, "dists_fraction": 0.3}}))
    return path


@pytest.fixture(scope="module")
def whole(config, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    collect(load_collect_config(config), out, config_path=config, progress=False)
    return out


def _table(run, table):
    return open_run(run).scan(table).collect().sort(KEYS[table])


@pytest.mark.slow
def test_two_shard_processes_merge_into_the_unsharded_run(config, tmp_path):
    # one thread per process, in every process: BLAS reductions over another number of threads
    # round differently (features move by ~1e-6; tokens and labels do not), and the check is exact
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def start(out, *extra):
        return subprocess.Popen([sys.executable, "-m", "svt.cli", "collect", str(config), "--out", str(out),
                                 "--quiet", *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    whole = tmp_path / "whole"
    procs = [start(whole)]
    procs[0].communicate(timeout=300)
    procs = [start(tmp_path / f"part{i}", "--shard", f"{i}/2") for i in range(2)]
    for p in procs:  # both run at once, as two array jobs would
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    metas = [json.loads((tmp_path / f"part{i}" / "run.json").read_text()) for i in range(2)]
    assert [m["shard"]["batches"] for m in metas] == [[0, 2], [1, 3]]
    res = CliRunner().invoke(app, ["merge", str(tmp_path / "part1"), str(tmp_path / "part0"),
                                   "--out", str(tmp_path / "merged")])
    assert res.exit_code == 0, res.output
    merged = tmp_path / "merged"
    for table in TABLES:
        if not open_run(whole).has(table):
            assert not open_run(merged).has(table)
            continue
        a, b = _table(whole, table), _table(merged, table)
        if table in TIMES:  # measured wall-clock times differ from run to run; the rest is exact
            a, b = a.drop(*TIMES[table]), b.drop(*TIMES[table])
        assert a.equals(b), table
    mw, mm = json.loads((whole / "run.json").read_text()), json.loads((merged / "run.json").read_text())
    assert mm["counts"] == mw["counts"] and mm["config"] == mw["config"] and "shard" not in mm
    # the same shard files (names, rows); content hashes too, except steps (their timings)
    assert {t: {f: r["rows"] for f, r in v.items()} for t, v in mm["shards"].items()} == \
           {t: {f: r["rows"] for f, r in v.items()} for t, v in mw["shards"].items()}
    for table in ("drafts", "requests", "hidden", "dists"):
        if table in mw["shards"]:
            assert mm["shards"][table] == mw["shards"][table], table
    assert [e["shard"] for e in mm["merged"]["from"]] == ["1/2", "0/2"]
    # the merged run is an ordinary run for everything downstream
    res = CliRunner().invoke(app, ["evaluate", str(merged), "--out", str(tmp_path / "rep"), "--feature", "q_max"])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def shards(config, tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    cfg = load_collect_config(config)
    for i in range(3):
        collect(cfg, d / f"s{i}", config_path=config, progress=False, shard=(i, 3))
    return d


def test_merge_refuses_parts_that_are_not_one_run(config, whole, shards, tmp_path):
    s = [shards / f"s{i}" for i in range(3)]
    with pytest.raises(ConfigError, match="missing 2/3"):
        merge_shards(s[:2], tmp_path / "a")
    with pytest.raises(ConfigError, match="given twice"):
        merge_shards([s[0], s[0], s[1]], tmp_path / "b")
    with pytest.raises(ConfigError, match="not a shard"):
        merge_shards([whole, *s], tmp_path / "c")
    other = tmp_path / "other"
    collect(load_collect_config(config, {"seed": 8}), other, config_path=config, progress=False, shard=(2, 3))
    with pytest.raises(ConfigError, match="config differs"):
        merge_shards([s[0], s[1], other], tmp_path / "d")
    # an interrupted shard is refused, and nothing is written
    meta = json.loads((s[1] / "run.json").read_text())
    (s[1] / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    try:
        with pytest.raises(Exception, match="incomplete"):
            merge_shards(s, tmp_path / "e")
        assert not (tmp_path / "e").exists() and not (tmp_path / ".e.svt-new").exists()
    finally:
        (s[1] / "run.json").write_text(json.dumps(meta))
    merge_shards(s, tmp_path / "f", link=True)
    assert _table(tmp_path / "f", "drafts").equals(_table(whole, "drafts"))
    with pytest.raises(ConfigError, match="exists"):
        merge_shards(s, tmp_path / "f")


def test_shard_options_are_checked(config, shards, tmp_path):
    assert parse_shard("0/1") == (0, 1) and parse_shard(" 3/4 ") == (3, 4)
    for bad in ("2/2", "1/0", "-1/2", "a/b", "1"):
        with pytest.raises(ConfigError, match="--shard"):
            parse_shard(bad)
    assert shard_batches(7, (1, 3)) == [1, 4] and shard_batches(3, None) == [0, 1, 2]
    cfg = load_collect_config(config)
    with pytest.raises(ConfigError, match="no batches"):
        collect(cfg, tmp_path / "x", config_path=config, progress=False, shard=(5, 6))
    with pytest.raises(ConfigError, match="global suffix tree"):
        collect(load_collect_config(config, {"temperature": 0, "cache": True}), tmp_path / "y",
                config_path=config, progress=False, shard=(0, 2))
    with pytest.raises(ConfigError, match="Cannot resume"):  # a shard resumed as another shard
        collect(cfg, shards / "s0", config_path=config, progress=False, resume=True, shard=(1, 3))


def test_cache_on_a_shard_and_merging_cached_shards_are_refused(config, shards, tmp_path):
    """Issue 23: `svt cache` on shards then `svt merge` gave a wrong cache table (each shard's global
    tree saw only its own responses), with run.json claiming the first shard's options."""
    greedy = tmp_path / "g0"
    collect(load_collect_config(config, {"temperature": 0, "requests": 4, "batch_size": 2}), greedy,
            config_path=config, progress=False, shard=(0, 2))
    res = CliRunner().invoke(app, ["cache", str(greedy)])
    assert res.exit_code == 2 and "a shard (0/2)" in res.output and "Traceback" not in res.output
    assert not open_run(greedy).has("cache_drafts")
    # shards that carry cache tables anyway (made by hand or by an older svt): merge refuses them
    s = [shards / f"s{i}" for i in range(3)]
    meta = json.loads((s[1] / "run.json").read_text())
    (s[1] / "run.json").write_text(json.dumps({**meta, "cache": {"options": {"max_tree_depth": 24}}}))
    try:
        res = CliRunner().invoke(app, ["merge", *map(str, s), "--out", str(tmp_path / "m")])
        assert res.exit_code == 2 and "holds cache drafts" in res.output
        assert not (tmp_path / "m").exists()
    finally:
        (s[1] / "run.json").write_text(json.dumps(meta))


def test_link_across_file_systems_is_one_clear_error(shards, tmp_path, monkeypatch):
    import errno

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    s = [str(shards / f"s{i}") for i in range(3)]
    res = CliRunner().invoke(app, ["merge", *s, "--out", str(tmp_path / "m"), "--link"])
    assert res.exit_code == 2 and "one file system" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m*"))


def test_merge_never_writes_over_one_of_its_shards(shards, tmp_path):
    """Found by a probe: `svt merge s0 s1 --out s0 --overwrite` replaced the input shard s0."""
    s = [shards / f"s{i}" for i in range(3)]
    before = (s[0] / "run.json").read_text()
    for extra in ([], ["--link"]):
        res = CliRunner().invoke(app, ["merge", *map(str, s), "--out", str(s[0]), "--overwrite", *extra])
        assert res.exit_code == 2 and "overlaps the shard" in res.output
    assert (s[0] / "run.json").read_text() == before
    (tmp_path / "afile").write_text("x")
    res = CliRunner().invoke(app, ["merge", *map(str, s), "--out", str(tmp_path / "afile")])
    assert res.exit_code == 2 and "is a file" in res.output and (tmp_path / "afile").read_text() == "x"
