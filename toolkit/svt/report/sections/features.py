"""The feature table: every acceptance feature and fitted predictor scored overall, excluding the
first draft position and per position (AUC, log-loss, ECE, Brier, ...), against soft labels too,
with request-level bootstrap intervals."""

from __future__ import annotations

import polars as pl

from svt.metrics.specs import names
from svt.report.judge import judge, metric_value
from svt.report.scoring import features_table
from svt.report.sections.base import Judging, ReportContext, Section
from svt.report.text import (
    HEAD,
    SHORT,
    add_row,
    feature_rows,
    fmt,
    md_table,
    new_table,
    shown,
)


class Features(Section):
    name = "features"

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        labelled = pl.col("label").is_not_null()
        parts = None if ctx.in_memory else [p.filter(labelled) for run_parts in ctx.opened.parts for p in run_parts]
        out = {"features": features_table(ctx.source.filter(labelled), ctx.feats, ctx.opts, parts=parts,
                                          soft=ctx.opened.soft_labels)}
        if ctx.not_computed:
            out["features_not_computed"] = dict(ctx.not_computed)
        return out

    def markdown(self, report: dict) -> list[str]:
        header = ["feature", "lossless", *HEAD]
        feats = report["features"]
        skipped = report.get("features_not_computed") or {}
        lines = [f"Not computed: {', '.join(f'{n} ({why})' for n, why in skipped.items())}.\n"] if skipped else []
        if not feats:
            return lines
        lines += ["## All positions\n", md_table(header, feature_rows(feats)), ""]
        lines += ["## Excluding the first draft position\n", md_table(header, feature_rows(feats, "excluding_first")),
                  ""]
        positions = sorted({int(p) for f in feats.values() for p in f["per_position"]})

        def at(f, p, metric):
            return f["per_position"].get(p, f["per_position"].get(str(p), {})).get(metric)

        lines += ["## AUC by draft position\n",
                  md_table(["feature", *map(str, positions)],
                           [[shown(n, f), *(fmt(at(f, p, "auc")) for p in positions)] for n, f in feats.items()]), ""]
        prob = {n: f for n, f in feats.items() if f["probability"]}
        if prob:
            lines += ["## ECE by draft position (probability scores)\n",
                      md_table(["feature", *map(str, positions)],
                               [[n, *(fmt(at(f, p, "ece")) for p in positions)] for n, f in prob.items()]), ""]
        soft = [(c, t) for c, t in (("accept_prob", "accept_prob"), ("accept_prob_expected", "1−TV"))
                if all(c in f["soft"] for f in feats.values())]
        if feats and soft:
            lines += ["## Soft labels\n",
                      "AUC and (for probabilities) log-loss against `accept_prob` (min(1, p/q) of the drawn "
                      "token) and `accept_prob_expected` (1 − TV(p, q)): lower-variance labels.\n",
                      md_table(["feature", *(f"{m} vs {t}" for _, t in soft for m in ("AUC", "log-loss"))],
                               [[shown(n, f), *(fmt(f["soft"][c][m]) for c, _ in soft for m in ("auc", "log_loss"))]
                                for n, f in feats.items()]), ""]
        return lines

    def console(self, report: dict) -> list:
        from rich.text import Text

        skipped = report.get("features_not_computed") or {}
        items: list = [Text(f"not computed: {', '.join(skipped)} (the imported run lacks the columns they read)")] \
            if skipped else []
        if not report["features"]:
            return items
        keep = [0, 1, *(2 + HEAD.index(k) for k in SHORT)]
        for title, scope in (("all positions", None), ("excluding the first position", "excluding_first")):
            t = new_table("feature", "lossless", *SHORT, title=f"acceptance features: {title}")
            for row in feature_rows(report["features"], scope, ci=False):
                add_row(t, *(row[i] for i in keep))
            items.append(t)
        negated = [f.get("shown_as") for f in report["features"].values() if f.get("direction") == -1]
        if negated:
            items.append(Text(f"{', '.join(negated)}: lower values mean acceptance, so these are scored negated and "
                              "every AUC reads higher = better (raw AUC = 1 - AUC, kept in report.json as auc_raw)."))
        return items

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        return list(judge_features(base["features"], now["features"], "", judging, per_position=True))


def judge_features(base_feats: dict, now_feats: dict, where: str, judging: Judging, per_position: bool):
    """A row per feature, scope and compared metric (``where``: a group, or "" for all drafts)."""
    for name, fb in base_feats.items():
        fn = now_feats[name]
        label_of = fb.get("shown_as") or name
        scopes = [("overall", "", fb, fn), ("excluding_first", "excluding first", fb.get("excluding_first") or {},
                                            fn.get("excluding_first") or {})]
        if per_position:
            pn = {str(p): b for p, b in (fn.get("per_position") or {}).items()}  # int keys in memory, str in JSON
            scopes += [("per_position", f"position {p}", b, pn.get(str(p), {}))
                       for p, b in (fb.get("per_position") or {}).items()]
        for scope, label, b, n in scopes:
            place = ", ".join(x for x in (where, label) if x) or "all positions"
            for m in names("table", compared=True):
                if b.get(m) is None:  # undefined in the baseline (a score that is not a probability)
                    continue
                base = metric_value(b[m], m)
                if base is None:
                    judging.skipped.append(f"{label_of} {m} ({place}): the baseline's value {b[m]!r} is not a "
                                           "valid number")
                    continue
                cis = (None, None) if judging.paired else ((b.get("ci95") or {}).get(m), (n.get("ci95") or {}).get(m))
                row = judge(m, "group" if where else scope, base, metric_value(n.get(m), m), cis[0],
                            judging.tolerances, cis[1])
                yield {**row, "section": "features", "item": label_of, "where": place}
