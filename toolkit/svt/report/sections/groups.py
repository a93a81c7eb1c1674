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
        acceptance: dict = {}  # per group, whatever features could be computed (an import may have none)
        plain = EvaluateOptions(**{**ctx.opts.__dict__, "fits": []})
        for g in groups:
            parts = sorted(((k[0], v) for k, v in ctx.labelled.group_by(g)), key=lambda kv: str(kv[0]))
            out[g] = {str(key): features_table(part, ctx.feats, plain, soft=ctx.opened.soft_labels)
                      for key, part in parts}
            acceptance[g] = {str(key): {"n": part.height, "accept_rate": float(part["label"].mean())}
                             for key, part in parts}
            for blocks in out[g].values():  # figures draw the overall curves only
                for block in blocks.values():
                    block.pop("curves", None)
        return {"groups": out, "groups_acceptance": acceptance}

    def markdown(self, report: dict) -> list[str]:
        lines: list[str] = []
        for g, parts in report.get("groups", {}).items():
            names = list(report["features"])
            if names:
                lines += [f"## AUC by {g}\n",
                          md_table(["feature", *parts], [[n, *(fmt(parts[k][n]["auc"]) for k in parts)] for n in names]),
                          ""]
            # older reports have no groups_acceptance: every feature block carries the group's counts
            acc = (report.get("groups_acceptance") or {}).get(g) or {k: next(iter(v.values())) for k, v in parts.items()
                                                                     if v}
            lines += [f"## Acceptance rate and count by {g}\n",
                      md_table([g, "labelled", "acceptance"],
                               [[k, fmt(v["n"]), fmt(v["accept_rate"])] for k, v in acc.items()]), ""]
        return lines

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        rows: list[dict] = []
        for g, parts in (base.get("groups") or {}).items():
            for key, feats in parts.items():
                rows += judge_features(feats, now["groups"][g][key], f"{g}={key}", judging, per_position=False)
        return rows
