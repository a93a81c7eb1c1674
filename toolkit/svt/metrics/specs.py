"""Every metric svt reports, described once: which way is better, the range of its values, the
regression report's default tolerance, whether it needs a probability, how it is printed.

The tables, report.md, the console, the regression report and the plots all read these specs;
adding a metric to a report is one spec here plus the code that computes it.

>>> METRICS["log_loss"].direction, METRICS["auc"].unit
(-1, True)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    name: str
    group: str  # "table" (every score: overall, per position, ...), "simulation", "yield" or "hvd"
    direction: int  # +1: higher is better; -1: lower is better; 0: descriptive, never judged
    tolerance: float | None = None  # the regression report's default; None: not compared
    relative: bool = False  # the tolerance is a share of the baseline value (else absolute)
    unit: bool = False  # values lie in [0, 1]: anything outside is a damaged report
    probability: bool = False  # defined only for a score that is a probability of acceptance
    fmt: str = ".4f"
    report: bool = True  # a column of report.md's tables
    console: bool = False  # a column of the terminal's feature table
    description: str = ""

    def format(self, value) -> str:
        if value is None:
            return "—"
        return f"{value:,}" if isinstance(value, int) else format(value, self.fmt)


_SPECS = (
    MetricSpec("auc", "table", 1, 0.005, unit=True, console=True,
               description="probability that an accepted draft scores above a rejected one (ties count one half)"),
    MetricSpec("log_loss", "table", -1, 0.005, probability=True, console=True,
               description="mean negative log-likelihood of the labels (probabilities clipped to [1e-7, 1 - 1e-7])"),
    MetricSpec("ece", "table", -1, 0.003, unit=True, probability=True, console=True,
               description="expected calibration error, equal-width bins"),
    MetricSpec("ece_mass", "table", -1, None, unit=True, probability=True,
               description="expected calibration error, equal-mass bins (descriptive: not compared)"),
    MetricSpec("brier", "table", -1, 0.003, unit=True, probability=True, console=True,
               description="mean squared error of the probability"),
    MetricSpec("mean_pred", "table", 0, unit=True, probability=True, description="mean predicted probability"),
    MetricSpec("accept_rate", "table", 0, unit=True, description="share of the drafts accepted"),
    MetricSpec("n", "table", 0, fmt=",", console=True, description="labelled drafts"),
    # the AV replay: a request-level bootstrap interval when evaluated with --replay-bootstrap;
    # without one, two independent draws of the demo experiment (seeds 0 and 1, 240 requests)
    # differ by 0.7 % (median) and 2.1 % (max) in replay throughput, hence 3 %
    MetricSpec("throughput", "simulation", 1, 0.03, relative=True, fmt=".1f",
               description="tokens per unit of time across the batch (replay)"),
    MetricSpec("interactivity", "simulation", 1, 0.03, relative=True, fmt=".2f",
               description="tokens per unit of time per request (replay)"),
    MetricSpec("speedup_vs_greedy", "hvd", 1, 0.01, fmt=".3f",
               description="HVD replay's speed against greedy decoding"),
    MetricSpec("mse", "yield", -1, 0.02, relative=True, description="mean squared error of the predicted yield"),
    MetricSpec("mae", "yield", -1, 0.02, relative=True, description="mean absolute error of the predicted yield"),
    MetricSpec("precision", "yield", 1, 0.01, unit=True, description="precision of the high-yield drafts"),
    MetricSpec("recall", "yield", 1, 0.01, unit=True, description="recall of the high-yield drafts"),
    MetricSpec("f1", "yield", 1, 0.01, unit=True, description="F1 of the high-yield drafts"),
    MetricSpec("average_precision", "yield", 1, 0.01, unit=True,
               description="average precision of the high-yield drafts"),
)
METRICS: dict[str, MetricSpec] = {m.name: m for m in _SPECS}


def register_metric(spec: MetricSpec) -> MetricSpec:
    """Add a metric (a report section's module registers the metrics it computes)."""
    if spec.name in METRICS and METRICS[spec.name] != spec:
        raise ValueError(f"metric {spec.name!r} is already registered with another spec")
    METRICS[spec.name] = spec
    return spec


def names(group: str, *, compared: bool = False, probability: bool | None = None, report: bool = False,
          console: bool = False) -> tuple[str, ...]:
    """The metrics of a group, in spec order, optionally only those compared by the regression
    report, needing a probability (or not), shown in report.md or on the console."""
    return tuple(m.name for m in METRICS.values() if m.group == group
                 and (not compared or m.tolerance is not None)
                 and (probability is None or m.probability == probability)
                 and (not report or m.report) and (not console or m.console))
