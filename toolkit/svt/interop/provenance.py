"""Where an exported svt run's records came from: ``svt export vllm-steps`` and ``specdec-tokens``
write each request's source run id and request id (``svt_run_id``, ``svt_request``: keys the
formats' other readers ignore), and ``svt import`` keeps them in run.json (``import.svt_source``),
so a fit evaluated on the import of its own training run still scores only its held-out requests.
"""

from __future__ import annotations

import json

from svt.interop.base import fail
from svt.traces.identity import MAX_ID

KEYS = ("svt_run_id", "svt_request")


class SourceIds:
    """Each record's provenance, checked as it is read: all records carry it or none does, one
    source run, a request id at most once."""

    def __init__(self):
        self.run_id: str | None = None
        self.requests: list[int] = []
        self.without: str | None = None  # where a record without provenance was
        self.first: dict[int, str] = {}

    def add(self, obj: dict, where: str) -> None:
        has = [k for k in KEYS if k in obj]
        if not has:
            self.without = self.without or where
            if self.requests:
                raise fail(where, f"no `svt_run_id`/`svt_request`, which the earlier records carry (from {self.run_id}): "
                                  "a file mixing an svt export with other records cannot say which requests a fit "
                                  "trained on.")
            return
        if len(has) < 2:
            raise fail(where, f"`{has[0]}` without `{[k for k in KEYS if k not in has][0]}`.")
        rid, req = obj["svt_run_id"], obj["svt_request"]
        if not isinstance(rid, str) or not rid:
            raise fail(where, f"`svt_run_id` must be a run id (a string), but got {json.dumps(rid)[:80]}.")
        if not isinstance(req, int) or isinstance(req, bool) or not 0 <= req <= MAX_ID:
            raise fail(where, f"`svt_request` must be a request id (an integer from 0 to 2**62), but got {json.dumps(req)[:80]}.")
        if self.without is not None:
            raise fail(where, f"carries `svt_run_id`, but the record at {self.without} does not: a file mixing an svt "
                              "export with other records cannot say which requests a fit trained on.")
        if self.run_id is not None and rid != self.run_id:
            raise fail(where, f"`svt_run_id` {rid!r}, but earlier records are from {self.run_id!r}: import one run's "
                              "export at a time.")
        if req in self.first:
            raise fail(where, f"`svt_request` {req} again (first at {self.first[req]}).")
        self.run_id = rid
        self.first[req] = where
        self.requests.append(req)

    def result(self) -> dict | None:
        """``{"run_id", "requests"}`` (the source request of each imported request, in order), or None."""
        return {"run_id": self.run_id, "requests": self.requests} if self.requests else None
