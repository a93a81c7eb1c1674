"""``vllm-steps``: per-request speculative-decoding counts, as vLLM's spec-decode metrics give them.

One JSON object per request (JSON Lines, or a JSON list): ``per_step_drafted`` and
``per_step_accepted`` (lists of integers, one entry per verification step: drafts proposed and the
accepted prefix), optionally ``request_id``, ``workload`` (or ``category``), ``prompt_token_ids`` and
``output_token_ids``. vLLM's own per-request counters are of this shape (drafted and accepted tokens
per step); the file is what a serving team dumps from them. Labels are exact (chain drafts); the
draft tokens and their probabilities are not carried.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from svt.interop.base import Imported, Importer, chain_drafts, fail, requests_frame
from svt.interop.records import COUNT_MAX, int_list, json_records, label


class VllmSteps(Importer):
    name = "vllm-steps"
    description = ("per-request counts per verification step (per_step_drafted, per_step_accepted), as "
                   "vLLM's spec-decode metrics report them")

    def read(self, path: Path, mapping: dict | None = None) -> Imported:
        req, step, drafted, accepted, requests, seen, names = [], [], [], [], [], {}, []
        for where, obj in json_records(path):
            if "per_step_drafted" not in obj or "per_step_accepted" not in obj:
                raise fail(where, f"expected `per_step_drafted` and `per_step_accepted`, but got keys {sorted(obj)}.")
            d = int_list(obj["per_step_drafted"], where, "per_step_drafted", bound=COUNT_MAX)
            a = int_list(obj["per_step_accepted"], where, "per_step_accepted", bound=COUNT_MAX)
            rid = obj.get("request_id")
            if rid is not None:
                key = json.dumps(rid)
                if key in seen:
                    raise fail(where, f"request_id {key} again (first at {seen[key]}).")
                seen[key] = where
            names.append(rid if rid is not None else len(names))
            if len(d) != len(a):
                raise fail(where, f"`per_step_drafted` has {len(d)} steps but `per_step_accepted` {len(a)}.")
            over = next((i for i, (x, y) in enumerate(zip(d, a, strict=True)) if y > x), None)
            if over is not None:
                raise fail(where, f"step {over}: {a[over]} accepted of {d[over]} drafted.")
            r = len(requests)
            req += [r] * len(d)
            step += range(len(d))
            drafted += d
            accepted += a
            key = "workload" if "workload" in obj else "category"
            workload = label(obj.get(key, "vllm"), where, key)
            requests.append({"request": r, "workload": workload,
                             "prompt_ids": _ids(obj, "prompt_token_ids", where),
                             "output_ids": _ids(obj, "output_token_ids", where)})
        if not requests:
            raise fail(str(path), "no request records.")
        r, s = np.array(req, np.int64), np.array(step, np.int64)
        d, a = np.array(drafted, np.int64), np.array(accepted, np.int64)
        drafts = chain_drafts(r, s, d, a, str(path)).join(pl.DataFrame({"request": [q["request"] for q in requests],
                                                              "workload": [q["workload"] for q in requests]}),
                                                on="request", how="left", maintain_order="left")
        steps = pl.DataFrame({"request": r, "step": s, "drafted": d, "accepted": a, "emitted": a + 1})
        reqs, notes = requests_frame(requests)
        return Imported(drafts, steps, reqs, source={"requests": len(requests), **notes,
                                                     "emitted": "accepted + 1 (the target token of each step)"},
                        request_names=names)


def _ids(obj: dict, key: str, where: str) -> list[int] | None:
    return int_list(obj[key], where, key) if key in obj else None
