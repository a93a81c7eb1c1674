"""Acceptance: the labelled drafts' acceptance rate, the mean acceptance length, acceptance by draft
position (conditional and marginal) and, per probability score, the expected accepted length per
step against the realised one."""

from __future__ import annotations

import polars as pl

from svt.metrics.specs import MetricSpec, register_metric
from svt.metrics.tables import acceptance_by_position, length_calibration
from svt.report.judge import judge, metric_value, missing_row
from svt.report.scoring import step_parts, step_tables
from svt.report.sections.base import Judging, ReportContext, Section
from svt.report.text import fmt, md_table

# what a trace says without any draft probability (an import of counts): regression-tested too
register_metric(MetricSpec("acceptance_rate", "acceptance", 1, 0.01, unit=True,
                           description="share of the labelled drafts accepted"))
register_metric(MetricSpec("mean_acceptance_length", "acceptance", 1, 0.02, relative=True, fmt=".3f",
                           description="1 + accepted drafts per step"))
register_metric(MetricSpec("conditional_rate", "acceptance", 1, 0.02, unit=True,
                           description="accepted among the drafts the chain reached, at a position"))


def _acceptance_rows(base: dict, now: dict, judging: Judging) -> list[dict]:
    b, n = base.get("acceptance") or {}, now.get("acceptance") or {}
    items = [("all drafts", "", "acceptance_rate", b.get("rate"), n.get("rate")),
             ("all drafts", "", "mean_acceptance_length", b.get("mean_acceptance_length"),
              n.get("mean_acceptance_length"))]
    now_pos = {int(p["position"]): p for p in n.get("by_position") or []}
    items += [("by position", f"position {p['position']}", "conditional_rate", p.get("conditional"),
               now_pos.get(int(p["position"]), {}).get("conditional")) for p in b.get("by_position") or []]
    rows = []
    for item, where, m, bv, nv in items:
        base_v = metric_value(bv, m)
        if base_v is None:
            if bv is not None:
                judging.skipped.append(f"acceptance {where or item} {m}: the baseline's value is not a valid number")
            continue
        now_v = metric_value(nv, m)
        rows.append(missing_row("acceptance", item, where, m, "acceptance", base_v) if now_v is None else
                    {**judge(m, "acceptance", base_v, now_v, None, judging.tolerances),
                     "section": "acceptance", "item": item, "where": where})
    return rows


class Acceptance(Section):
    name = "acceptance"

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        return _acceptance_rows(base, now, judging)

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        by_position = acceptance_by_position(ctx.source)  # one pass; the totals are its sums (labels are 0/1)
        verified, accepted = int(by_position["verified"].sum()), int(by_position["accepted"].sum())
        complete = [f for f in ctx.feats if f.probability and not f.partial]
        mean_length, calib = step_tables(step_parts(ctx.opened, ctx.drafts), complete, ctx.opts.n_bins)
        acceptance = {"labelled": verified, "rate": accepted / verified if verified else float("nan"),
                      "mean_acceptance_length": float(mean_length),
                      "by_position": by_position.to_dicts()}
        lengths = {
            f.name: (calib[f.name] if not f.partial else
                     length_calibration(ctx.drafts.with_columns(f.expr.alias("_c")).filter(pl.col("_c").is_not_null()),
                                        "_c", n_bins=ctx.opts.n_bins, keys=("run", "request", "step")))
            for f in ctx.feats if f.probability
        }
        return {"acceptance": acceptance, "length_calibration": lengths}

    def markdown(self, report: dict) -> list[str]:
        lines = ["## Acceptance by draft position\n",
                 "Conditional = accepted / verified at the position (the chain reached it); marginal = "
                 "accepted / proposed.\n",
                 md_table(["position", "proposed", "verified", "accepted", "conditional", "marginal"],
                          [[str(r["position"]), fmt(r["proposed"]), fmt(r["verified"]), fmt(r["accepted"]),
                            fmt(r["conditional"]), fmt(r["marginal"])] for r in report["acceptance"]["by_position"]]),
                 ""]
        if report.get("length_calibration"):
            lines += ["## Expected accepted length per step\n",
                      "Predicted = sum over positions of the cumulative product of the confidences (what "
                      "Adaptive Verification's budget rule sums); realised = accepted drafts in the step.\n",
                      md_table(["predictor", "steps", "mean predicted", "mean realised", "length ECE"],
                               [[n, fmt(c["steps"]), fmt(c["mean_predicted"]), fmt(c["mean_realised"]),
                                 fmt(c["length_ece"])] for n, c in report["length_calibration"].items()]), ""]
        return lines
