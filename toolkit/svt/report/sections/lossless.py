"""The losslessness audit of trimming: the total-variation distance between the output
distribution a trimming rule produces and the target's, on the positions logged in ``dists/``."""

from __future__ import annotations

from svt.report.lossless_audit import audit
from svt.report.sections.base import ReportContext, Section
from svt.report.text import fmt, md_table


class Lossless(Section):
    name = "losslessness"

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        if ctx.dists is None or not ctx.dists.height:
            return {"lossless_bias": None}
        rows = {}
        for f in ctx.feats:
            if f.partial:  # fitted predictors: see the lossless flag of their feature
                continue
            thr = float(ctx.labelled.select(f.expr.median()).item())
            rows[f.name] = {"lossless": f.lossless, **audit(ctx.drafts, ctx.dists, f, thr)}
        return {"lossless_bias": rows}

    def markdown(self, report: dict) -> list[str]:
        if not report.get("lossless_bias"):
            return ["## Losslessness bias of trimming\n", "Not computed: the run has no `dists/` table "
                    "(collect with `log.dists_fraction` > 0).\n"]
        return ["## Losslessness bias of trimming\n",
                "Rule: do not verify a draft when feature < threshold (the feature's median). Bias = "
                "total-variation distance between the resulting output distribution and the target's, "
                "over the positions logged in `dists/`.\n",
                md_table(["feature", "lossless", "threshold", "positions", "mean bias", "max bias"],
                         [[n, fmt(b["lossless"]), fmt(b["threshold"]), fmt(b["positions"]),
                           fmt(b["mean_bias"], 6), fmt(b["max_bias"], 6)]
                          for n, b in report["lossless_bias"].items()]), ""]
