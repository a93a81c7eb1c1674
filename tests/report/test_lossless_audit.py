"""The losslessness audit on a hand-worked `dists` row, for a token-dependent (q_sampled) rule, so
the general output-distribution formula is exercised (not the exact-zero shortcut)."""

import polars as pl
import pytest

from svt.features import get_feature
from svt.report.lossless_audit import audit


def _frames():
    # V = 3 (all in the top-k, no tail): p = [0.5, 0.3, 0.2], q = [0.2, 0.5, 0.3]
    dists = pl.DataFrame({"request": [0], "step": [0], "position": [0], "token": [1],
                          "q_top_ids": [[1, 2, 0]], "q_top_probs": [[0.5, 0.3, 0.2]], "q_tail": [0.0],
                          "p_top_ids": [[0, 1, 2]], "p_top_probs": [[0.5, 0.3, 0.2]], "p_tail": [0.0]},
                         schema_overrides={"position": pl.Int16, "step": pl.Int32})
    drafts = pl.DataFrame({"request": [0], "step": [0], "position": [0], "workload": ["w"], "q_max": [0.5],
                           "q_entropy": [1.0], "q_margin": [0.2], "p_max": [0.5], "accept_prob_expected": [0.7],
                           "label": [1]}, schema_overrides={"position": pl.Int16, "step": pl.Int32})
    return drafts, dists


def test_q_sampled_rule_by_hand():
    """Trim when q(x) < 0.4: tokens 0 (q .2) and 2 (q .3) are trimmed, token 1 kept.
    p_out = 0.5 p + 0.5 * [accept 1 w.p. 0.3/0.5] + rejected mass 0.2 * norm(max(0, p - q)) = e_0
          = [0.25, 0.15, 0.10] + [0, 0.30, 0] + [0.20, 0, 0] = [0.45, 0.45, 0.10]; TV to p = 0.15."""
    drafts, dists = _frames()
    got = audit(drafts, dists, get_feature("q_sampled"), 0.4)
    assert got["positions"] == 1
    assert got["mean_bias"] == pytest.approx(0.15, abs=1e-6)
    # trim only token 0 (q < 0.25): [0.1, 0.06, 0.04] + [0, 0.3, 0] + [0, 0, 0.2] + [0.3, 0, 0]: TV 0.1
    assert audit(drafts, dists, get_feature("q_sampled"), 0.25)["mean_bias"] == pytest.approx(0.1, abs=1e-6)
    # a rule on q_max (the same for every candidate) trims all or nothing: exactly lossless
    assert audit(drafts, dists, get_feature("q_max"), 0.4)["mean_bias"] == 0.0
