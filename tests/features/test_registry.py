import math
import sys

import numpy as np
import polars as pl
import pytest

from svt.errors import ConfigError
from svt.features import BUILTIN, EPS, get_feature, load_feature_module

FRAME = pl.DataFrame({"q_max": [0.9, 0.5, 1.0], "q_sampled": [0.9, 0.2, 0.0], "q_entropy": [0.3, 1.0, 0.0],
                      "q_margin": [0.8, 0.1, 1.0], "position": [0, 1, 2]})


def _eval(name):
    return FRAME.select(get_feature(name).expr.alias("v"))["v"].to_numpy()


def test_builtin_values_and_clipping():
    np.testing.assert_allclose(_eval("logit_qmax")[:2], [math.log(9), 0.0], atol=1e-9)
    assert _eval("logit_qmax")[2] == pytest.approx(math.log((1 - EPS) / EPS))  # q_max = 1 is clipped
    np.testing.assert_allclose(_eval("gumbel_qsampled")[:2], [-math.log(-math.log(0.9)), -math.log(-math.log(0.2))])
    assert np.isfinite(_eval("gumbel_qsampled")).all() and np.isfinite(_eval("logit_qsampled")).all()
    np.testing.assert_allclose(_eval("logit_margin")[:2], [math.log(0.9 / 0.1), math.log(0.5 / 0.4)], atol=1e-9)
    assert _eval("logit_margin")[2] <= 40


def test_lossless_flags_follow_the_sampled_token():
    for name in BUILTIN:
        f = get_feature(name)
        assert f.lossless == ("sampled" not in name), name


def test_unknown_feature_lists_known_ones():
    with pytest.raises(ConfigError, match="known features: .*logit_qmax"):
        get_feature("logit_qmaxx")


def test_user_feature_module(tmp_path, monkeypatch):
    (tmp_path / "my_feats.py").write_text(
        "import polars as pl\nfrom svt.features import feature\n\n"
        "@feature(lossless=True, description='q_max squared')\n"
        "def qmax_sq():\n    return pl.col('q_max') ** 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_feature_module("my_feats") == ["qmax_sq"]
    np.testing.assert_allclose(_eval("qmax_sq"), [0.81, 0.25, 1.0])
    with pytest.raises(ConfigError, match="Could not import feature module"):
        load_feature_module("no_such_module_here")
    sys.modules.pop("my_feats", None)
