"""Every figure kind renders from a real small report to a valid image of sensible size."""

import math
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from svt.cli import app

COSTS = Path(__file__).resolve().parents[2] / "configs" / "costs" / "h100-llama8b-eagle.yaml"


@pytest.fixture(scope="module")
def report_dir(small_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("rep")
    fits = out / "fits"
    r = CliRunner()
    assert r.invoke(app, ["fit", str(small_run), "--model", "irls-online", "--out", str(fits / "o.json")]).exit_code == 0
    res = r.invoke(app, ["evaluate", str(small_run), "--out", str(out), "--feature", "q_max", "--feature", "q_sampled",
                         "--fit", str(fits / "o.json"), "--costs", str(COSTS)])
    assert res.exit_code == 0, res.output
    return out


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("kind", ["reliability", "roc", "per-position", "pareto", "features"])
def test_each_kind_renders(report_dir, kind, tmp_path):
    out = tmp_path / f"{kind}.png"
    r = CliRunner().invoke(app, ["plot", kind, str(report_dir), "--out", str(out)])
    assert r.exit_code == 0, r.output
    w, h = _png_size(out)
    assert 600 <= w <= 2400 and 300 <= h <= 2000
    assert out.stat().st_size > 15_000  # drawn content, not an empty canvas


def test_coefficients_svg_and_all(report_dir, tmp_path):
    fit = report_dir / "fits" / "o.json"
    r = CliRunner().invoke(app, ["plot", "coefficients", str(fit), "--out", str(tmp_path / "c.svg")])
    assert r.exit_code == 0 and (tmp_path / "c.svg").read_text().lstrip().startswith("<?xml")
    r = CliRunner().invoke(app, ["plot", "all", str(report_dir), "--fit", str(fit)])
    assert r.exit_code == 0, r.output
    md = (report_dir / "report.md").read_text()
    assert "![pareto](figures/pareto.png)" in md and "![coefficients-o](figures/coefficients-o.png)" in md


def test_bad_plot_input(tmp_path, report_dir):
    r = CliRunner().invoke(app, ["plot", "sunburst", str(report_dir), "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 2 and "known kinds" in r.output
    r = CliRunner().invoke(app, ["plot", "roc", str(report_dir), "--out", str(tmp_path / "x.jpg")])
    assert r.exit_code == 2 and ".png or .svg" in r.output
    r = CliRunner().invoke(app, ["plot", "coefficients", str(report_dir), "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 5 and "irls-online" in r.output


@pytest.fixture(scope="module")
def hvd_report(greedy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hvdrep")
    r = CliRunner()
    res = r.invoke(app, ["fit", str(greedy_run), "--model", "yield-linear", "--out", str(out / "y.json")])
    assert res.exit_code == 0, res.output
    res = r.invoke(app, ["evaluate", str(greedy_run), "--out", str(out), "--feature", "q_max", "--fit",
                         str(out / "y.json"), "--costs", str(COSTS)])
    assert res.exit_code == 0, res.output
    assert "Hybrid Verified Decoding replay" in res.output and "yield predictors" in res.output
    return out


@pytest.mark.parametrize("kind", ["hvd", "yield-pr"])
def test_hvd_kinds_render(hvd_report, kind, tmp_path):
    out = tmp_path / f"{kind}.png"
    r = CliRunner().invoke(app, ["plot", kind, str(hvd_report), "--out", str(out)])
    assert r.exit_code == 0, r.output
    w, h = _png_size(out)
    assert 600 <= w <= 4000 and 300 <= h <= 2000 and out.stat().st_size > 15_000


def test_hvd_plot_needs_an_hvd_report(report_dir, tmp_path):
    r = CliRunner().invoke(app, ["plot", "hvd", str(report_dir), "--out", str(tmp_path / "x.png")])
    assert r.exit_code == 5 and "cache drafts" in r.output and "Traceback" not in r.output


def test_plot_all_links_related_reports(report_dir, hvd_report):
    r = CliRunner().invoke(app, ["plot", "all", str(hvd_report)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["plot", "all", str(report_dir), "--link", str(hvd_report)])
    assert r.exit_code == 0, r.output
    md = (report_dir / "report.md").read_text()
    assert "Related report" in md and "figures/hvd.png" in md
    r = CliRunner().invoke(app, ["plot", "all", str(report_dir), "--link", str(report_dir / "nope")])
    assert r.exit_code == 5 and "not a report directory" in r.output


def test_figures_draw_the_stored_curves(report_dir, hvd_report):
    """The lines in the figures are the report's stored numbers (plots never recompute)."""
    import json

    import numpy as np

    from svt import plots

    rep = json.loads((report_dir / "report.json").read_text())
    fig = plots.roc(rep)
    lines = {ln.get_label().split(" (")[0]: ln for ln in fig.axes[0].get_lines()}
    for name, f in rep["features"].items():
        if f.get("curves", {}).get("roc") and f.get("auc") is not None:
            np.testing.assert_allclose(lines[name].get_xdata(), f["curves"]["roc"]["fpr"])
            np.testing.assert_allclose(lines[name].get_ydata(), f["curves"]["roc"]["tpr"])
    fig = plots.reliability(rep)
    lines = {ln.get_label().split(" (")[0]: ln for ln in fig.axes[0].get_lines()}
    q = rep["features"]["q_max"]["curves"]["reliability"]
    np.testing.assert_allclose(lines["q_max"].get_xdata(), q["mean_pred"])
    np.testing.assert_allclose(lines["q_max"].get_ydata(), q["rate"])
    hv = json.loads((hvd_report / "report.json").read_text())
    fig = plots.hvd(hv)
    ax = fig.axes[0]  # the `all` panel
    line = next(ln for ln in ax.get_lines() if ln.get_label() == "HVD yield-linear")
    want = sorted((r["tau"], r["speedup_vs_greedy"]) for r in hv["hvd"]["rows"]
                  if r["group"] == "all" and r.get("predictor") == "yield-linear" and r["tau"] is not None)
    np.testing.assert_allclose(line.get_xdata(), [t for t, _ in want])
    np.testing.assert_allclose(line.get_ydata(), [v for _, v in want])
    model = next(ln for ln in ax.get_lines() if ln.get_label() == "model-only")
    assert model.get_ydata()[0] == pytest.approx(next(r["speedup_vs_greedy"] for r in hv["hvd"]["rows"]
                                                     if r["group"] == "all" and r["policy"] == "model-only"))
    # without cost refits (a roofline file) the bands are the requests' 95 % range, said in the caption
    if not hv["hvd"].get("cost_refits"):
        band = next(c for c in ax.collections if len(c.get_paths()))
        lo, hi = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
        ranges = [r["request_ci95"]["speedup_vs_greedy"] for r in hv["hvd"]["rows"]
                  if r["group"] == "all" and r.get("predictor") == "yield-linear" and r["tau"] is not None]
        assert lo == pytest.approx(min(a for a, _ in ranges)) and hi == pytest.approx(max(b for _, b in ranges))
        assert any("resamples of the requests" in t.get_text() for t in fig.texts)


def test_hvd_report_json_is_valid_json_and_keeps_its_infinite_tau(hvd_report):
    """Issue 23: every HVD report.json held `-Infinity` (the τ grid), which is not JSON."""
    import json

    from svt.fileio import read_json

    def strict(name):
        raise ValueError(f"not JSON: {name}")

    text = (hvd_report / "report.json").read_text()
    doc = json.loads(text, parse_constant=strict)
    marks = doc["non_finite"]
    assert marks and set(marks.values()) <= {"inf", "-inf", "nan"}
    taus = [p for p, v in marks.items() if p.startswith("/hvd/") and p.endswith("/tau")]
    assert taus and all(marks[p] in ("inf", "-inf") for p in taus)
    restored = read_json(hvd_report / "report.json", "Report")
    assert any(r.get("tau") == -math.inf for r in restored["hvd"]["rows"])
