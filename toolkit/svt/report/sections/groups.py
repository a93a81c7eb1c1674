"""The feature table per group: per run when several runs are evaluated, and per value of ``--by``
(e.g. workload)."""

from __future__ import annotations

from svt.report.scoring import EvaluateOptions, features_table
from svt.report.sections.base import Judging, ReportContext, Section
from svt.report.sections.features import judge_features
from svt.report.text import fmt, md_table


class Groups(Section):
    name = "features by group"

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        groups = []
        if len(ctx.infos) > 1:
            groups.append("run")
        if ctx.opts.by and ctx.opts.by != "run":
            groups.append(ctx.opts.by)
        out: dict = {}
        plain = EvaluateOptions(**{**ctx.opts.__dict__, "fits": []})
        for g in groups:
            out[g] = {str(key): features_table(part, ctx.feats, plain)
                      for key, part in sorted(((k[0], v) for k, v in ctx.labelled.group_by(g)),
                                              key=lambda kv: str(kv[0]))}
            for blocks in out[g].values():  # figures draw the overall curves only
                for block in blocks.values():
                    block.pop("curves", None)
        return {"groups": out}

    def markdown(self, report: dict) -> list[str]:
        lines: list[str] = []
        for g, parts in report.get("groups", {}).items():
            names = list(report["features"])
            lines += [f"## AUC by {g}\n",
                      md_table(["feature", *parts], [[n, *(fmt(parts[k][n]["auc"]) for k in parts)] for n in names]),
                      ""]
            lines += [f"## Acceptance rate and count by {g}\n",
                      md_table([g, "labelled", "acceptance"],
                               [[k, fmt(next(iter(v.values()))["n"]), fmt(next(iter(v.values()))["accept_rate"])]
                                for k, v in parts.items()]), ""]
        return lines

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        rows: list[dict] = []
        for g, parts in (base.get("groups") or {}).items():
            for key, feats in parts.items():
                rows += judge_features(feats, now["groups"][g][key], f"{g}={key}", judging, per_position=False)
        return rows
