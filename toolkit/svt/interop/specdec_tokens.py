"""``specdec-tokens``: per-token draft records in the style of SpecDec++'s acceptance data.

SpecDec++ (Huang, Guo and Wang, 2024) trains its stop head on each draft token's acceptance
probability ``p_acc = min(1, p/q)`` (target over draft probability of the drafted token). One JSON
object per request (JSON Lines, or a JSON list): ``steps``, a list of verification steps, each with
``draft_tokens`` (ids), ``p_acc`` (one number in [0, 1] per draft token) and ``accepted`` (the
accepted prefix length); optionally ``request_id``, ``workload`` (or ``category``),
``prompt_token_ids`` and ``output_token_ids``. ``p_acc`` becomes the run's ``accept_prob`` (the
soft label); the draft's own distribution (q) is not carried.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl

from svt.interop.base import Imported, Importer, fail, requests_frame
from svt.interop.provenance import SourceIds
from svt.interop.records import COUNT_MAX, int_list, json_records, label


class SpecDecTokens(Importer):
    name = "specdec-tokens"
    description = "per-token draft records with p_acc = min(1, p/q), in the style of SpecDec++'s data"

    def read(self, path: Path, mapping: dict | None = None) -> Imported:
        rows = {"request": [], "step": [], "position": [], "token": [], "accept_prob": [], "label": [],
                "workload": []}
        requests, seen, counts = [], {}, {"request": [], "step": [], "drafted": [], "accepted": []}
        origin = SourceIds()
        for where, obj in json_records(path):
            origin.add(obj, where)
            steps = obj.get("steps")
            if not isinstance(steps, list) or not steps:
                raise fail(where, f"expected a non-empty list `steps`, but got keys {sorted(obj)}.")
            r = len(requests)
            rid = obj.get("request_id")
            if rid is not None:
                key = json.dumps(rid)
                if key in seen:
                    raise fail(where, f"request_id {key} again (first at {seen[key]}).")
                seen[key] = where
            key = "workload" if "workload" in obj else "category"
            workload = label(obj.get(key, "specdec"), where, key)
            for s, st in enumerate(steps):
                at = f"{where} step {s}"
                if not isinstance(st, dict) or not {"draft_tokens", "p_acc", "accepted"} <= set(st):
                    raise fail(at, "expected `draft_tokens`, `p_acc` and `accepted`.")
                toks = int_list(st["draft_tokens"], at, "draft_tokens")
                p = st["p_acc"]
                if not isinstance(p, list) or len(p) != len(toks) or not all(
                        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1
                        for x in p):
                    raise fail(at, f"`p_acc` must hold one number in [0, 1] per draft token ({len(toks)}).")
                if len(toks) > COUNT_MAX:
                    raise fail(at, f"{len(toks)} draft tokens; svt stores at most {COUNT_MAX} per step.")
                a = st["accepted"]
                if not isinstance(a, int) or isinstance(a, bool) or not 0 <= a <= len(toks):
                    raise fail(at, f"`accepted` must be an integer from 0 to {len(toks)}, but got {a!r}.")
                for k, v in (("request", r), ("step", s), ("drafted", len(toks)), ("accepted", a)):
                    counts[k].append(v)
                for i, (t, q) in enumerate(zip(toks, p, strict=True)):
                    rows["request"].append(r)
                    rows["step"].append(s)
                    rows["position"].append(i)
                    rows["token"].append(t)
                    rows["accept_prob"].append(float(q))
                    rows["label"].append(1 if i < a else 0 if i == a else None)
                    rows["workload"].append(workload)
            requests.append({"request": r, "workload": workload,
                             "prompt_ids": int_list(obj["prompt_token_ids"], where, "prompt_token_ids")
                             if "prompt_token_ids" in obj else None,
                             "output_ids": int_list(obj["output_token_ids"], where, "output_token_ids")
                             if "output_token_ids" in obj else None})
        if not requests:
            raise fail(str(path), "no request records.")
        drafts = pl.DataFrame(rows, schema_overrides={"label": pl.Int8})
        steps = pl.DataFrame(counts).with_columns((pl.col("accepted") + 1).alias("emitted"))  # empty steps too
        reqs, notes = requests_frame(requests)
        return Imported(drafts, steps, reqs,
                        source={"requests": len(requests), **notes, "accept_prob": "the file's p_acc = min(1, p/q)",
                                "emitted": "accepted + 1 (the target token of each step)"},
                        svt_source=origin.result())
