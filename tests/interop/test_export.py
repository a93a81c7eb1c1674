"""svt export: the speculation profile against the report's own numbers, the flat feature table
against report.json, LaTeX that compiles as booktabs source."""

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError
from svt.interop.export import export, feature_rows, latex_tables, speculation_profile


@pytest.fixture(scope="module")
def report(small_run, tmp_path_factory):
    from svt.report import EvaluateOptions, evaluate
    from svt.report.render import write_report

    rep = evaluate([small_run], EvaluateOptions(features=["q_max", "entropy"], bootstrap=10))
    out = tmp_path_factory.mktemp("rep")
    write_report(rep, out)
    return rep, out


def test_the_profile_is_the_reports_acceptance(small_run, report):
    """specdec_bench's speculation_profile layout: the per-step mean acceptance length is the report's,
    the marginals are the survival of the accepted count (so 1 + their sum is that mean), the
    conditionals their ratios; with every step drafting K, both equal the report's by-position rates."""
    rep, _ = report
    prof = speculation_profile(small_run)
    acc = rep["acceptance"]
    k = prof["num_speculative_tokens"]
    assert prof["schema_version"] == "1.0" and prof["method"] == "draft_model" and k == len(acc["by_position"])
    assert prof["mean_accept_length"] == pytest.approx(acc["mean_acceptance_length"], abs=1e-6)
    assert 1 + sum(prof["marginal_accept_rates"]) == pytest.approx(prof["mean_accept_length"], abs=1e-5)
    assert prof["validation"]["mean_consistency"]["passed"] and prof["validation"]["marginal_monotonicity"]["passed"]
    for i, p in enumerate(acc["by_position"]):
        assert prof["conditional_accept_rates"][i] == pytest.approx(p["conditional"], abs=1e-6)
        assert prof["marginal_accept_rates"][i] == pytest.approx(p["marginal"], abs=1e-6)
    hist = prof["acceptance_length_histogram"]
    assert sum(hist.values()) == prof["measurement_conditions"]["steps"]
    assert sum(int(n) * c for n, c in hist.items()) / sum(hist.values()) == pytest.approx(prof["mean_accept_length"],
                                                                                           abs=1e-6)
    keys = ("position", "proposed", "verified", "accepted", "conditional", "marginal")
    assert [[p[c] for c in keys] for p in prof["svt"]["per_position"]] == \
        [[pytest.approx(p[c]) for c in keys] for p in acc["by_position"]]
    assert set(prof["per_category"]) == set(open_workloads(small_run))


def open_workloads(run):
    from svt.traces.io import open_run

    return open_run(run).scan("drafts").select("workload").unique().collect()["workload"].to_list()


def test_a_profile_of_variable_length_drafts_is_the_survival_of_accepted_counts(tmp_path):
    """The arctic simulator drafts 0 to 6 tokens a step: marginal_i is P(accepted >= i + 1) over
    the verified steps, worked out by hand from the fixture."""
    from svt.interop import import_trace

    here = Path(__file__).parent / "fixtures"
    import_trace("arctic-sim", here / "arctic_sim.csv", tmp_path / "run")
    prof = speculation_profile(tmp_path / "run")
    # verified steps accept 3, 0, 5, 3 (steps that drafted nothing have no labelled draft)
    assert prof["num_speculative_tokens"] == 6 and prof["method"] == "suffix"
    assert prof["marginal_accept_rates"] == [0.75, 0.75, 0.75, 0.25, 0.25, 0.0]
    assert prof["conditional_accept_rates"][:4] == [0.75, 1.0, 1.0, pytest.approx(1 / 3, abs=1e-6)]
    assert prof["mean_accept_length"] == pytest.approx(1 + 11 / 4)
    assert prof["acceptance_length_histogram"] == {"1": 1, "4": 2, "6": 1}


def test_the_flat_feature_table_holds_every_scope_of_the_report(report, tmp_path):
    rep, out = report
    path = export("features", out, tmp_path / "f.csv")
    flat = pl.read_csv(path)
    q = rep["features"]["q_max"]
    assert flat.height == sum(2 + len(f["per_position"]) for f in rep["features"].values())
    row = flat.filter((pl.col("feature") == "q_max") & (pl.col("scope") == "excluding_first")).row(0, named=True)
    assert row["auc"] == pytest.approx(q["excluding_first"]["auc"], abs=1e-12)
    assert [row["auc_lo"], row["auc_hi"]] == pytest.approx(q["excluding_first"]["ci95"]["auc"], abs=1e-12)
    pos1 = flat.filter((pl.col("feature") == "entropy") & (pl.col("scope") == "position 1")).row(0, named=True)
    assert pos1["shown_as"] == "−entropy" and pos1["n"] == rep["features"]["entropy"]["per_position"][1]["n"]
    pq = export("features", out / "report.json", tmp_path / "f.parquet")
    assert pl.read_parquet(pq).equals(feature_rows(json.loads((out / "report.json").read_text())))


def test_latex_escapes_and_balances(report):
    rep, _ = report
    tex = latex_tables(rep)
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") == 2
    assert tex.count("\\toprule") == tex.count("\\bottomrule") == 2
    assert "q\\_max" in tex and "log\\_loss" in tex and "_" not in tex.replace("\\_", "")
    body = [ln for ln in tex.splitlines() if ln.startswith("q\\_max")][0]
    assert body.count("&") == tex.splitlines()[4].count("&")  # every row has the header's columns


@pytest.mark.parametrize(("kind", "out", "match"), [
    ("profile", "p.csv", "writes .json"), ("features", "f.json", "writes .csv or .parquet"),
    ("pdf", "x.pdf", "Unknown export"),
])
def test_a_wrong_export_is_refused_before_writing(small_run, tmp_path, kind, out, match):
    with pytest.raises(ConfigError, match=match):
        export(kind, small_run, tmp_path / out)
    assert not (tmp_path / out).exists()


def test_cli_export(small_run, report, tmp_path):
    _, rep_dir = report
    r = CliRunner()
    res = r.invoke(app, ["export", "profile", str(small_run), "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0 and json.loads((tmp_path / "p.json").read_text())["num_speculative_tokens"] >= 1, res.output
    res = r.invoke(app, ["export", "latex", str(small_run), "--out", str(tmp_path / "t.tex")])
    assert res.exit_code == 2 and "Traceback" not in res.output and not (tmp_path / "t.tex").exists(), res.output
    res = r.invoke(app, ["export", "latex", str(rep_dir), "--out", str(tmp_path / "t.tex")])
    assert res.exit_code == 0 and (tmp_path / "t.tex").read_text().startswith("%")


@pytest.mark.parametrize("fmt", ["vllm-steps", "specdec-tokens"])
def test_a_run_exported_and_imported_again_has_the_same_labels(small_run, tmp_path, fmt):
    """Both directions exist for these formats: a collected run written out and read back keeps
    every draft's label (and, through specdec-tokens, its token and accept_prob)."""
    from svt.interop import import_trace
    from svt.traces.io import open_run

    path = export(fmt, small_run, tmp_path / "out.jsonl")
    import_trace(fmt, path, tmp_path / "back")
    cols = ["request", "step", "position", "label", *(["token", "accept_prob"] if fmt == "specdec-tokens" else [])]
    a = open_run(small_run).scan("drafts").sort("request", "step", "position").select(cols).collect()
    b = open_run(tmp_path / "back").scan("drafts").sort("request", "step", "position").select(cols).collect()
    assert a.equals(b)
    back = open_run(tmp_path / "back").scan("requests").sort("request").collect()
    assert back["output_ids"].equals(open_run(small_run).scan("requests").sort("request").collect()["output_ids"])


def test_an_export_never_replaces_its_source_or_a_runs_file(small_run, report, tmp_path):
    _, rep_dir = report
    for out, match in ((small_run / "run.json", r"\(inside\) the source"), (rep_dir / "x.tex", r"\(inside\) the source")):
        with pytest.raises(ConfigError, match=match):
            export("latex" if out.suffix == ".tex" else "profile", small_run if out.suffix == ".json" else rep_dir, out)
    (tmp_path / "keep.json").write_text("{}")
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        export("profile", small_run, tmp_path / "keep.json")
    assert (tmp_path / "keep.json").read_text() == "{}"
    assert export("profile", small_run, tmp_path / "new" / "sub" / "p.json").is_file()  # folders made
    # --overwrite replaces an earlier export, never a report or a fit file
    import shutil

    shutil.copy(rep_dir / "report.json", tmp_path / "report.json")
    (tmp_path / "fit.json").write_text('{"model": "logistic", "training": {"runs": []}, "feature": "q_max"}')
    for name, what in (("report.json", "an svt evaluation report"), ("fit.json", "an svt fit file")):
        before = (tmp_path / name).read_text()
        with pytest.raises(ConfigError, match=f"is {what}"):
            export("profile", small_run, tmp_path / name, overwrite=True)
        assert (tmp_path / name).read_text() == before
    assert export("profile", small_run, tmp_path / "new" / "sub" / "p.json", overwrite=True).is_file()
    with pytest.raises(ConfigError, match="Cannot write"):
        export("profile", small_run, Path("/proc/svt-nope.json"))


@pytest.mark.parametrize("content", ["[1, 2]", '{"features": {"a": 5}}', '{"features": {}}',
                                     '{"features": {"a": {"per_position": {"x": {}}}}}'])
def test_a_report_that_is_not_one_is_refused(tmp_path, content):
    from svt.errors import DataError

    (tmp_path / "r.json").write_text(content)
    for kind, out in (("latex", "t.tex"), ("features", "f.csv")):
        with pytest.raises(DataError):
            export(kind, tmp_path / "r.json", tmp_path / out)
        assert not (tmp_path / out).exists()


def test_an_export_its_importer_refuses_is_an_error_and_nothing_is_written(small_run, tmp_path, monkeypatch):
    """The export is imported again before it replaces anything: records that break the format
    (here a step accepting more than it drafted) are an error, not a file found broken later."""
    import svt.interop.export as ex
    from svt.errors import DataError

    real = ex._run_records

    def broken(run_dir, kind):
        recs = real(run_dir, kind)
        recs[0]["per_step_accepted"] = [d + 1 for d in recs[0]["per_step_drafted"]]
        return recs

    monkeypatch.setattr(ex, "_run_records", broken)
    (tmp_path / "old.jsonl").write_text("earlier export\n")
    with pytest.raises(DataError, match="would not import again"):
        ex.export("vllm-steps", small_run, tmp_path / "old.jsonl", overwrite=True)
    assert (tmp_path / "old.jsonl").read_text() == "earlier export\n"
    assert [p.name for p in tmp_path.iterdir()] == ["old.jsonl"]
