"""The sections of an evaluation report, in the order report.json is computed, report.md and the
console print them, and the regression report judges them (see :mod:`svt.report.sections.base`).

Adding a section: one module with a :class:`Section` subclass, and one line below."""

from svt.report.sections.acceptance import Acceptance
from svt.report.sections.base import Judging, ReportContext, Section
from svt.report.sections.features import Features
from svt.report.sections.figures import Figures
from svt.report.sections.groups import Groups
from svt.report.sections.hvd import Hvd
from svt.report.sections.lossless import Lossless
from svt.report.sections.realism import Realism
from svt.report.sections.simulation import Simulation

SECTIONS: list[Section] = [Features(), Acceptance(), Lossless(), Simulation(), Hvd(), Realism(), Groups(), Figures()]

__all__ = ["SECTIONS", "Judging", "ReportContext", "Section"]
