"""Issue 34: a fit's held-out split follows its training data into an import. Through `svt export
vllm-steps` and `svt import`, a fit was scored on its own training requests (n 29,712 where the
source run scores 8,803 held out); through `import table` on every row."""

import json

import polars as pl
import pytest

from svt.errors import DataError
from svt.fit import fit_runs
from svt.fit.files import training_problem
from svt.interop import import_trace
from svt.interop.export import export
from svt.report import EvaluateOptions, evaluate
from svt.traces.identity import MIN_SIGNATURE_STEPS, request_signatures
from svt.traces.synthetic import write_run

FEATURE = "logistic(position)"  # a fit an import without draft probabilities can still be scored on


@pytest.fixture(scope="module")
def long_run(small_run, tmp_path_factory):
    """Requests of 30 verification steps (whole steps of the real small run): long enough that each
    request's acceptance sequence identifies it."""
    return write_run(small_run, tmp_path_factory.mktemp("held-out") / "run", 4_000, shard_labelled=4_000,
                     steps_per_request=30, seed=3)


@pytest.fixture(scope="module")
def fit(long_run, tmp_path_factory):
    return fit_runs([long_run], "logistic", feature="position").save(tmp_path_factory.mktemp("fit") / "lr.json")


def _scored(run, fit) -> dict:
    return evaluate([run], EvaluateOptions(features=["position"], fits=[str(fit)]))["features"][FEATURE]


@pytest.fixture(scope="module")
def own(long_run, fit):
    return _scored(long_run, fit)


@pytest.mark.parametrize("fmt", ["vllm-steps", "specdec-tokens"])
def test_a_fit_on_the_import_of_its_runs_export_scores_only_its_held_out_requests(long_run, fit, own, tmp_path, fmt):
    file = export(fmt, long_run, tmp_path / "out.jsonl")
    first = json.loads(file.read_text().splitlines()[0])
    assert first["svt_run_id"] == json.loads((long_run / "run.json").read_text())["run_id"]
    run = import_trace(fmt, file, tmp_path / "imp").run_dir
    assert json.loads((run / "run.json").read_text())["import"]["svt_source"]["requests"][:3] == [0, 1, 2]
    got = _scored(run, fit)
    labelled = evaluate([long_run], EvaluateOptions(features=["position"]))["features"]["position"]["n"]
    assert got["n"] == own["n"] < labelled
    assert got["auc"] == pytest.approx(own["auc"], abs=1e-12)


def test_the_source_map_renames_requests_when_the_import_numbers_them_otherwise(long_run, fit, own, tmp_path):
    """The export's records in another order: svt's request i is another source request, and only
    the map keeps the split."""
    file = export("vllm-steps", long_run, tmp_path / "out.jsonl")
    lines = file.read_text().splitlines()
    (tmp_path / "rev.jsonl").write_text("\n".join(reversed(lines)) + "\n")
    run = import_trace("vllm-steps", tmp_path / "rev.jsonl", tmp_path / "imp").run_dir
    got = _scored(run, fit)
    assert got["n"] == own["n"] and got["auc"] == pytest.approx(own["auc"], abs=1e-12)


def _strip(file, out):
    rows = [json.loads(x) for x in file.read_text().splitlines()]
    for r in rows:
        r.pop("svt_run_id"), r.pop("svt_request")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_an_import_of_its_training_data_without_source_ids_is_refused(long_run, fit, tmp_path):
    file = _strip(export("vllm-steps", long_run, tmp_path / "out.jsonl"), tmp_path / "bare.jsonl")
    run = import_trace("vllm-steps", file, tmp_path / "imp").run_dir
    with pytest.raises(DataError, match="repeat the logistic fit's training requests"):
        _scored(run, fit)


def test_a_table_of_its_training_drafts_is_refused(long_run, fit, tmp_path):
    drafts = pl.read_parquet(long_run / "drafts" / "*.parquet").select("request", "step", "position", "label")
    drafts.with_columns(pl.col("request") + 1000).write_csv(tmp_path / "d.csv")  # other request ids
    mapping = tmp_path / "map.yaml"
    mapping.write_text("rows: drafts\ncolumns: {request: request, step: step, position: position, label: label}\n")
    run = import_trace("table", tmp_path / "d.csv", tmp_path / "imp", mapping=mapping).run_dir
    with pytest.raises(DataError, match="training data under another run id"):
        _scored(run, fit)


def test_a_few_repeated_requests_are_left_out_and_said(long_run, fit, tmp_path):
    """Two training requests pasted among held-out ones: not the training run, but those two are
    not scored (and the report says so)."""
    meta = json.loads(fit.read_text())
    trained = {r for _, r in meta["training"]["train_request_ids"]}
    drafts = pl.read_parquet(long_run / "drafts" / "*.parquet").select("request", "step", "position", "label")
    held = sorted(set(drafts["request"].unique()) - trained)
    pasted = sorted(trained)[:2]
    part = drafts.filter(pl.col("request").is_in(held + pasted))
    part.write_csv(tmp_path / "d.csv")
    mapping = tmp_path / "map.yaml"
    mapping.write_text("rows: drafts\ncolumns: {request: request, step: step, position: position, label: label}\n")
    run = import_trace("table", tmp_path / "d.csv", tmp_path / "imp", mapping=mapping).run_dir
    rep = evaluate([run], EvaluateOptions(features=["position"], fits=[str(fit)]))
    got = rep["features"][FEATURE]
    held_labelled = part.filter(pl.col("request").is_in(held) & pl.col("label").is_not_null()).height
    assert got["n"] == held_labelled
    assert "2 request(s) left out" in json.dumps(rep)


def test_another_draw_is_scored_whole(small_run, fit, tmp_path):
    other = write_run(small_run, tmp_path / "other", 2_000, shard_labelled=2_000, steps_per_request=30, seed=11)
    got = _scored(other, fit)
    labelled = pl.read_parquet(other / "drafts" / "*.parquet")["label"].is_not_null().sum()
    assert got["n"] == labelled


def test_signatures_ignore_step_numbers_and_see_one_changed_step():
    steps = 20
    rows = [{"request": 0, "step": s, "position": p, "label": 1 if p < s % 3 else (0 if p == s % 3 else None)}
            for s in range(steps) for p in range(4)]
    a = pl.DataFrame(rows)
    renumbered = a.with_columns(pl.col("step") * 7 + 100)
    changed = a.with_columns(pl.when((pl.col("step") == 5) & (pl.col("position") == 2)).then(1)
                             .otherwise(pl.col("label")).alias("label"))
    swapped = a.with_columns(pl.when(pl.col("step") == 1).then(2).when(pl.col("step") == 2).then(1)
                             .otherwise(pl.col("step")).alias("step"))  # the same steps, two in another order
    sig = request_signatures(a)["signature"].to_list()
    assert sig == request_signatures(renumbered)["signature"].to_list()
    assert sig != request_signatures(changed)["signature"].to_list()
    assert sig != request_signatures(swapped)["signature"].to_list()
    assert request_signatures(a.filter(pl.col("step") < MIN_SIGNATURE_STEPS - 1)).height == 0


def test_a_damaged_signature_list_is_named():
    t = {"runs": [{"run_id": "x"}], "train_request_signatures": ["0123", 5]}
    assert "train_request_signatures" in training_problem(t)


def test_a_mixed_or_damaged_source_is_one_error(long_run, tmp_path):
    file = export("vllm-steps", long_run, tmp_path / "out.jsonl")
    rows = [json.loads(x) for x in file.read_text().splitlines()]
    cases = {"mixed": lambda r: [r[0], {k: v for k, v in r[1].items() if not k.startswith("svt_")}, *r[2:]],
             "two runs": lambda r: [r[0], {**r[1], "svt_run_id": "another"}, *r[2:]],
             "twice": lambda r: [r[0], {**r[1], "svt_request": r[0]["svt_request"]}, *r[2:]],
             "half": lambda r: [{k: v for k, v in r[0].items() if k != "svt_request"}, *r[1:]],
             "bad id": lambda r: [{**r[0], "svt_request": -1}, *r[1:]]}
    for name, edit in cases.items():
        bad = tmp_path / f"{name}.jsonl"
        bad.write_text("".join(json.dumps(x) + "\n" for x in edit(rows)))
        with pytest.raises(DataError, match="svt_") as err:
            import_trace("vllm-steps", bad, tmp_path / name)
        assert f"{bad}:{1 if name in ('half', 'bad id') else 2}:" in str(err.value), (name, str(err.value))
        assert not (tmp_path / name).exists(), name


def _edit_source(run, out, edit):
    import shutil

    shutil.copytree(run, out)
    meta = json.loads((out / "run.json").read_text())
    edit(meta["import"])
    (out / "run.json").write_text(json.dumps(meta))
    return out


@pytest.fixture(scope="module")
def imported(long_run, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("imported")
    return import_trace("vllm-steps", export("vllm-steps", long_run, tmp / "out.jsonl"), tmp / "imp").run_dir


def test_a_source_map_that_does_not_describe_the_data_is_refused(imported, fit, tmp_path):
    """The probe: a reversed map scored 5 training requests as held out, a constant or shifted one
    every row, all under "held-out requests"."""
    for name, edit, match in (
            ("reversed", lambda s: s["svt_source"].update(requests=s["svt_source"]["requests"][::-1]),
             "does not describe this data"),
            ("shifted", lambda s: s["svt_source"].update(requests=[r + 1000 for r in s["svt_source"]["requests"]]),
             "does not describe this data"),
            ("twice", lambda s: s["svt_source"].update(requests=[0] * len(s["svt_source"]["requests"])),
             "names a source request twice"),
            ("negative", lambda s: s["svt_source"]["requests"].__setitem__(0, -1), "not a list of request ids"),
            ("text", lambda s: s["svt_source"]["requests"].__setitem__(0, "0"), "not a list of request ids"),
            ("huge", lambda s: s["svt_source"]["requests"].__setitem__(0, 2**63), "not a list of request ids"),
            ("longer", lambda s: s["svt_source"]["requests"].append(99_999), "entries for"),
            ("not an object", lambda s: s.update(svt_source="x"), "not a run id")):
        run = _edit_source(imported, tmp_path / name, edit)
        with pytest.raises(DataError, match=match):
            _scored(run, fit)


def test_an_unrelated_import_claiming_the_training_run_is_refused(small_run, long_run, fit, tmp_path):
    other = write_run(small_run, tmp_path / "other", 4_000, shard_labelled=4_000, steps_per_request=30, seed=12)
    imp = import_trace("vllm-steps", export("vllm-steps", other, tmp_path / "o.jsonl"), tmp_path / "imp").run_dir
    source_id = json.loads((long_run / "run.json").read_text())["run_id"]
    run = _edit_source(imp, tmp_path / "claims", lambda s: s["svt_source"].update(run_id=source_id))
    with pytest.raises(DataError, match="is mapped to training request .* but does not repeat any training request"):
        _scored(run, fit)


def test_a_request_id_beyond_64_bits_is_refused_on_import(long_run, tmp_path):
    file = export("vllm-steps", long_run, tmp_path / "out.jsonl")
    rows = [json.loads(x) for x in file.read_text().splitlines()]
    rows[3]["svt_request"] = 2**70
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="svt_request"):
        import_trace("vllm-steps", tmp_path / "big.jsonl", tmp_path / "imp")


def test_requests_with_one_outcome_throughout_are_not_signed():
    """A request rejected at every step (or accepted in full at every step) says nothing of which
    request it is: two unrelated ones would match (the probe: 14 requests of another run "left
    out" at 3-5 % acceptance)."""
    rows = [{"request": r, "step": s, "position": p, "label": 0 if p == 0 else None}
            for r in range(3) for s in range(30) for p in range(2)]
    flat = pl.DataFrame(rows, schema_overrides={"label": pl.Int8})
    assert request_signatures(flat).height == 0
    varied = flat.with_columns(pl.when((pl.col("step") < 4) & (pl.col("position") == 0) & (pl.col("request") == 1))
                               .then(1).otherwise(pl.col("label")).alias("label"))
    assert request_signatures(varied)["request"].to_list() == [1]


def test_an_export_that_would_come_back_with_other_labels_is_refused(small_run, tmp_path):
    """A step whose drafts were never verified (labels all empty) has no place in per-step counts:
    exported, it came back with a rejection it never had (the probe: 2,180 labelled drafts became
    2,225)."""
    import shutil

    from ..conftest import reseal

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    from ..conftest import steps_agreeing

    f, s = sorted((run / "drafts").glob("*.parquet"))[0], sorted((run / "steps").glob("*.parquet"))[0]
    d = pl.read_parquet(f)
    first = d.select("request", "step").row(0)
    d = d.with_columns(pl.when((pl.col("request") == first[0]) & (pl.col("step") == first[1])).then(None)
                       .otherwise(pl.col("label")).alias("label"))
    d.write_parquet(f)
    steps_agreeing(d, pl.read_parquet(s)).write_parquet(s)  # that step verified nothing (live AV trimmed it all)
    from ..conftest import outputs_agreeing, schedule_agreeing

    outputs_agreeing(run)
    schedule_agreeing(run)
    reseal(run)
    with pytest.raises(DataError, match="would come back with"):
        export("vllm-steps", run, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()
