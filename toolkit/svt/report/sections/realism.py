"""How far the pair is from the data: per workload, the output's common prefix with the prompt's
reference, copying and looping shares of the output and of the reference, and the cache statistics
of the run beside a reference run's of the same prompts."""

from __future__ import annotations

from svt.report.sections.base import ReportContext, Section
from svt.report.text import fmt, md_table


class Realism(Section):
    name = "realism"

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        from svt.report.reference import realism_section

        return {"realism": realism_section(ctx.runs, ctx.opts.reference_run)}

    def markdown(self, report: dict) -> list[str]:
        return realism_markdown(report)


def realism_markdown(report: dict) -> list[str]:
    realism = report.get("realism")
    if not realism:
        return []
    lines = ["## How far the pair is from the data (realism)\n",
             "Per workload: the mean common prefix of the output with the prompt's reference (task following), "
             "and the share of positions whose next 8 tokens already occurred before them in prompt + output "
             "(copying) and in the output alone (looping), for the output and for the reference text. The "
             "cache columns put the run's cache statistics beside a reference run's of the same prompts.\n"]
    for name, block in realism.items():
        ref_cache = block.get("reference_cache") or {}
        cache = block.get("cache") or {}
        if block["kind"] == "reference":  # the output is the reference: one text, its own cache
            head = ["group", "requests", "text: repeats prompt+text", "text: repeats itself", "cache yield",
                    "top-10% share"]
            rows = [[g, fmt(w["requests"]), fmt(w["output_repeats_prompt_or_output"], 3),
                     fmt(w["output_repeats_output"], 3), fmt((cache.get(g) or {}).get("mean_yield"), 2),
                     fmt((cache.get(g) or {}).get("top10_token_share"), 2)] for g, w in block["workloads"].items()]
        else:
            head = ["group", "requests", "common prefix", "output: repeats prompt+output", "output: repeats itself",
                    "reference: repeats prompt+output", "reference: repeats itself", "cache yield (run)",
                    "cache yield (reference)", "top-10% share (run)", "top-10% share (reference)"]
            rows = []
            for g, w in block["workloads"].items():
                c, rc = cache.get(g) or {}, ref_cache.get(g) or {}
                rows.append([g, fmt(w["requests"]), fmt(w["mean_common_prefix"], 1),
                             fmt(w["output_repeats_prompt_or_output"], 3), fmt(w["output_repeats_output"], 3),
                             fmt(w["reference_repeats_prompt_or_output"], 3), fmt(w["reference_repeats_output"], 3),
                             fmt(c.get("mean_yield"), 2), fmt(rc.get("mean_yield"), 2),
                             fmt(c.get("top10_token_share"), 2), fmt(rc.get("top10_token_share"), 2)])
            head, rows = _without_empty_columns(head, rows)
        lines += [f"### `{name}` ({block['kind']} run)\n", md_table(head, rows), ""]
        diff = block.get("reference_requests")
        if diff:
            lines.append(f"Reference run `{block['reference_run']}`: {diff['note']}\n")
    return lines


def _without_empty_columns(head: list[str], rows: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Drop the columns that no row fills (e.g. the reference's cache without --reference-run)."""
    keep = [i for i in range(len(head)) if i < 2 or any(r[i] != fmt(None) for r in rows)]
    return [head[i] for i in keep], [[r[i] for i in keep] for r in rows]
