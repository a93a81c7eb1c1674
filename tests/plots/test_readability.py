"""A reader's look at every figure (issue 54): no text cut off at the figure's edge, no two series of
one axes drawn alike, no legend over the data; checked on real reports for every plot kind, and
each check shown to fire on the figure defect it is for."""

import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from typer.testing import CliRunner

from svt import plots
from svt.cli import app
from svt.plots.readability import alike_series, clipped_texts, legends_over_data, problems
from svt.plots.style import COLORS, palette

COSTS = Path(__file__).resolve().parents[2] / "configs" / "costs" / "h100-llama8b-eagle.yaml"


@pytest.fixture(scope="module")
def full_report(small_run, tmp_path_factory):
    """Every default feature and two fits (a dozen series: more than matplotlib's 10-colour cycle),
    and the AV replay."""
    out = tmp_path_factory.mktemp("readrep")
    r = CliRunner()
    assert r.invoke(app, ["fit", str(small_run), "--model", "irls-online,logistic", "--out", str(out / "fits")]).exit_code == 0
    res = r.invoke(app, ["evaluate", str(small_run), "--out", str(out), "--fit", str(out / "fits" / "irls-online.json"),
                         "--fit", str(out / "fits" / "logistic.json"), "--costs", str(COSTS)])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("kind", ["features", "roc", "reliability", "per-position", "pareto"])
def test_every_chain_figure_passes_a_readers_look(full_report, kind):
    report = plots.read_input(full_report)
    assert len(report["features"]) >= 10
    fig = plots.PLOTS[kind](report)
    assert problems(fig) == []
    plt.close(fig)


def test_the_coefficient_path_passes_a_readers_look(full_report):
    fig = plots.coefficients(plots.read_input(full_report / "fits" / "irls-online.json"))
    assert problems(fig) == []
    plt.close(fig)


def test_plot_all_writes_every_figure_without_a_warning(full_report):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        written = plots.plot_all(full_report)
    assert len(written) >= 5
    assert [str(w.message) for w in seen if issubclass(w.category, plots.UnreadableFigure)] == []


def test_the_palette_gives_every_series_its_own_colour():
    for n in (3, 10, 12, 20, 27):
        assert len({tuple(np.round(plt.matplotlib.colors.to_rgba(c), 4)) for c in palette(n)[:n]}) == n


def _bars(colors, legend_loc="upper left", title="t"):
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for i, c in enumerate(colors):
        ax.bar(np.arange(5) + i * 0.06, np.full(5, 0.9), 0.06, color=c, label=f"s{i}")
    ax.set(ylim=(0, 1), title=title)
    ax.legend(loc=legend_loc, fontsize=6, ncol=2)
    fig.canvas.draw()
    return fig


def test_each_check_fires_on_its_defect():
    cycled = _bars([COLORS[i % 10] for i in range(12)])
    assert len(alike_series(cycled)) == 2  # s0 and s10, s1 and s11
    assert legends_over_data(cycled)  # the legend sits on the bars
    fine = _bars(palette(12)[:12], legend_loc="upper center")
    fine.axes[0].get_legend().set_bbox_to_anchor((0.5, -0.1))
    fine.axes[0].get_legend().set_loc("upper center")
    fine.set_size_inches(6, 5)
    assert alike_series(fine) == [] and legends_over_data(fine) == []
    long = _bars(palette(2)[:2], title="a title far too long for its figure " * 4)
    assert any("cut off" in p for p in clipped_texts(long))
    for f in (cycled, fine, long):
        plt.close(f)


def test_svt_plot_says_what_a_reader_would_stumble_on(full_report, tmp_path, monkeypatch):
    import svt.plots.readability as readability

    monkeypatch.setattr(readability, "problems", lambda fig: ["text 'x' is cut off at the figure's edge"])
    r = CliRunner().invoke(app, ["plot", "roc", str(full_report), "--out", str(tmp_path / "roc.png")])
    assert r.exit_code == 0 and "warning: roc.png: text 'x' is cut off" in r.output, r.output


def _map_report(requests_per_workload: int) -> dict:
    rows = [{"group": g, "strength": s, "hvd_gain_over_best_single": 0.1 * s, "gain_interval": [0.0, 0.2 * s],
             "gain_interval_spans_zero": False, "requests": requests_per_workload * (3 if g == "all" else 1)}
            for g in ("code", "prose", "edit", "all") for s in (1.5, 2.0, 3.0)]
    return {"hvd_map": {"rows": rows, "predictor": "yield-mlp"}, "hvd": {"costs": {"path": "c.yaml"}},
            "runs": [{"run": "r", "models": {}, "sampling": {}}], "svt_version": "x"}


def test_the_hvd_map_draws_the_all_row_alone_when_every_workload_cell_is_thin():
    fig = plots.hvd_map(_map_report(4))  # 4 scored requests a workload: every workload cell hatched
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["all"]
    assert "per-workload rows left out" in fig._supxlabel.get_text().replace("\n", " ")
    assert problems(fig) == []
    fig = plots.hvd_map(_map_report(12))
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["code", "prose", "edit", "all"]
    assert problems(fig) == []
    plt.close("all")
