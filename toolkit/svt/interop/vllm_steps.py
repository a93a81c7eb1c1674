"""``vllm-steps``: per-request speculative-decoding counts per verification step, as vLLM reports them.

vLLM (0.32) returns per-request acceptance metrics in each response under
``metrics.speculative_decoding`` when the server runs with ``--per-request-spec-decode-metrics
detailed``: the summary (``num_spec_steps``, ``num_draft_tokens``, ``num_accepted_draft_tokens``,
``num_spec_tokens``, histograms) plus two ordered arrays, ``per_step_drafted`` and
``per_step_accepted``, one entry per verification step (vLLM's documentation, "Per-Request
Acceptance Metrics"; experimental there). One JSON object per request (JSON Lines, or a JSON list):
either such a response body (its ``id`` is the request's id; the arrays are cross-checked against the
summary's totals), or a flat record with ``per_step_drafted`` and ``per_step_accepted`` at the top,
optionally ``request_id``, ``workload`` (or ``category``), ``prompt_token_ids`` and
``output_token_ids``. Labels are exact (chain drafts); the draft tokens and their probabilities are
not carried. Steps vLLM scheduled no draft for are not in its arrays.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from svt.interop.base import Imported, Importer, chain_drafts, fail, requests_frame
from svt.interop.provenance import SourceIds
from svt.interop.records import COUNT_MAX, int_list, json_records, label

# no speculative decoder verifies more drafts in one step (EAGLE-3 trees: ~60 nodes; suffix drafts: tens):
# a count beyond it is a damaged file, which would otherwise become millions of rows without a word
MAX_DRAFTED = 1024


class VllmSteps(Importer):
    name = "vllm-steps"
    description = ("per-request counts per verification step (per_step_drafted, per_step_accepted), as "
                   "vLLM's spec-decode metrics report them")

    def read(self, path: Path, mapping: dict | None = None) -> Imported:
        req, step, drafted, accepted, requests, seen, names = [], [], [], [], [], {}, []
        origin = SourceIds()
        for where, obj in json_records(path):
            origin.add(obj, where)
            counts = _counts(obj, where)
            d = int_list(counts["per_step_drafted"], where, "per_step_drafted", bound=MAX_DRAFTED)
            a = int_list(counts["per_step_accepted"], where, "per_step_accepted", bound=COUNT_MAX)
            _cross_check(counts, d, a, where)
            rid = obj.get("request_id", obj.get("id") if counts is not obj else None)
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
                        request_names=names, svt_source=origin.result())


def _counts(obj: dict, where: str) -> dict:
    """The per-step arrays of a record: a vLLM response's ``metrics.speculative_decoding``, or the
    record itself."""
    if "per_step_drafted" in obj and "per_step_accepted" in obj:
        return obj
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and "speculative_decoding" in metrics:
        spec = metrics["speculative_decoding"]
        if not isinstance(spec, dict):
            raise fail(where, "`metrics.speculative_decoding` is null (vLLM reports it only for n == 1 requests "
                              "with speculative decoding on).")
        if "per_step_drafted" not in spec or "per_step_accepted" not in spec:
            raise fail(where, "`metrics.speculative_decoding` has no per-step arrays (a `summary` response): start "
                              "the server with --per-request-spec-decode-metrics detailed.")
        return spec
    raise fail(where, f"expected `per_step_drafted` and `per_step_accepted` (or a vLLM response with "
                      f"`metrics.speculative_decoding`), but got keys {sorted(obj)}.")


def _cross_check(spec: dict, d: list[int], a: list[int], where: str) -> None:
    """The arrays against the totals a vLLM response also gives (those it has)."""
    for key, value in (("num_spec_steps", len(d)), ("num_draft_tokens", sum(d)),
                       ("num_accepted_draft_tokens", sum(a))):
        if key in spec and spec[key] != value:
            raise fail(where, f"`{key}` is {spec[key]!r} but the per-step arrays give {value}.")
    k = spec.get("num_spec_tokens")
    if isinstance(k, int) and d and max(d) > k:
        raise fail(where, f"a step drafts {max(d)} tokens, more than `num_spec_tokens` {k}.")


def _ids(obj: dict, key: str, where: str) -> list[int] | None:
    return int_list(obj[key], where, key) if key in obj else None
