"""``svt evaluate RUN --cluster local:2`` on a real dask cluster against the single-machine report
of the same run: identical counts and acceptance, AUCs equal (exact after the refining pass, bound
0), float sums to 1e-12; options it cannot compute are refused naming each; bad specs are one
clear message."""

import json

import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.distributed.engines import parse_cluster
from svt.errors import ConfigError
from svt.report import EvaluateOptions, evaluate

FEATURES = ["q_max", "logit_qmax", "entropy", "margin"]


@pytest.fixture(scope="module")
def cluster_report(small_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster")
    args = ["evaluate", str(small_run), "--out", str(out), "--cluster", "local:2"]
    for f in FEATURES:
        args += ["--feature", f]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def test_the_cluster_report_equals_the_single_machine_one(cluster_report, small_run):
    got, md = cluster_report
    whole = evaluate([small_run], EvaluateOptions(features=FEATURES))
    ref = whole["features"]
    assert got["cluster"]["workers"] == 2 and got["cluster"]["shards"] >= 1
    assert got["runs"][0]["data_sha256"] == whole["runs"][0]["data_sha256"]  # the identity, merged from the workers'
    assert got["runs"][0]["data_identity"]["rows"] == whole["runs"][0]["data_identity"]["rows"]
    for name in FEATURES:
        g, r = got["features"][name], ref[name]
        scopes = [(g, r), (g["excluding_first"], r["excluding_first"]),
                  *[(g["per_position"][str(j)], r["per_position"][j]) for j in r["per_position"]]]
        for a, b in scopes:
            assert a["n"] == b["n"] and a["accept_rate"] == pytest.approx(b["accept_rate"], abs=1e-15)
            assert a["auc"] == pytest.approx(b["auc"], abs=1e-12) and a["auc_bound"] == 0.0
            assert a.get("reasons") == b.get("reasons") and ("auc_raw" in a) == ("auc_raw" in b)
            assert a.get("auc_raw", 0) == pytest.approx(b.get("auc_raw", 0), abs=1e-12)
            for m in ("log_loss", "brier", "mean_pred", "ece", "ece_mass"):
                if b.get(m) is not None and a.get(m) is not None:
                    assert a[m] == pytest.approx(b[m], rel=1e-12, abs=1e-15), (name, m)
        assert (g.get("log_loss") is None) == (not r["probability"])
        assert (g.get("ece_mass") is None) == (r.get("ece_mass") is None)
    for name in FEATURES:  # the soft-label blocks: the AUC within the bound it prints, the sums to rounding
        g, r = got["features"][name]["soft"], ref[name]["soft"]
        assert set(g) == set(r) == {"accept_prob", "accept_prob_expected"}
        for c in r:
            a, b = g[c], r[c]
            assert a["n"] == b["n"] and a["accept_rate"] == pytest.approx(b["accept_rate"], rel=1e-12)
            assert abs(a["auc"] - b["auc"]) <= a["auc_bound"] + 1e-12 and a["auc_bound"] < 1e-3
            assert a.get("reasons") == b.get("reasons") and ("auc_raw" in a) == ("auc_raw" in b)
            for m in ("log_loss", "brier", "mean_pred", "ece", "ece_mass"):
                if b.get(m) is not None:  # (an ECE is a difference of sums: to 1e-12 of them)
                    assert a[m] == pytest.approx(b[m], rel=1e-12, abs=1e-12 if "ece" in m else 1e-15), (name, c, m)
    assert any("auc_raw" in got["features"][n] for n in FEATURES)  # a feature whose lower values accept
    assert any(got["features"][n].get("reasons") for n in FEATURES)  # a score that is no probability
    assert "## q_max" in md and "AUC bound" in md


@pytest.mark.parametrize("args, words", [
    (["--costs", "configs/costs/demo.yaml"], "--costs"),
    (["--bootstrap", "10"], "--bootstrap"),
    (["--bins", "0"], "--bins >= 1"),
    (["--seed", "3"], "--seed"),
    (["--tolerance", "auc=0.01"], "--tolerance"),
    (["--high-yield", "4"], "--high-yield"),
])
def test_what_the_cluster_does_not_compute_is_refused_by_name(small_run, tmp_path, args, words):
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "r"), "--cluster", "local:1", *args])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r" / "report.json").exists()


@pytest.mark.parametrize("spec", ["local:0", "local:x", "myhost:8786"])
def test_a_bad_cluster_spec_is_one_message(spec):
    with pytest.raises(ConfigError, match="--cluster"):
        parse_cluster(spec)


def test_the_report_says_each_workers_peak_memory(cluster_report):
    got, md = cluster_report
    peaks = got["cluster"]["worker_peak_gib"]
    assert len(peaks) == 2 and all(0.05 < p < 16 for p in peaks) and "peak memory per worker" in md


def test_a_second_engine_gives_the_same_report(cluster_report, small_run, tmp_path):
    """Ray behind the same interface (optional: skipped where `svt[cluster-ray]` is not installed)."""
    pytest.importorskip("ray")
    args = ["evaluate", str(small_run), "--out", str(tmp_path / "ray"), "--cluster", "local:2", "--cluster-engine", "ray"]
    for f in FEATURES:
        args += ["--feature", f]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "ray" / "report.json").read_text())
    assert got["cluster"]["engine"] == "ray" and got["cluster"]["workers"] == 2
    assert got["features"] == cluster_report[0]["features"]


def test_an_unknown_engine_is_one_message(small_run, tmp_path):
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "x"), "--cluster", "local:1",
                                 "--cluster-engine", "spark"])
    assert r.exit_code != 0 and "Unknown --cluster-engine 'spark'" in r.output and "Traceback" not in r.output


def test_by_a_drafts_column_equals_the_single_machines_groups(small_run, tmp_path):
    out = tmp_path / "by"
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(out), "--cluster", "local:2", "--by", "workload",
                                 "--feature", "q_max", "--feature", "entropy"])
    assert r.exit_code == 0, r.output
    got = json.loads((out / "report.json").read_text())["groups"]["workload"]
    ref = evaluate([small_run], EvaluateOptions(features=["q_max", "entropy"], by="workload"))["groups"]["workload"]
    assert set(got) == {str(v) for v in ref} and len(got) == 3
    for v, feats in ref.items():
        _equal_tables(got[str(v)], feats)
    assert "## q_max by workload" in (out / "report.md").read_text()
    bad = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "b2"), "--cluster", "local:1",
                                   "--by", "no_such_column"])
    assert bad.exit_code != 0 and "Cannot group by 'no_such_column'" in bad.output and "Traceback" not in bad.output


def test_roc_points_lie_on_the_roc_and_reliability_bins_are_the_single_machines(cluster_report, small_run):
    """Every ROC point the cluster gives is a point of scikit-learn's full ROC (all thresholds),
    from (0, 0) to (1, 1); the reliability bins equal the single machine's."""
    import numpy as np
    import polars as pl
    from sklearn.metrics import roc_curve

    from svt.features import get_feature
    from svt.traces import open_run

    got = cluster_report[0]["features"]
    ref = evaluate([small_run], EvaluateOptions(features=FEATURES))["features"]
    drafts = open_run(small_run).scan("drafts").filter(pl.col("label").is_not_null()).collect()
    for name in FEATURES:
        f = get_feature(name)
        s = drafts.select(f.expr.cast(pl.Float64)).to_series().to_numpy() * f.direction
        fpr, tpr, _ = roc_curve(drafts["label"].to_numpy(), s, drop_intermediate=False)
        full = np.c_[fpr, tpr]
        roc = got[name]["curves"]["roc"]
        pts = np.c_[roc["fpr"], roc["tpr"]]
        assert pts[0].tolist() == [0.0, 0.0] and pts[-1] == pytest.approx([1.0, 1.0])
        for p in pts:
            assert np.abs(full - p).sum(axis=1).min() < 1e-12
        if ref[name]["probability"]:
            a, b = got[name]["curves"]["reliability"], ref[name]["curves"]["reliability"]
            assert a["count"] == b["count"] and a["rate"] == pytest.approx(b["rate"], rel=1e-12)
            assert a["mean_pred"] == pytest.approx(b["mean_pred"], rel=1e-12)


def test_a_run_whose_shard_changed_is_refused_not_scored(small_run, tmp_path):
    """The cluster path reads the run as the single machine does: a shard whose content differs from
    run.json's hash is an error, not a report (a probe rewrote every label to 1 and got exit 0)."""
    import shutil

    import polars as pl

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    shard = sorted((run / "drafts").glob("*.parquet"))[0]
    pl.read_parquet(shard).with_columns(pl.when(pl.col("label").is_not_null()).then(1).otherwise(None)
                                        .cast(pl.Int8).alias("label")).write_parquet(shard)
    r = CliRunner().invoke(app, ["evaluate", str(run), "--out", str(tmp_path / "r"), "--cluster", "local:1"])
    assert r.exit_code != 0 and "SHA-256" in r.output and not (tmp_path / "r" / "report.json").exists()


@pytest.mark.parametrize("spec", ["tcp://127.0.0.1:abc", "ray://127.0.0.1:9"])
def test_an_address_dask_cannot_read_is_one_message(small_run, tmp_path, spec):
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "r"), "--cluster", spec])
    assert r.exit_code != 0 and "Could not join the dask scheduler" in r.output and "Traceback" not in r.output


def test_a_stale_regression_report_goes_when_the_cluster_overwrites(cluster_report, small_run, tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.json").write_text("{}")
    (out / "regression.md").write_text("old")
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(out), "--cluster", "local:1", "--overwrite",
                                 "--feature", "q_max"])
    assert r.exit_code == 0, r.output
    assert not (out / "regression.md").exists()


def _equal_tables(got: dict, ref: dict) -> None:
    assert set(got) == set(ref)
    for name, b in ref.items():
        a = got[name]
        for x, y in ((a, b), (a["excluding_first"], b["excluding_first"]),
                     *[(a["per_position"][str(j)], b["per_position"][j]) for j in b["per_position"]]):
            assert x["n"] == y["n"] and x["auc"] == pytest.approx(y["auc"], abs=1e-12) and x["auc_bound"] == 0.0
            for m in ("log_loss", "brier", "ece", "ece_mass"):
                if y.get(m) is not None:
                    assert x[m] == pytest.approx(y[m], rel=1e-12, abs=1e-15), (name, m)


def test_several_runs_pool_and_group_as_on_one_machine(small_run, greedy_run, tmp_path):
    """Two runs: the pooled table, the table per run and per value of --by (an integer column, named
    as the single machine names its values), each run's identity."""
    out = tmp_path / "two"
    r = CliRunner().invoke(app, ["evaluate", str(small_run), str(greedy_run), "--out", str(out), "--cluster", "local:2",
                                 "--feature", "q_max", "--feature", "margin", "--by", "position"])
    assert r.exit_code == 0, r.output
    got = json.loads((out / "report.json").read_text())
    ref = evaluate([small_run, greedy_run], EvaluateOptions(features=["q_max", "margin"], by="position"))
    _equal_tables(got["features"], ref["features"])
    assert set(got["groups"]) == {"run", "position"} == set(ref["groups"])
    for dim in ("run", "position"):
        assert set(got["groups"][dim]) == set(ref["groups"][dim])
        for v in ref["groups"][dim]:
            _equal_tables(got["groups"][dim][v], ref["groups"][dim][v])
    assert [x["data_sha256"] for x in got["runs"]] == [x["data_sha256"] for x in ref["runs"]]
    assert "## q_max by run" in (out / "report.md").read_text()


def test_the_same_run_twice_is_refused(small_run, tmp_path):
    r = CliRunner().invoke(app, ["evaluate", str(small_run), str(small_run), "--out", str(tmp_path / "r"),
                                 "--cluster", "local:1"])
    assert r.exit_code != 0 and "the same run is given twice" in r.output and "Traceback" not in r.output


def test_other_bins_give_the_single_machines_calibration(small_run, tmp_path):
    out = tmp_path / "b7"
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(out), "--cluster", "local:1", "--bins", "7",
                                 "--feature", "q_max", "--feature", "logit_qmax"])
    assert r.exit_code == 0, r.output
    got = json.loads((out / "report.json").read_text())
    _equal_tables(got["features"], evaluate([small_run], EvaluateOptions(features=["q_max", "logit_qmax"],
                                                                         n_bins=7))["features"])
    assert got["ece_bins"] == 7 and len(got["features"]["q_max"]["curves"]["reliability"]["count"]) <= 7


def test_the_acceptance_section_is_the_single_machines(cluster_report, small_run):
    """Acceptance by position (marginal over unverified drafts too), the mean acceptance length and
    each probability feature's expected-length calibration, from per-step sums on the workers."""
    got = cluster_report[0]
    ref = evaluate([small_run], EvaluateOptions(features=FEATURES))
    a, b = got["acceptance"], ref["acceptance"]
    assert a["labelled"] == b["labelled"] and a["rate"] == pytest.approx(b["rate"], rel=1e-15)
    assert a["mean_acceptance_length"] == pytest.approx(b["mean_acceptance_length"], rel=1e-15)
    assert [{k: r[k] for k in ("position", "proposed", "verified", "accepted")} for r in a["by_position"]] == [
        {k: r[k] for k in ("position", "proposed", "verified", "accepted")} for r in b["by_position"]]
    for x, y in zip(a["by_position"], b["by_position"], strict=True):
        assert x["conditional"] == pytest.approx(y["conditional"], rel=1e-15)
        assert x["marginal"] == pytest.approx(y["marginal"], rel=1e-15)
    assert "## Acceptance by draft position" in cluster_report[1]
    assert set(got["length_calibration"]) == set(ref["length_calibration"]) and got["length_calibration"]
    for name, x in ref["length_calibration"].items():
        y = got["length_calibration"][name]
        assert y["steps"] == x["steps"] and y["k"] == x["k"] and [c["count"] for c in y["bins"]] == [c["count"] for c in x["bins"]]
        for m in ("mean_predicted", "mean_realised", "length_ece"):
            assert y[m] == pytest.approx(x[m], rel=1e-12, abs=1e-12), (name, m)


def test_a_request_in_two_shards_leaves_the_acceptance_section_out(small_run):
    """A request in two shards could split a step between workers: no per-step figures then."""
    from svt.distributed.acceptance import acceptance_section

    class InProcess:
        def map(self, fn, items, *args):
            return [fn(item, *args) for item in items]

    shard = str(sorted((small_run / "drafts").glob("*.parquet"))[0])
    got = acceptance_section([(shard, 0), (shard, 0)], ["q_max"], InProcess(), 10)
    assert "span two shards" in got["acceptance_not_computed"] and "acceptance" not in got
    assert acceptance_section([(shard, 0)], ["q_max"], InProcess(), 10)["acceptance"]["labelled"] > 0


def test_runs_named_alike_and_by_run_group_as_on_one_machine(small_run, greedy_run, tmp_path):
    """Two runs whose directories share a name are named by their paths, as on one machine (a probe
    found them pooled into one group); --by run is the runs' own grouping."""
    import shutil

    other = tmp_path / "x" / small_run.name
    shutil.copytree(greedy_run, other)
    out = tmp_path / "r"
    r = CliRunner().invoke(app, ["evaluate", str(small_run), str(other), "--out", str(out), "--cluster", "local:1",
                                 "--feature", "q_max", "--by", "run"])
    assert r.exit_code == 0, r.output
    got = json.loads((out / "report.json").read_text())["groups"]
    ref = evaluate([small_run, other], EvaluateOptions(features=["q_max"], by="run"))["groups"]
    assert set(got) == set(ref) == {"run"} and set(got["run"]) == set(ref["run"]) and len(got["run"]) == 2
    for v in ref["run"]:
        _equal_tables(got["run"][v], ref["run"][v])


def test_features_reading_columns_an_import_lacks_are_left_out_as_on_one_machine(small_run, greedy_run, tmp_path):
    """A run whose import lacks q_max (null throughout, said in run.json): the features reading it
    are not scored and say why, and no length calibration is summed from nulls (a probe got exit 0
    with an ECE made of zeros); beside a run that has it, they are left out too."""
    import shutil

    import polars as pl

    from svt.traces.io import read_meta, write_meta
    from tests.conftest import reseal

    run = tmp_path / "noq"
    shutil.copytree(small_run, run)
    for shard in (run / "drafts").glob("*.parquet"):
        f = pl.read_parquet(shard)
        f.with_columns(pl.lit(None, f.schema["q_max"]).alias("q_max")).write_parquet(shard)
    meta = read_meta(run)
    meta["import"] = {**(meta.get("import") or {}), "lacks": {"drafts": ["q_max"]}}
    write_meta(run, meta)
    reseal(run)
    feats = ["q_max", "logit_qmax", "q_sampled"]
    for runs in ([run], [run, greedy_run]):
        out = tmp_path / f"r{len(runs)}"
        args = ["evaluate", *map(str, runs), "--out", str(out), "--cluster", "local:1"]
        r = CliRunner().invoke(app, args + [x for f in feats for x in ("--feature", f)])
        assert r.exit_code == 0, r.output
        got = json.loads((out / "report.json").read_text())
        ref = evaluate(runs, EvaluateOptions(features=feats))
        assert set(got["features"]) == set(ref["features"]) == {"q_sampled"}
        assert got["features_not_computed"] == ref["features_not_computed"]
        assert set(got["length_calibration"]) == set(ref["length_calibration"])
        _equal_tables(got["features"], ref["features"])


def test_a_port_that_answers_but_is_no_dask_scheduler_is_refused_quickly(small_run, tmp_path):
    """An HTTP server's port: dask's own handshake waited on it without end (killed after 400 s).
    One clear error within the handshake bound; a real scheduler's address passes the probe."""
    import http.server
    import subprocess
    import sys
    import threading
    import time

    from distributed import LocalCluster
    from svt.distributed.engines.dask_engine import HANDSHAKE_S, probe_scheduler

    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:  # in a process of its own, so that a hang fails this test in 60 s instead of holding the suite
        t0 = time.monotonic()
        try:
            r = subprocess.run([sys.executable, "-m", "svt.cli", "evaluate", str(small_run), "--out", str(tmp_path / "r"),
                                "--cluster", f"tcp://127.0.0.1:{srv.server_address[1]}"],
                               capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("svt evaluate --cluster still waits on a port that is no dask scheduler")
        assert time.monotonic() - t0 < 45  # the 5 s bound, plus starting Python and svt
        assert r.returncode != 0 and "sent no dask handshake" in r.stderr + r.stdout
        assert "Traceback" not in r.stderr + r.stdout
    finally:
        srv.shutdown()
    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", dashboard_address=None) as cluster:
        t0 = time.monotonic()
        probe_scheduler(cluster.scheduler_address)
        assert time.monotonic() - t0 < HANDSHAKE_S


def test_a_local_cluster_far_above_the_cores_is_refused():
    import os

    from svt.distributed.engines.base import MAX_WORKERS_PER_CORE, parse_cluster

    most = MAX_WORKERS_PER_CORE * (os.cpu_count() or 1)
    assert parse_cluster(f"local:{most}") == (most, None)
    with pytest.raises(ConfigError, match="worker processes on a machine with"):
        parse_cluster(f"local:{most + 1}")
