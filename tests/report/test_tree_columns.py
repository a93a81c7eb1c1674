"""Every column the tree report prints per depth and for its expected-length check, on a frame small
enough to count by hand (issue 53: the conditional rate per depth was never asserted, so a rate over
all nodes instead of the verified ones passed)."""

import polars as pl
import pytest

from svt.report.trees import by_depth, expected_length
from svt.report.trees_text import _depth_rows

# two steps of one request. Step 0: depth 0 has 3 nodes, the first accepted, the second rejected,
# the third never tried; depth 1 has 2 nodes under the accepted one, one rejected, one not tried.
# Step 1: one node at depth 0, rejected.
NODES = pl.DataFrame({
    "request": [0] * 6, "step": [0, 0, 0, 0, 0, 1], "node": [0, 1, 2, 3, 4, 0],
    "parent": [-1, -1, -1, 0, 0, -1], "depth": [0, 0, 0, 1, 1, 0],
    "label": [1, 0, None, 0, None, 0], "match": [1, 0, 0, 0, 1, 0],
    "q_token": [0.6, 0.3, 0.1, 0.5, 0.2, 0.4], "path_prob": [0.6, 0.3, 0.1, 0.3, 0.12, 0.4],
}, schema_overrides={"label": pl.Int8, "match": pl.Int8})
STEPS = pl.DataFrame({"request": [0, 0], "step": [0, 1], "accepted": [1, 0]})


def test_by_depth_counts_and_rates():
    rows = {r["depth"]: r for r in by_depth(NODES)}
    d0, d1 = rows[0], rows[1]
    assert (d0["nodes"], d0["verified"], d0["accepted"]) == (4, 3, 1)
    assert d0["conditional"] == pytest.approx(1 / 3)  # accepted over verified, not over all 4 nodes
    assert d0["match_rate"] == pytest.approx(1 / 4)
    assert d0["mean_q_token"] == pytest.approx((0.6 + 0.3 + 0.1 + 0.4) / 4)
    assert d0["mean_path_prob"] == pytest.approx((0.6 + 0.3 + 0.1 + 0.4) / 4)
    assert (d1["nodes"], d1["verified"], d1["accepted"]) == (2, 1, 0) and d1["conditional"] == 0.0
    assert d1["match_rate"] == pytest.approx(0.5) and d1["mean_path_prob"] == pytest.approx(0.21)


def test_the_printed_depth_table_shows_each_column():
    printed = _depth_rows({"by_depth": by_depth(NODES)})
    assert printed[0] == ["0", "4", "3", "1", "0.3333", "0.2500", "0.3500", "0.3500"], printed
    assert printed[1] == ["1", "2", "1", "0", "0.0000", "0.5000", "0.3500", "0.2100"], printed


def test_expected_length_sums_path_probabilities_per_tree():
    e = expected_length(NODES, STEPS, n_bins=2)
    # step 0 predicts 0.6 + 0.3 + 0.1 + 0.3 + 0.12 = 1.42 and realised 1; step 1 predicts 0.4, realised 0
    assert e["steps"] == 2 and e["mean_predicted"] == pytest.approx((1.42 + 0.4) / 2)
    assert e["mean_realised"] == pytest.approx(0.5) and e["ratio"] == pytest.approx(0.91 / 0.5)
    assert sum(b["n"] for b in e["bins"]) == 2
