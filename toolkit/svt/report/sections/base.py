"""The report-section contract: one small class per section of a report.

A section computes its part of report.json from the runs (``compute``), writes its part of
report.md (``markdown``) and of the terminal's output (``console``), and gives the regression
report its rows (``compare``: one judged row per metric, see :mod:`svt.report.judge`). `svt
evaluate`, report.md, the console and `svt compare` each walk ``SECTIONS`` in order, so adding a
section is one new module and one line in ``svt/report/sections/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import polars as pl

from svt.features import Feature
from svt.report.scoring import EvaluateOptions, Opened


@dataclass
class ReportContext:
    """What the sections compute from: the runs, the options, the opened runs, the features
    (fitted predictors included) and, when a section needs them in memory, the drafts."""

    runs: list[Path]
    opts: EvaluateOptions
    opened: Opened
    metas: list[dict]
    feats: list[Feature]
    source: pl.LazyFrame  # every draft (lazy; in memory when ``drafts`` is)
    drafts: pl.DataFrame | None = None
    labelled: pl.DataFrame | None = None
    dists: pl.DataFrame | None = None
    in_memory: bool = False
    yield_fits: list[str] = field(default_factory=list)
    not_computed: dict[str, str] = field(default_factory=dict)  # feature -> why (an import lacks its columns)

    @property
    def infos(self) -> list[dict]:
        return self.opened.infos


@dataclass
class Judging:
    """What every section's comparison shares: the user's tolerances, whether the reports scored the
    same data (then intervals do not apply), and the list of what was not compared, and why."""

    tolerances: dict
    paired: bool
    skipped: list[str] = field(default_factory=list)


class Section:
    """Base class: every method has an empty default, so a section implements what it has."""

    name: ClassVar[str] = ""  # how the regression report names the section in an error

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        """The section's keys of report.json (``report`` holds the sections computed before)."""
        return {}

    def markdown(self, report: dict) -> list[str]:
        return []

    def console(self, report: dict) -> list:
        return []

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        return []
