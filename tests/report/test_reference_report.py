"""`svt evaluate` on reference runs (cache drafts only) and the realism table of target runs."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.errors import DataError
from svt.metrics.repetition import common_prefix, repeated_share
from svt.report import EvaluateOptions, evaluate, write_report

ROOT = Path(__file__).resolve().parents[2]
COSTS = str(ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml")


@pytest.fixture(scope="module")
def ref_run(tmp_path_factory, models_dir):
    from svt.collect.reference_run import collect_reference
    from svt.config import load_collect_config

    cfg = load_collect_config(None, base={
        "engine": "reference", "target": str(models_dir / "target"), "stand_in": {"rate": 0.6},
        "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("prose", "edit", "toolcalls")],
        "requests": 18, "batch_size": 6, "max_new_tokens": 48, "k": 5, "temperature": 0, "cache": True,
        "max_prompt_tokens": 256})
    out = tmp_path_factory.mktemp("ref") / "ref"
    collect_reference(cfg, out, progress=False)
    return out


def test_reference_report_has_the_cache_sections_and_says_what_it_lacks(ref_run, tmp_path):
    rep = evaluate([ref_run], EvaluateOptions(costs=COSTS))
    assert rep["kind"] == "cache-only" and rep["acceptance"] is None and rep["features"] == {}
    assert "no target probabilities" in rep["note"] and rep["drafters"][0]["kind"] == "stand-in"
    assert set(rep["cache"]) == {"all", "prose", "edit", "toolcalls"}
    hmap = rep["hvd_map"]
    assert {r["strength"] for r in hmap["rows"]} == {1.5, 2.0, 2.5, 3.0, 3.5, 4.0}
    assert "seeded half" in hmap["split"]
    for r in hmap["rows"]:
        assert r["oracle-switch"]["ms"] <= min(r["model-only"]["ms"], r["cache-only"]["ms"]) + 1e-6
    assert rep["two_sided"]["groups"]["all"]["two_sided"]["cycles_per_1000"] > 0
    checks = rep["document_checks"]
    assert checks["hvd_vs_greedy"]["pairs"] == len([r for r in hmap["rows"] if r["group"] != "all"])
    realism = rep["realism"][ref_run.name]
    assert realism["kind"] == "reference" and realism["workloads"]["all"]["mean_common_prefix"] is None
    json_path, md_path = write_report(rep, tmp_path / "rep")
    md = md_path.read_text()
    for text in ("cache drafts only", "a stand-in", "Where HVD pays off", "Two-sided switch",
                 "The document's checks", "How far the pair is from the data",
                 # the document named by its title; each HVD table says which requests it covers
                 "*Hybrid Verified Decoding: Learning to Allocate Verification in Speculative Decoding*",
                 "**Covers all requests.**", "**Covers all 18 requests.**",
                 "Workloads: 18 requests (prose 6, edit 6, toolcalls 6) from the workloads' 270 prompts (prose 150, edit 60, toolcalls 60); chat turns: prose last"):
        assert text in md
    assert rep["hvd"]["coverage"] == rep["yield"]["coverage"] == "all 18 requests"
    # the document's checks say which requests each row counts (the two-sided section's scored half)
    scored = rep["two_sided"]["groups"]["all"]["requests"]
    assert 0 < scored < 18 and f"on {scored} requests: τ chosen on a seeded half" in md
    # the realism table of a reference run: one text, no columns that only a target run fills
    table = md.split("How far the pair is from the data")[1].split("\n## ")[0]
    assert "| group | requests | text: repeats prompt+text | text: repeats itself | cache yield | top-10% share |" in table
    assert "—" not in table
    json.loads(json_path.read_text())


def test_two_reference_runs_are_reported_side_by_side(ref_run, tmp_path):
    import shutil

    from svt.traces.io import read_meta, write_meta

    other = tmp_path / "other"
    shutil.copytree(ref_run, other)
    meta = read_meta(other)
    meta["run_id"] = "another-run"  # the same data under another id: two runs, one report
    write_meta(other, meta)
    rep = evaluate([ref_run, other], EvaluateOptions())
    assert len(rep["drafters"]) == 2 and set(rep["realism"]) == {ref_run.name, "other"}
    _, md = write_report(rep, tmp_path / "rep")
    assert md.read_text().count("Model drafter: **a stand-in**") == 2


def test_hvd_map_figure_and_refused_acceptance_figures(ref_run, tmp_path):
    from svt import plots

    rep = evaluate([ref_run], EvaluateOptions(costs=COSTS))
    write_report(rep, tmp_path / "rep")
    written = plots.plot_all(tmp_path / "rep", vmax=50)
    assert {p.name for p in written} == {"hvd.png", "yield-pr.png", "hvd-map.png"}
    # the map: a shared symmetric scale, intervals, (gain) where they span 0, hatched small cells
    rows = rep["hvd_map"]["rows"]
    # workload cells all scored on < 10 requests: the `all` row alone is drawn (the caption says so)
    if all(r["requests"] < 10 for r in rows if r["group"] != "all"):
        rows = [r for r in rows if r["group"] == "all"]
    fig = plots.get_plot("hvd-map")(rep, vmax=50)
    ax = fig.axes[0]
    assert ax.images[0].get_clim() == (-50, 50)
    texts = [t.get_text() for t in ax.texts]
    assert len(texts) == len(rows) and all("\n[" in t for t in texts)
    spans = sum(r["gain_interval_spans_zero"] for r in rows)
    assert sum(t.startswith("(") for t in texts) == spans
    assert len([p for p in ax.patches if p.get_hatch() == "///"]) == sum(r["requests"] < 10 for r in rows)
    assert "gain over the better single source" in fig.axes[1].get_ylabel()
    with pytest.raises(DataError, match="--vmax must be a positive number"):
        plots.get_plot("hvd-map")(rep, vmax=-3)
    with pytest.raises(DataError, match="acceptance features"):
        plots.get_plot("roc")(rep)


def test_an_acceptance_fit_on_a_reference_run_is_refused(ref_run, small_run, tmp_path):
    from svt.fit import fit_runs

    fit = fit_runs([small_run], "logistic")
    path = fit.save(tmp_path / "logistic.json") or tmp_path / "logistic.json"
    with pytest.raises(DataError, match="acceptance fit"):
        evaluate([ref_run], EvaluateOptions(fits=[str(path)]))


def test_target_run_with_references_gets_the_realism_table(greedy_run):
    from svt.report.reference import realism_rows
    from svt.traces.io import open_run

    run = open_run(greedy_run)
    assert run.has("references")
    rows = realism_rows(run)
    req = run.scan("requests").collect()
    refs = dict(zip(*run.scan("references").collect().get_columns(), strict=True))
    want = np.mean([common_prefix(o, refs[r]) for r, o in zip(req["request"], req["output_ids"], strict=True)])
    assert rows["all"]["mean_common_prefix"] == pytest.approx(want)
    assert rows["all"]["with_reference"] == req.height


def test_reference_run_compares_the_same_requests_or_says_which_differ(greedy_run, tmp_path, models_dir):
    """--reference-run put a reference run's cache statistics beside the run's whatever requests
    each held; now it matches them by workload and prompt tokens and says which differ."""
    from svt.collect.reference_run import collect_reference
    from svt.config import load_collect_config
    from svt.report.reference import _cache_stats, realism_section
    from svt.traces.io import read_meta

    meta = read_meta(greedy_run)
    base = {"engine": "reference", "target": str(models_dir / "target"), "stand_in": {"rate": 0.6},
            "workloads": list(meta["workloads"].values()), "max_new_tokens": 48, "k": 4, "temperature": 0,
            "cache": True, "max_prompt_tokens": 256}
    collect_reference(load_collect_config(None, base={**base, "requests": 12}), tmp_path / "same", progress=False)
    collect_reference(load_collect_config(None, base={**base, "requests": 8}), tmp_path / "fewer", progress=False)
    same = realism_section([greedy_run], str(tmp_path / "same"))[greedy_run.name]
    assert same["reference_requests"]["shared"] == 12 and same["reference_requests"]["note"].startswith("the same 12")
    collect_reference(load_collect_config(None, base={**base, "requests": 30}), tmp_path / "more", progress=False)
    more = realism_section([greedy_run], str(tmp_path / "more"))[greedy_run.name]
    assert more["reference_requests"]["shared"] == 12 and len(more["reference_requests"]["only_in_reference"]) == 18
    assert more["reference_cache"] == _cache_stats(tmp_path / "more", set(range(12)))
    assert more["reference_cache"] != _cache_stats(tmp_path / "more")  # not the 18 requests the run lacks
    fewer = realism_section([greedy_run], str(tmp_path / "fewer"))[greedy_run.name]
    got = fewer["reference_requests"]
    assert got["shared"] == 8 and got["only_in_run"] == [8, 9, 10, 11] and got["only_in_reference"] == []
    assert "Only in this run: 4 (requests 8, 9, 10, 11)" in got["note"]
    # its cache columns are computed on the shared requests only: as the first 8 of the full run
    assert fewer["reference_cache"] == _cache_stats(tmp_path / "same", set(range(8)))
    assert fewer["reference_cache"] != same["reference_cache"]
    from svt.report.sections.realism import realism_markdown

    text = "\n".join(realism_markdown({"realism": {greedy_run.name: fewer}}))
    assert "8 requests in common (matched by workload and prompt tokens)" in text


def test_hvd_tables_say_they_cover_the_held_out_requests(greedy_run, tmp_path):
    from svt.fit import fit_runs

    fit = fit_runs([greedy_run], "yield-linear", test_fraction=0.5, seed=0)
    fit.save(tmp_path / "y.json")
    rep = evaluate([greedy_run], EvaluateOptions(features=["q_max"], costs=COSTS, fits=[str(tmp_path / "y.json")]))
    n = rep["hvd"]["requests"]
    assert 0 < n < 12 and rep["hvd"]["coverage"] == (f"the {n} requests every yield fit held out (of 12; the others "
                                                     "trained a fit)")
    _, md = write_report(rep, tmp_path / "rep")
    assert md.read_text().count(f"**Covers the {n} requests every yield fit held out") == 2


def test_a_yield_fit_knows_which_reference_run_it_saw(ref_run, models_dir, tmp_path):
    """A reference run writes an empty drafts table, so an identity of the drafts is the same for
    every reference run: a fit of one was taken for a fit of any other, whose requests it then
    skipped by the first run's request ids. The identity is of the cache drafts the fit read: a run
    of other text is scored whole, an identical re-collection under another id is still known."""
    import shutil

    from svt.collect.reference_run import collect_reference
    from svt.config import load_collect_config
    from svt.fit import fit_runs
    from svt.traces.io import read_meta, write_meta

    fit = fit_runs([ref_run], "yield-linear", test_fraction=0.5, seed=0)
    assert fit.training_["runs"][0]["data"]["table"] == "cache_drafts"
    assert fit.training_["runs"][0]["data"]["rows"] > 0
    fit.save(tmp_path / "y.json")
    cfg = load_collect_config(None, base={
        "engine": "reference", "target": str(models_dir / "target"), "stand_in": {"rate": 0.6},
        "workloads": [str(ROOT / "data" / "workloads" / "toolcalls.jsonl")], "requests": 6, "batch_size": 6,
        "max_new_tokens": 40, "k": 5, "temperature": 0, "cache": True, "max_prompt_tokens": 256, "seed": 3})
    other = tmp_path / "other"
    collect_reference(cfg, other, progress=False)
    rep = evaluate([other], EvaluateOptions(costs=COSTS, fits=[str(tmp_path / "y.json")]))
    assert rep["yield"]["coverage"] == rep["hvd"]["coverage"] == "all 6 requests"
    again = tmp_path / "again"  # the training run's data under another run id: its training requests are known
    shutil.copytree(ref_run, again)
    meta = read_meta(again)
    meta["run_id"] = "a-re-collection"
    write_meta(again, meta)
    rep = evaluate([again], EvaluateOptions(costs=COSTS, fits=[str(tmp_path / "y.json")]))
    assert rep["yield"]["requests"] == 18 - fit.training_["train_requests"]
    # the run's identity without a fit's table (the cluster's reading): of the rows it has
    from svt.traces.identity import data_identity, identity_table, run_identity
    from svt.traces.io import open_run

    assert identity_table(open_run(other, deep=False)) == "cache_drafts"
    assert run_identity(open_run(other, deep=False))["rows"] > 0
    # a fit written before this was known recorded the empty drafts' identity: it identifies nothing
    old = json.loads((tmp_path / "y.json").read_text())
    old["training"]["runs"][0]["data"] = {"table": "drafts",
                                          **data_identity(open_run(other, deep=False).parts("drafts"))}
    assert old["training"]["runs"][0]["data"]["rows"] == 0
    (tmp_path / "old.json").write_text(json.dumps(old))
    rep = evaluate([other], EvaluateOptions(costs=COSTS, fits=[str(tmp_path / "old.json")]))
    assert rep["yield"]["coverage"] == "all 6 requests"


def test_reference_run_of_other_prompts_is_refused(greedy_run, ref_run):
    from svt.report.reference import realism_section

    with pytest.raises(DataError, match="other prompt files"):
        realism_section([greedy_run], str(ref_run))


def _slow_repeated(prompt, output, n):
    pos = hit_all = hit_out = 0
    for t in range(len(output) - n + 1):
        pos += 1
        w = list(output[t : t + n])
        before = list(prompt) + list(output[:t])
        own = list(output[:t])
        hit_all += any(before[i : i + n] == w for i in range(len(before) - n + 1))
        hit_out += any(own[i : i + n] == w for i in range(len(own) - n + 1))
    return pos, hit_all, hit_out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=30), st.integers(1, 4))
def test_repeated_share_matches_a_brute_force_search(prompt, output, n):
    assert repeated_share(np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64), n) == \
        _slow_repeated(prompt, output, n)


def test_a_target_runs_report_has_the_map_the_two_sided_switch_and_the_checks(greedy_run, tmp_path):
    rep = evaluate([greedy_run], EvaluateOptions(features=["q_max"], costs=COSTS))
    assert rep["hvd_map"]["rows"] and rep["two_sided"]["groups"]["all"]
    assert rep["document_checks"]["hvd_vs_greedy"]["pairs"] > 0
    assert rep["realism"][greedy_run.name]["kind"] == "target"
    _, md = write_report(rep, tmp_path / "rep")
    text = md.read_text()
    assert "Where HVD pays off" in text and "Two-sided switch" in text and "How far the pair is from the data" in text


def test_a_reference_report_is_a_valid_regression_baseline(ref_run, tmp_path):
    from svt.report.compare import compare_reports, load_report

    rep = evaluate([ref_run], EvaluateOptions(costs=COSTS))
    json_path, _ = write_report(rep, tmp_path / "rep")
    base = load_report(json_path)
    result = compare_reports(base, json.loads(json_path.read_text()))
    assert result["verdict"] == "ok" and result["compared"] > 0
    worse = json.loads(json_path.read_text())
    for r in worse["hvd"]["rows"]:  # a slower replay everywhere is a regression
        r["ms"] *= 1.5
        r["speedup_vs_greedy"] /= 1.5
        r["speedup_vs_model"] /= 1.5
    assert compare_reports(base, worse)["regressed"] > 0
