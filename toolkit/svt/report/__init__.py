"""Reports: building report.json / report.md from runs (and, later, fits and simulations)."""

from svt.report.evaluate import EvaluateOptions, evaluate
from svt.report.render import to_markdown, write_report

__all__ = ["EvaluateOptions", "evaluate", "to_markdown", "write_report"]
