"""User features are checked on every row they return (issue 34): a result of another length,
strings or lists, or a failure past the first 1,000 rows is one clear error naming the feature,
in `svt evaluate` and `svt fit` as in the library; a feature may not read its label, and a
lossless one nothing the target computed."""

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError
from svt.features import Feature, check_feature, feature_values

N = 3_000
FRAME = pl.DataFrame({"q_max": np.linspace(0.01, 0.99, N), "p_max": np.linspace(0.5, 0.9, N),
                      "label": np.arange(N) % 2})
LATE = pl.when(pl.int_range(pl.len()) < 2_500).then(pl.col("q_max")).otherwise(pl.lit("x")).cast(pl.Float64)


def feat(expr, lossless=False):
    return Feature("user_t", expr, "", lossless)


@pytest.mark.parametrize("expr, says", [
    (pl.col("q_max").head(5), "another length"),
    (pl.col("q_max").cast(pl.String), "String values"),
    (pl.concat_list("q_max", "q_max"), "List"),
    (LATE, "cannot be computed"),
])
def test_a_bad_feature_is_one_error_naming_it(expr, says):
    with pytest.raises(ConfigError, match=f"'user_t'.*{says}"):
        feature_values(feat(expr), FRAME)


def test_a_failure_past_the_first_rows_passes_the_early_check_and_is_caught_where_computed():
    check_feature(feat(LATE), FRAME)  # the first 1,000 rows are fine
    with pytest.raises(ConfigError, match="cannot be computed"):
        feature_values(feat(LATE), FRAME.lazy())


def test_good_features_give_one_float_per_row():
    np.testing.assert_array_equal(feature_values(feat(pl.col("q_max") ** 2), FRAME), FRAME["q_max"] ** 2)
    assert (feature_values(feat(pl.lit(0.5)), FRAME) == 0.5).all() and len(feature_values(feat(pl.lit(0.5)), FRAME)) == N
    assert feature_values(feat(pl.col("q_max") > 0.5), FRAME).dtype == np.float64  # booleans are numbers


def test_no_feature_reads_its_label_and_no_lossless_one_the_target():
    with pytest.raises(ConfigError, match="reads the column 'label'"):
        feat(pl.col("label") * 1.0)
    with pytest.raises(ConfigError, match="reads the column 'label'"):
        feat(pl.col("q_max") + pl.col("label"), lossless=False)
    with pytest.raises(ConfigError, match="declared lossless but reads p_max"):
        feat(pl.col("p_max") * pl.col("q_max"), lossless=True)
    assert not feat(pl.col("p_max"), lossless=False).lossless  # an oracle-style lossy feature may


runner = CliRunner()


@pytest.mark.parametrize("body, says", [
    ("return pl.col('q_max').head(3)", "another length"),
    ("return pl.col('q_max').cast(pl.String)", "String values"),
    # fails on the later positions' rows only, wherever they fall in the table's parts
    ("return pl.when(pl.col('position') < 3).then(pl.col('q_max')).otherwise(pl.lit('x')).cast(pl.Float64)",
     "cannot be computed"),
])
def test_evaluate_and_fit_refuse_a_bad_user_feature_in_one_line(small_run, tmp_path, monkeypatch, body, says):
    monkeypatch.chdir(tmp_path)
    name = f"feats_bad_{abs(hash(body)) % 10_000}"
    (tmp_path / f"{name}.py").write_text("import polars as pl\nfrom svt.features import feature\n\n"
                                         f"@feature(lossless=True)\ndef bad_t():\n    {body}\n")
    for args in (["evaluate", str(small_run), "--out", "rep", "--feature", "bad_t"],
                 ["fit", str(small_run), "--model", "logistic", "--feature", "bad_t", "--out", "f.json"]):
        r = runner.invoke(app, [*args, "--feature-module", name])
        assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
        assert not (tmp_path / "f.json").exists()


def test_a_lossless_feature_reading_the_label_is_refused_by_name(small_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "feats_label.py").write_text("import polars as pl\nfrom svt.features import feature\n\n"
                                             "@feature(lossless=True)\ndef cheat_t():\n    return pl.col('label') * 1.0\n")
    r = runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--feature-module", "feats_label",
                            "--feature", "cheat_t"])
    assert r.exit_code == 2 and "reads the column 'label'" in r.output and not (tmp_path / "rep").exists(), r.output


def test_evaluate_names_a_feature_that_fails_past_the_first_rows(small_run, tmp_path, monkeypatch):
    """The early check reads the first drafts (300 here); one labelled step lies beyond them, and
    the feature fails there only: the scoring pass must say which feature, not raise polars' error."""
    import svt.features
    from svt.traces import open_run

    monkeypatch.setattr(svt.features, "EARLY_CHECK_ROWS", 300)
    drafts = open_run(small_run).scan("drafts").select("request", "step", "label").collect()
    head = set(drafts.head(300).select("request", "step").iter_rows())  # what the early check reads
    late = min(set(drafts.filter(pl.col("label").is_not_null()).select("request", "step").iter_rows()) - head)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "feats_late.py").write_text(
        "import polars as pl\nfrom svt.features import feature\n\n@feature(lossless=True)\ndef late_t():\n"
        f"    bad = (pl.col('request') == {late[0]}) & (pl.col('step') == {late[1]})\n"
        "    return pl.when(~bad).then(pl.col('q_max')).otherwise(pl.lit('x')).cast(pl.Float64)\n")
    r = runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--feature-module", "feats_late",
                            "--feature", "q_max", "--feature", "late_t"])
    assert r.exit_code == 2 and "'late_t' cannot be computed" in r.output and "Traceback" not in r.output, r.output
