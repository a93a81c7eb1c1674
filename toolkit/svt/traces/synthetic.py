"""A synthetic drafts table calibrated on a real run, for benchmarks at scale.

``resample_steps`` draws whole verification steps (all K drafts of one request's step, labels and
features together) with replacement from a real run and renumbers them into new requests of
``steps_per_request`` steps. Every joint property of a step that the metrics see (features,
positions, the label chain, acceptance by position) follows the source run; only the mix of steps
into requests is new. With the demo run as the source this gives the 4.5M-draft tables
`make bench` uses.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def resample_steps(drafts: pl.DataFrame, n_labelled: int, *, steps_per_request: int = 60,
                   seed: int = 0) -> pl.DataFrame:
    """About ``n_labelled`` labelled drafts (whole steps) resampled from ``drafts``."""
    keys = ["request", "step"]
    steps = drafts.select(keys).unique(maintain_order=True).with_row_index("_sid")
    d = drafts.join(steps, on=keys).sort("_sid", "position")
    per_step = d.group_by("_sid", maintain_order=True).agg(pl.col("label").is_not_null().sum().alias("n"))
    mean_labelled = per_step["n"].mean()
    n_steps = int(np.ceil(n_labelled / mean_labelled))
    rng = np.random.default_rng(seed)
    pick = pl.DataFrame({"_sid": rng.integers(0, steps.height, n_steps).astype(np.uint32),
                         "_new": np.arange(n_steps, dtype=np.int64)})
    out = pick.join(d, on="_sid", how="left", maintain_order="left")
    return out.with_columns(
        (pl.col("_new") // steps_per_request).alias("request"),
        (pl.col("_new") % steps_per_request).cast(pl.Int32).alias("step"),
    ).drop("_sid", "_new")
