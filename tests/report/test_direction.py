"""Features whose lower values mean acceptance are scored negated (every AUC reads higher = better),
with the raw value's AUC kept beside it; nothing in the terminal tables is cut or read as markup."""

import numpy as np
import polars as pl
import pytest
from rich.console import Console
from sklearn.metrics import roc_auc_score

from svt.errors import ConfigError
from svt.features import Feature, get_feature
from svt.report import EvaluateOptions, evaluate
from svt.report.console import evaluate_tables
from svt.report.text import add_row, new_table
from svt.traces import open_run


def test_entropy_is_scored_negated_with_the_raw_auc_kept(small_run):
    rep = evaluate([small_run], EvaluateOptions(features=["entropy", "neg_entropy", "q_max"], bootstrap=20))
    d = open_run(small_run).scan("drafts").filter(pl.col("label").is_not_null()).collect()
    y, h = d["label"].to_numpy(), d["q_entropy"].to_numpy().astype(np.float64)
    e = rep["features"]["entropy"]
    assert e["direction"] == -1 and e["shown_as"] == "−entropy"
    raw = roc_auc_score(y, h)
    assert raw < 0.5  # low entropy predicts acceptance on the tiny pair
    assert e["auc_raw"] == pytest.approx(raw, abs=1e-9)
    assert e["auc"] == pytest.approx(roc_auc_score(y, -h), abs=1e-9)
    assert e["auc"] == pytest.approx(rep["features"]["neg_entropy"]["auc"], abs=1e-12)
    pos = d["position"].to_numpy()
    for p, block in e["per_position"].items():
        m = pos == p
        if block["auc"] is not None:
            assert block["auc"] == pytest.approx(roc_auc_score(y[m], -h[m]), abs=1e-9)
            assert block["auc_raw"] == pytest.approx(roc_auc_score(y[m], h[m]), abs=1e-9)
    lo, hi = e["ci95"]["auc"]
    assert lo <= e["auc"] <= hi and lo > 0.5
    # the ROC curve is the negated feature's: above the diagonal
    roc = e["curves"]["roc"]
    assert np.trapezoid(roc["tpr"], roc["fpr"]) == pytest.approx(e["auc"], abs=0.02)
    assert "auc_raw" not in rep["features"]["q_max"]


def test_bootstrap_gives_intervals_per_position(small_run):
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], bootstrap=30))
    for p, block in rep["features"]["q_max"]["per_position"].items():
        if block["auc"] is not None:
            lo, hi = block["ci95"]["auc"]
            assert lo <= block["auc"] <= hi, p
            # a zero-width interval only where every resample ranks perfectly (a late position's few drafts)
            assert lo < hi or lo == hi == block["auc"] == 1.0, p
        lo, hi = block["ci95"]["ece"]
        assert lo <= hi


def test_probability_features_must_point_up():
    with pytest.raises(ConfigError, match="higher must mean"):
        Feature("p_bad", pl.col("q_max"), "", True, probability=True, direction=-1)
    with pytest.raises(ConfigError, match="direction must be"):
        Feature("bad", pl.col("q_max"), "", True, direction=0)
    assert get_feature("entropy").direction == -1 and get_feature("q_max").direction == 1


def test_tables_are_never_cut_and_names_are_not_markup():
    t = new_table("policy", "tok/s total", title="replay [measured]")
    long = "AV irls-online(logit_qmax) [engine rule] " + "x" * 60
    add_row(t, long, "10,298")
    narrow = Console(width=40, record=True, file=open("/dev/null", "w"))
    narrow.print(t)
    text = narrow.export_text()
    assert "…" not in text
    assert "".join(text.split()).count("[enginerule]") == 1  # folded over lines, all there
    wide = Console(width=100_000, record=True, file=open("/dev/null", "w"))
    wide.print(t)
    text = wide.export_text()
    assert long in text and "[measured]" in text


def test_evaluate_tables_carry_the_direction_legend(small_run):
    rep = evaluate([small_run], EvaluateOptions(features=["entropy", "q_max"]))
    items = evaluate_tables(rep)
    c = Console(width=100_000, record=True, file=open("/dev/null", "w"))
    for item in items:
        c.print(item)
    text = c.export_text()
    assert "−entropy" in text and "auc_raw" in text
