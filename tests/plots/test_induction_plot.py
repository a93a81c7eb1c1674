"""The gate figure draws each stage's curve after the previous stages' tokens, marks the jump
where the stage recorded it, and refuses a training record without stages."""

import matplotlib
import numpy as np
import pytest

from svt.errors import DataError
from svt.plots.induction import gate_curve

matplotlib.use("Agg")


def stage(name, tokens, jump=None):
    xs = np.linspace(tokens / 4, tokens, 4).astype(int)
    return {"stage": name, "tokens": tokens, "jump_tokens": jump,
            "curve": [{"tokens": int(t), "top1": 0.2, "cross_entropy": 5.0, "first_copy_cross_entropy": 7.6,
                       "max_induction_score": 0.5} for t in xs]}


def test_stages_follow_each_other_and_the_jump_is_marked():
    rec = {"models": {"target": {"stages": [stage("target-induction", 2_000_000, jump=1_500_000),
                                            stage("target-context", 1_000_000)]}}}
    fig = gate_curve(rec)
    top, ce = fig.axes
    top1 = [ln for ln in top.lines if ln.get_color() == top.lines[0].get_color() and len(ln.get_xdata()) == 4]
    np.testing.assert_allclose(top1[1].get_xdata(), 2.0 + np.linspace(0.25, 1.0, 4))  # after stage 1's 2M
    verticals = sorted({float(ln.get_xdata()[0]) for ln in top.lines if len(ln.get_xdata()) == 2
                        and ln.get_xdata()[0] == ln.get_xdata()[1]})
    assert verticals == [1.5, 2.0, 3.0]  # the jump, then the two stage ends
    assert any(t.get_text() == "jump" for t in top.texts)


def test_a_record_without_stages_is_refused():
    with pytest.raises(DataError, match="no stages"):
        gate_curve({"models": {"target": {"held_out_loss": 3.0}}})
