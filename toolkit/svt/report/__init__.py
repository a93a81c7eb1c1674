"""Reports: building report.json / report.md from runs, section by section (:mod:`svt.report.sections`)."""

from svt.report.evaluate import evaluate
from svt.report.render import to_markdown, write_report
from svt.report.scoring import EvaluateOptions

__all__ = ["EvaluateOptions", "evaluate", "to_markdown", "write_report"]
