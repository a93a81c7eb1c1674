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
    ref = evaluate([small_run], EvaluateOptions(features=FEATURES))["features"]
    assert got["cluster"]["workers"] == 2 and got["cluster"]["shards"] >= 1
    for name in FEATURES:
        g, r = got["features"][name], ref[name]
        scopes = [(g, r), (g["excluding_first"], r["excluding_first"]),
                  *[(g["per_position"][str(j)], r["per_position"][j]) for j in r["per_position"]]]
        for a, b in scopes:
            assert a["n"] == b["n"] and a["accept_rate"] == pytest.approx(b["accept_rate"], abs=1e-15)
            assert a["auc"] == pytest.approx(b["auc"], abs=1e-12) and a["auc_bound"] == 0.0
            for m in ("log_loss", "brier", "mean_pred", "ece"):
                if b.get(m) is not None and a.get(m) is not None:
                    assert a[m] == pytest.approx(b[m], rel=1e-12, abs=1e-15), (name, m)
        assert (g.get("log_loss") is None) == (not r["probability"])
    assert "## q_max" in md and "AUC bound" in md


@pytest.mark.parametrize("args, words", [
    (["--fit", "some-fit.json"], "--fit"),
    (["--bootstrap", "10"], "--bootstrap"),
    (["--bins", "20"], "--bins other than 10"),
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
        for name, b in feats.items():
            a = got[str(v)][name]
            for x, y in ((a, b), (a["excluding_first"], b["excluding_first"])):
                assert x["n"] == y["n"] and x["auc"] == pytest.approx(y["auc"], abs=1e-12) and x["auc_bound"] == 0.0
                if y.get("log_loss") is not None:
                    assert x["log_loss"] == pytest.approx(y["log_loss"], rel=1e-12)
    assert "## q_max by workload" in (out / "report.md").read_text()
    bad = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "b2"), "--cluster", "local:1",
                                   "--by", "no_such_column"])
    assert bad.exit_code != 0 and "--by 'no_such_column'" in bad.output and "Traceback" not in bad.output
