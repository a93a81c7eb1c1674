"""The figures `svt plot all` drew for the report, and the related reports' figures (report.md only)."""

from __future__ import annotations

from pathlib import Path

from svt.report.sections.base import Section


class Figures(Section):
    name = "figures"

    def markdown(self, report: dict) -> list[str]:
        return figures_markdown(report)


def figures_markdown(report: dict) -> list[str]:
    lines: list[str] = []
    if report.get("figures"):
        lines += ["## Figures\n", *(f"![{Path(f).stem}]({f})\n" for f in report["figures"])]
    for other in report.get("related") or []:
        lines += [f"## Related report: [{other['report']}]({other['report']})\n",
                  *(f"![{Path(f).stem}]({f})\n" for f in other["figures"])]
    return lines
