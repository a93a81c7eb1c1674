"""Held-out scoring when provenance is gone (issue 53). Acceptance signatures identify only requests
of 16+ verified steps, so an export of short requests with its svt keys removed imported as new data
and the fit was scored on its own training rows. A fit now also signs its training requests' tokens;
a request of a run the fit never saw must be shown not to be a training request (by its tokens, or
by its acceptance sequence), and one that cannot be is refused unless --score-unverified is given,
which the fit's description then states."""

import json

import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import DataError
from svt.fit import fit_runs
from svt.interop import import_trace
from svt.interop.export import export
from svt.report import EvaluateOptions, evaluate

FEATURE = "logistic(position)"
STEPS = 6  # below the 16 verified steps an acceptance signature needs


@pytest.fixture(scope="module")
def fit(small_run, tmp_path_factory):
    return fit_runs([small_run], "logistic", feature="position").save(tmp_path_factory.mktemp("uvfit") / "lr.json")


def _scored(run, fit, **opts):
    return evaluate([run], EvaluateOptions(features=["position"], fits=[str(fit)], **opts))["features"][FEATURE]


def _records(small_run, tmp_path, fmt):
    return [json.loads(x) for x in export(fmt, small_run, tmp_path / f"{fmt}.jsonl").read_text().splitlines()]


def _short(r: dict, fmt: str) -> dict:
    if fmt == "specdec-tokens":
        return {**r, "steps": r["steps"][:STEPS]}
    return {**r, "per_step_drafted": r["per_step_drafted"][:STEPS], "per_step_accepted": r["per_step_accepted"][:STEPS]}


def _import(rows, tmp_path, fmt, name="imp"):
    f = tmp_path / f"{name}.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return import_trace(fmt, f, tmp_path / name).run_dir


def _bare(r: dict, tokens: bool = True) -> dict:
    """``r`` without the svt keys (and without its token ids unless ``tokens``)."""
    drop = ("prompt_token_ids", "output_token_ids")
    return {k: v for k, v in r.items() if not k.startswith("svt_") and (tokens or k not in drop)}


def test_short_requests_without_tokens_are_not_scored_as_held_out(small_run, fit, tmp_path):
    rows = [_bare(_short(r, "specdec-tokens"), tokens=False) for r in _records(small_run, tmp_path, "specdec-tokens")]
    run = _import(rows, tmp_path, "specdec-tokens")
    with pytest.raises(DataError, match="cannot be checked against the logistic fit's training requests") as err:
        _scored(run, fit)
    assert "--score-unverified" in str(err.value) and "prompt and output tokens" in str(err.value)
    # asked for: scored, and the report says so
    rep = evaluate([run], EvaluateOptions(features=["position"], fits=[str(fit)], score_unverified=True))
    assert rep["features"][FEATURE]["n"] > 0
    assert f"{len(rows)} request(s) scored whose held-out status svt could not verify" in \
        rep["features"][FEATURE]["description"]


def test_the_cli_option_scores_them_and_the_report_says_so(small_run, fit, tmp_path):
    rows = [_bare(_short(r, "specdec-tokens"), tokens=False) for r in _records(small_run, tmp_path, "specdec-tokens")]
    run = _import(rows, tmp_path, "specdec-tokens")
    args = ["evaluate", str(run), "--feature", "position", "--fit", str(fit)]
    refused = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r0")])
    assert refused.exit_code != 0 and "cannot be checked" in refused.output, refused.output
    ok = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "r1"), "--score-unverified"])
    assert ok.exit_code == 0, ok.output
    assert "could not verify (--score-unverified)" in (tmp_path / "r1" / "report.md").read_text()


def test_short_requests_with_tokens_are_recognised_as_training_data(small_run, fit, tmp_path):
    rows = [_bare(_short(r, "vllm-steps")) for r in _records(small_run, tmp_path, "vllm-steps")]
    run = _import(rows, tmp_path, "vllm-steps")
    with pytest.raises(DataError, match="repeat the logistic fit's training requests"):
        _scored(run, fit)


def test_two_short_requests_swapped_in_the_source_map_are_refused(small_run, fit, tmp_path):
    rows = [_short(r, "vllm-steps") for r in _records(small_run, tmp_path, "vllm-steps")]
    trained = {r for _, r in json.loads(fit.read_text())["training"]["train_request_ids"]}
    a = next(i for i, r in enumerate(rows) if r["svt_request"] in trained)
    b = next(i for i, r in enumerate(rows) if r["svt_request"] not in trained)
    rows[a]["svt_request"], rows[b]["svt_request"] = rows[b]["svt_request"], rows[a]["svt_request"]
    run = _import(rows, tmp_path, "vllm-steps")
    with pytest.raises(DataError, match="is mapped to (training|held-out) request"):
        _scored(run, fit)
    # unswapped, the same short import is scored on the held-out requests
    rows[a]["svt_request"], rows[b]["svt_request"] = rows[b]["svt_request"], rows[a]["svt_request"]
    assert _scored(_import(rows, tmp_path, "vllm-steps", "ok"), fit)["n"] > 0


def test_a_fit_without_token_signatures_cannot_vouch_for_short_requests(small_run, fit, tmp_path):
    old = json.loads(fit.read_text())
    assert old["training"]["train_requests_without_tokens"] == 0 and old["training"]["train_token_signatures"]
    del old["training"]["train_token_signatures"], old["training"]["train_requests_without_tokens"]
    older = tmp_path / "older.json"
    older.write_text(json.dumps(old))
    rows = [_bare(_short(r, "vllm-steps")) for r in _records(small_run, tmp_path, "vllm-steps")]
    run = _import(rows, tmp_path, "vllm-steps")
    with pytest.raises(DataError, match="records no token signatures"):
        _scored(run, older)


def test_new_data_with_tokens_is_scored_whole(small_run, greedy_run, fit):
    labelled = evaluate([greedy_run], EvaluateOptions(features=["position"]))["features"]["position"]["n"]
    assert _scored(greedy_run, fit)["n"] == labelled


def test_a_source_map_over_short_requests_without_tokens_is_not_trusted(small_run, fit, tmp_path):
    """The import names its source requests, but nothing in the data can confirm the map."""
    rows = [{k: v for k, v in _short(r, "specdec-tokens").items() if k not in ("prompt_token_ids", "output_token_ids")}
            for r in _records(small_run, tmp_path, "specdec-tokens")]
    run = _import(rows, tmp_path, "specdec-tokens")
    assert json.loads((run / "run.json").read_text())["import"]["svt_source"]
    with pytest.raises(DataError, match="that an import's source map names cannot be checked"):
        _scored(run, fit)
    assert _scored(run, fit, score_unverified=True)["n"] > 0


def test_a_prompt_rendered_otherwise_still_repeats_its_training_output(small_run, fit, tmp_path):
    """Found by a probe: a BOS token added to every prompt (another tool's tokenizer) made every
    training request look new; the output alone still names it."""
    rows = [_bare(_short(r, "vllm-steps")) for r in _records(small_run, tmp_path, "vllm-steps")]
    for r in rows:  # short (no acceptance signature) and the prompt rendered otherwise: the output names it
        r["prompt_token_ids"] = [1, *r["prompt_token_ids"]]
    run = _import(rows, tmp_path, "vllm-steps")
    with pytest.raises(DataError, match="repeat the logistic fit's training requests"):
        _scored(run, fit)


def test_damaged_token_signatures_are_refused(fit, tmp_path):
    from svt.fit.files import training_problem

    t = json.loads(fit.read_text())["training"]
    assert training_problem(t) is None and t["train_output_signatures"]
    assert "train_output_signatures" in training_problem({**t, "train_output_signatures": ["xyz"]})
    assert "train_requests_without_tokens" in training_problem({**t, "train_requests_without_tokens": -1})
